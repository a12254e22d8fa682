"""The Cache panel: one row per cached module, the norm of its output at each position as a heatmap
(sequential colours), gradient × activation rows in diverging colours centred on zero, and the memory the
cache holds. Static HTML (hover a cell for its value) and plain text: a saved notebook still shows it.
Takes plain data (`Cache.summary()`); every label is escaped text, never markup."""
from __future__ import annotations

import html

import numpy as np

from .palette import SEQUENTIAL, diverging_rgb
from .tokens import legend_html, visible

MAX_CELLS = 8192       # cells in the HTML (about 70 bytes each): a panel stays well under Jupyter's 1 MB/s
ROW_HEAD = "text-align:right;font-weight:normal;font-family:monospace;font-size:10px;padding-right:4px"


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
        norms = [v for row in self.rows if not row["signed"] for v in row["values"]]
        signed = [abs(v) for row in self.rows if row["signed"] for v in row["values"]]
        top, bound = max(norms, default=0.0) or 1.0, max(signed, default=0.0) or 1.0
        lines = [self._header()] + [self._row(row, top, bound) for row in self.rows]
        notes = f'<div style="font-size:11px">{self.hidden_rows} more rows not shown</div>' if self.hidden_rows else ""
        legend = legend_html(bound, "gradient × activation rows; hover a cell for its value") if signed else ""
        title = f"<b>{html.escape(self.title)}</b> · " if self.title else ""
        return (f'<div class="nbgrad-cache" style="font-family:sans-serif;font-size:12px">'
                f"<div>{title}Cache: {self.modules} modules, {html.escape(self.memory)} · norm per "
                f"position (0 … {top:.3g})</div><table style=\"border-collapse:collapse\">{''.join(lines)}</table>"
                f"{legend}{notes}</div>")

    def _header(self) -> str:
        width = max((len(row["values"]) for row in self.rows), default=0)
        labels = self.tokens[-width:] if self.tokens and len(self.tokens) >= width else [str(i) for i in range(width)]
        cells = "".join(f'<th style="font-weight:normal;font-family:monospace;font-size:10px;white-space:pre">'
                        f"{html.escape(visible(label))}</th>" for label in labels)
        return f"<tr><th></th>{cells}</tr>"

    def _row(self, row: dict, top: float, bound: float) -> str:
        values = row["values"]
        colours = diverging_rgb(values, bound) if row["signed"] else _sequential(values, top)
        cells = "".join(f'<td title="{index}: {value:.4g}" style="background:#{r:02x}{g:02x}{b:02x};width:14px;'
                        f'height:12px;padding:0"></td>' for index, (value, (r, g, b)) in enumerate(zip(values, colours)))
        return f'<tr><th style="{ROW_HEAD}">{html.escape(row["path"])}</th>{cells}</tr>'

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": self.html(), "text/plain": self.text()}

    def __repr__(self):
        return self.text()


def _sequential(values: list, top: float) -> list:
    levels = np.clip(np.round(np.nan_to_num(np.asarray(values, dtype=np.float64)) / top * 255), 0, 255).astype(int)
    return [tuple(int(c) for c in SEQUENTIAL[level]) for level in levels]
