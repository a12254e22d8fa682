"""The picture of an attribution: a token heatmap, or a site × position heatmap. Diverging colours
centred on zero with a legend, values on hover, a PNG and plain text beside the HTML. Every label is
text (escaped for HTML, `$` escaped for matplotlib), never markup."""
from __future__ import annotations

import base64
import html
import io
import math
import textwrap
import warnings

import torch

from .palette import DIVERGING, TEXT, diverging_rgb, ink
from .tokens import TokenHeatmap, legend_html, visible

MAX_CELLS = 4096        # cells drawn in the HTML grid; the rows with the largest |score| are kept
TOP_LINES = 10


class AttributionView:
    def __init__(self, scores, cols: list, rows: list | None = None, title: str = "", notes=(), exact=None):
        self.scores = torch.as_tensor(scores).detach().double().cpu()
        self.cols, self.rows = [str(c) for c in cols], None if rows is None else [str(r) for r in rows]
        self.title, self.notes = title, list(notes)
        self.exact = None if exact is None else torch.as_tensor(exact).detach().double().cpu()

    @property
    def grid(self) -> torch.Tensor:
        return self.scores if self.scores.dim() == 2 else self.scores.reshape(1, -1)

    def bound(self) -> float:
        finite = self.scores[torch.isfinite(self.scores)]
        return float(finite.abs().max()) if finite.numel() else 0.0

    def text(self) -> str:
        lines = [self.title] if self.title else []
        if self.rows is None:
            lines.append(repr(TokenHeatmap(self.cols, self.scores, "")))
        else:
            lines.append(f"{len(self.rows)} sites × {len(self.cols)} positions; largest |score|:")
            lines += [f"  {label}: {score:+.4g}" + ("" if exact is None else f"  (exact {exact:+.4g})")
                      for label, score, exact in self.top(TOP_LINES)]
        return "\n".join(lines + self.notes)

    def top(self, count: int) -> list:
        flat = self.grid.abs().nan_to_num(0.0).reshape(-1)
        order = torch.argsort(flat, descending=True, stable=True)[:count].tolist()
        width, rows = self.grid.shape[1], self.rows or [""]
        out = []
        for index in order:
            r, c = divmod(index, width)
            exact = self._exact(r, c)
            out.append((f"{rows[r]} @ {c} {self.cols[c]!r}".strip(), float(self.grid[r, c]), exact))
        return out

    def _exact(self, r: int, c: int):
        if self.exact is None:
            return None
        value = float(self.exact.reshape(self.grid.shape)[r, c])
        return None if math.isnan(value) else value

    def html(self) -> str:
        head = f"<div><b>{html.escape(self.title)}</b></div>" if self.title else ""
        body = TokenHeatmap(self.cols, self.scores).spans() if self.rows is None else self._grid_html()
        notes = "".join(f'<div style="font-size:11px;color:{TEXT}">{html.escape(n)}</div>' for n in self.notes)
        legend = legend_html(self.bound(), f"hover a {'token' if self.rows is None else 'cell'} for its value")
        return (f'<div class="nbgrad-tokens nbgrad-attribution" style="font-family:sans-serif;font-size:12px">'
                f"{head}{body}{legend}{notes}{self._checked_html()}</div>")

    def _shown_rows(self) -> list:
        keep = max(1, MAX_CELLS // max(1, len(self.cols)))
        if len(self.rows) <= keep:
            return list(range(len(self.rows)))
        strength = self.grid.abs().nan_to_num(0.0).amax(dim=1)
        chosen = torch.argsort(strength, descending=True, stable=True)[:keep]
        return sorted(chosen.tolist())

    def _grid_html(self) -> str:
        shown, bound = self._shown_rows(), self.bound()
        cell = "min-width:16px;height:14px;padding:0;text-align:center;font-size:9px"
        header = "".join(f'<th style="white-space:pre;font-weight:normal;font-family:monospace;font-size:10px">'
                         f"{html.escape(visible(c))}</th>" for c in self.cols)
        lines = [f"<tr><th></th>{header}</tr>"]
        for r in shown:
            values = self.grid[r].tolist()
            cells = []
            for c, (value, rgb) in enumerate(zip(values, diverging_rgb(values, bound))):
                exact = self._exact(r, c)
                tip = f"{self.rows[r]} @ {c} {self.cols[c]!r}: {value:.4g}"
                tip += "" if exact is None else f" (exact {exact:.4g})"
                mark = "•" if exact is not None else ""
                cells.append(f'<td title="{html.escape(tip)}" style="{cell};background-color:rgb{rgb};color:{ink(rgb)}">{mark}</td>')
            lines.append(f'<tr><th style="text-align:right;font-weight:normal;font-family:monospace;'
                         f'font-size:10px;padding-right:4px">{html.escape(self.rows[r])}</th>{"".join(cells)}</tr>')
        note = "" if len(shown) == len(self.rows) else (
            f'<div style="font-size:11px">showing the {len(shown)} of {len(self.rows)} sites with the largest '
            f"|score|</div>")
        return f'<table style="border-collapse:collapse">{"".join(lines)}</table>{note}'

    def _checked_html(self) -> str:
        rows = [(label, score, exact) for label, score, exact in self.top(self.grid.numel()) if exact is not None]
        if not rows:
            return ""
        body = "".join(f"<tr><td>{html.escape(label)}</td><td>{score:+.4g}</td><td>{exact:+.4g}</td></tr>"
                       for label, score, exact in rows)
        return (f'<table style="font-size:11px;margin-top:4px"><tr><th>checked exactly (•)</th><th>estimate</th>'
                f"<th>exact patching</th></tr>{body}</table>")

    def png(self) -> bytes:
        checked = None if self.exact is None else (~torch.isnan(self.exact.reshape(self.grid.shape))).numpy()
        return figure_png(self.grid.numpy(), self.rows, self.cols, self.title, self.bound(), checked)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": self.html(), "image/png": base64.b64encode(self.png()).decode(),
                "text/plain": self.text()}


def _plain(label: str) -> str:
    """A label matplotlib shows as typed: `$` would start math mode."""
    return visible(label).replace("$", r"\$")


def figure_png(grid, rows: list | None, cols: list, title: str, bound: float, checked=None) -> bytes:
    """The heatmap as a PNG: labels on both axes, a colour bar, a dot on each cell checked exactly."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    height, width = grid.shape
    size = (min(14, 2.5 + 0.35 * width), min(14, 1.6 + 0.28 * height + (0.4 if rows else 0)))
    fig = Figure(figsize=size, dpi=90)
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap=ListedColormap(DIVERGING / 255.0), vmin=-(bound or 1.0), vmax=bound or 1.0,
                      aspect="auto", interpolation="nearest")
    ax.set_xticks(range(width), [_plain(c) for c in cols], rotation=90, fontsize=7, family="monospace")
    ax.set_yticks(range(height), [_plain(r) for r in rows] if rows else [""] * height, fontsize=7)
    if checked is not None:
        ys, xs = checked.nonzero()
        ax.scatter(xs, ys, s=6, c="black", marker="o")
    ax.set_xlabel("token position" + ("   (• = checked exactly)" if checked is not None else ""), fontsize=7)
    ax.set_ylabel("site" if rows else "", fontsize=7)
    ax.set_title(textwrap.fill(_plain(title), width=int(size[0] * 13)), fontsize=8)
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.ax.tick_params(labelsize=7)
    bar.set_label("score: blue < 0 < red", fontsize=7)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # a glyph missing from the font is not worth a warning
        fig.tight_layout()
        fig.savefig(buffer, format="png")
    return buffer.getvalue()
