"""An attention pattern ([batch, heads, query, key]) as one small heatmap per head, the tokens as labels.

A pattern (every value >= 0) uses the sequential map from 0 to its maximum; anything signed (an
attribution: pattern x its gradient) the diverging map centred on zero, its symmetric range clipped at the
CLIP_PERCENTILE-th percentile of the non-zero |values| (a few large cells would otherwise leave the rest
white; the colour bar says so). Keys along x, queries along y, each axis titled; token labels at a size
that reads, with room for each. One PNG, bounded in size (MAX_HEADS heads, MAX_TOKENS tokens: the last
ones), shown as HTML and as an image, with a text line.
"""
from __future__ import annotations

import base64
import html
import io
import math
import warnings

import torch

from .palette import DIVERGING, SEQUENTIAL
from .tokens import visible

MAX_HEADS = 16
MAX_TOKENS = 40
CLIP_PERCENTILE = 98
TICK_PT, TOKEN_IN = 8, 0.16         # token labels' size, and the room (inches) each token gets on an axis
MAX_WIDTH_IN = 16


class AttentionView:
    def __init__(self, grid: torch.Tensor, tokens: list, title: str, heads: int):
        self.grid = grid                  # [shown heads, query, key], float, on the CPU
        self.tokens = tokens
        self.title = title
        self.heads = heads                # heads in the pattern (more than shown when over MAX_HEADS)
        self.signed = bool((grid < 0).any())
        self._png = None

    def __repr__(self):
        kind = "signed" if self.signed else "pattern"
        return (f"<attention {self.title or ''} {kind}: {self.heads} heads x {self.grid.shape[1]} queries x "
                f"{self.grid.shape[2]} keys, max |value| {float(self.grid.abs().max()):.4g}>")

    def _repr_png_(self) -> bytes:
        if self._png is None:
            buffer = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.figure().savefig(buffer, format="png", bbox_inches="tight")
            self._png = buffer.getvalue()
        return self._png

    def colour_range(self) -> tuple:
        """(low, high, clipped): 0 to the max for a pattern; for signed values ± the CLIP_PERCENTILE-th
        percentile of the non-zero |values|, and how many cells lie beyond it."""
        magnitudes = self.grid.abs().flatten()
        top = float(magnitudes.max()) if magnitudes.numel() else 0.0
        if not self.signed:
            return 0.0, top or 1.0, 0
        nonzero = magnitudes[magnitudes > 0].double()
        bound = float(torch.quantile(nonzero, CLIP_PERCENTILE / 100)) if nonzero.numel() else 1.0
        bound = bound or top or 1.0
        return -bound, bound, int((magnitudes > bound).sum())

    def figure(self):
        """The matplotlib Figure: one heatmap per head, a colour bar (its range, and any clipping, said)."""
        return _figure(self.grid, self.tokens, self.title, self.colour_range(), self.signed)

    def _repr_html_(self) -> str:
        encoded = base64.b64encode(self._repr_png_()).decode()
        return (f'<div class="nbgrad-attention"><img alt="{html.escape(repr(self))}" '
                f'src="data:image/png;base64,{encoded}"/></div>')


def attention_pattern(pattern, tokens: list | None = None, batch: int = 0, title: str = "") -> AttentionView:
    """The view of `pattern[batch]` ([heads, query, key]); `tokens` label the positions (default 0, 1, ...)."""
    pattern = torch.as_tensor(pattern).detach()
    if pattern.dim() == 3:
        pattern = pattern.unsqueeze(0)
    if pattern.dim() != 4:
        raise ValueError(f"an attention pattern is [batch, heads, query, key]; this one has shape "
                         f"{tuple(pattern.shape)}")
    grid = pattern[batch, :MAX_HEADS, -MAX_TOKENS:, -MAX_TOKENS:].float().cpu()
    keys = pattern.shape[-1]
    labels = [visible(str(t)) for t in tokens] if tokens is not None else [str(i) for i in range(keys)]
    return AttentionView(grid, labels[-MAX_TOKENS:], title, pattern.shape[1])


def _figure(grid: torch.Tensor, tokens: list, title: str, colour_range: tuple, signed: bool):
    import matplotlib
    matplotlib.use("Agg", force=False)
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    heads, queries, keys = grid.shape
    cell = 1.0 + TOKEN_IN * keys                  # a head's width in inches: room for every token's label
    columns = max(1, min(4, heads, int(MAX_WIDTH_IN // cell)))
    rows = math.ceil(heads / columns)
    fig = Figure(figsize=(columns * cell + 1.2, rows * (cell + 0.3) + 0.6), dpi=80)
    low, high, clipped = colour_range
    colours = ListedColormap((DIVERGING if signed else SEQUENTIAL) / 255.0)
    for head in range(heads):
        ax = fig.add_subplot(rows, columns, head + 1)
        image = ax.imshow(grid[head].numpy(), cmap=colours, vmin=low, vmax=high, interpolation="nearest",
                          aspect="equal")
        ax.set_title(f"head {head}", fontsize=9)
        ax.set_xticks(range(keys), [_label(t) for t in tokens[-keys:]], rotation=90, fontsize=TICK_PT)
        ax.set_xlabel("key", fontsize=9)
        first_column = head % columns == 0          # query labels once per row of heads: they would overlap
        ax.set_yticks(range(queries), [_label(t) if first_column else "" for t in tokens[-queries:]],
                      fontsize=TICK_PT)
        if first_column:
            ax.set_ylabel("query", fontsize=9)
    bar = fig.colorbar(image, ax=fig.axes, fraction=0.02, pad=0.02, extend="both" if clipped else "neither")
    bar.ax.tick_params(labelsize=8)
    bar.set_label("score: blue < 0 < red" if signed else "attention weight (query → key)", fontsize=8)
    if signed:
        what = (f"±{high:.3g}: {CLIP_PERCENTILE}th percentile of |value|; {clipped} cells beyond, at the ends "
                f"(max |value| {float(grid.abs().max()):.3g})") if clipped else f"±{high:.3g} (0 = white)"
        fig.supxlabel(f"colour range {what}", fontsize=8)
    if title:
        fig.suptitle(title.replace("$", r"\$"), fontsize=10)
    return fig


def _label(token: str) -> str:
    return token.replace("$", r"\$")
