"""The Cache panel: one row per cached module, the norm of its output at each position as a heatmap
(sequential colours), gradient × activation rows in diverging colours centred on zero, and the memory the
cache holds. Each row has its own colour scale, written at its end: one shared scale would let the largest
rows (the logits) flatten every other row to one colour, and make small gradients look like none. Static HTML (hover a cell for its value) and plain text: a saved notebook still shows it.
Takes plain data (`Cache.summary()`); every label is escaped text, never markup."""
from __future__ import annotations

import html

import numpy as np

from .palette import DIVERGING, SEQUENTIAL, TEXT, TEXT2, diverging_rgb
from .tokens import visible

MAX_CELLS = 8192       # cells in the HTML (about 70 bytes each): a panel stays well under Jupyter's 1 MB/s
ROW_HEAD = "text-align:right;font-weight:normal;font-family:monospace;font-size:10px;padding-right:4px"
RANGE_STYLE = "text-align:left;font-weight:normal;font-family:monospace;font-size:10px;padding-left:6px;color:" + TEXT2


class CachePanel:
    def __init__(self, summary: dict, title: str = "", tokens: list | None = None):
        width = max((len(row["values"]) for row in summary["rows"]), default=1) or 1
        shown = max(1, MAX_CELLS // width)
        self.rows = summary["rows"][:shown]
        self.hidden_rows = max(0, len(summary["rows"]) - shown)
        self.nbytes, self.modules = summary["nbytes"], summary["modules"]
        self.memory = summary["memory"]          # the size as the Cache's own repr says it
        self.title, self.tokens = title, tokens

    def text(self) -> str:
        head = f"{self.title}: " if self.title else ""
        lines = [f"{head}Cache of {self.modules} modules, {self.memory}"]
        for row in self.rows:
            values = ", ".join(f"{v:.3g}" for v in row["values"][:8])
            lines.append(f"  {row['path']} {tuple(row['shape'])}: {values}{' ...' if len(row['values']) > 8 else ''}")
        return "\n".join(lines)

    def html(self) -> str:
        lines = [self._header()] + [self._row(row) for row in self.rows]
        notes = f'<div style="font-size:11px">{self.hidden_rows} more rows not shown</div>' if self.hidden_rows else ""
        title = f"<b>{html.escape(self.title)}</b> · " if self.title else ""
        return (f'<div class="nbgrad-cache" style="font-family:sans-serif;font-size:12px">'
                f"<div>{title}Cache: {self.modules} modules, {html.escape(self.memory)} · norm per position, "
                f"each row on its own colour scale (its range at the row's end)</div>"
                f"<table style=\"border-collapse:collapse\">{''.join(lines)}</table>"
                f"{self._colour_bars()}{notes}</div>")

    def _colour_bars(self) -> str:
        """What the colours mean: 0 to the row's largest norm; for gradient × activation rows, ± the row's
        largest |value| with white at 0."""
        bars = [_bar(SEQUENTIAL, "0", "the row's max", "norm rows")]
        if any(row["signed"] for row in self.rows):
            bars.append(_bar(DIVERGING, "−max |value|", "+max |value|",
                             "gradient × activation rows: blue = negative, white = 0, red = positive"))
        return (f'<div class="nbgrad-colour-bar" style="font-size:11px;color:{TEXT};margin-top:4px">'
                f"{' &nbsp; '.join(bars)} · hover a cell for its value</div>")

    def _header(self) -> str:
        width = max((len(row["values"]) for row in self.rows), default=0)
        labels = self.tokens[-width:] if self.tokens and len(self.tokens) >= width else [str(i) for i in range(width)]
        # upright along the column (bottom to top): a label as wide as its 14 px column, never run into the next
        cells = "".join(f'<th style="font-weight:normal;font-family:monospace;font-size:10px;white-space:pre;'
                        f'writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;padding:2px 0">'
                        f"{html.escape(visible(label))}</th>" for label in labels)
        corner = f'<small style="font-weight:normal;color:{TEXT2}">module ↓ · position →</small>'
        return f'<tr><th style="text-align:right;vertical-align:bottom">{corner}</th>{cells}' \
            f'<th style="{RANGE_STYLE}">row scale</th></tr>'

    def _row(self, row: dict) -> str:
        values = row["values"]
        finite = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        if row["signed"]:
            bound = float(np.abs(finite).max(initial=0.0)) or 1.0
            colours, scale = diverging_rgb(finite, bound), f"±{bound:.3g}"
        else:
            top = float(finite.max(initial=0.0)) or 1.0
            colours, scale = _sequential(finite, top), f"0 … {top:.3g}"
        cells = "".join(f'<td title="{index}: {value:.4g}" style="background:#{r:02x}{g:02x}{b:02x};width:14px;'
                        f'height:12px;padding:0"></td>' for index, (value, (r, g, b)) in enumerate(zip(values, colours)))
        return (f'<tr><th style="{ROW_HEAD}">{html.escape(row["path"])}</th>{cells}'
                f'<td class="nbgrad-row-scale" style="{RANGE_STYLE}">{scale}</td></tr>')

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": self.html(), "text/plain": self.text()}

    def __repr__(self):
        return self.text()


def _bar(colours, low: str, high: str, what: str) -> str:
    swatches = "".join(f'<span style="display:inline-block;width:6px;height:10px;background:#{r:02x}{g:02x}{b:02x}">'
                       f"</span>" for r, g, b in colours[::16])
    return f"{what}: {low} {swatches} {high}"


def _sequential(values, top: float) -> list:
    levels = np.clip(np.round(np.nan_to_num(np.asarray(values, dtype=np.float64)) / top * 255), 0, 255).astype(int)
    return [tuple(int(c) for c in SEQUENTIAL[level]) for level in levels]
