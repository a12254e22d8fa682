"""An attention pattern ([batch, heads, query, key]) as one small heatmap per head, the tokens as labels.

A pattern (every value >= 0) uses the sequential map from 0 to its maximum; anything signed (an
attribution: pattern x its gradient) the diverging map centred on zero. One PNG, bounded in size
(MAX_HEADS heads, MAX_TOKENS tokens: the last ones), shown as HTML and as an image, with a text line.
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
            self._png = _figure(self.grid, self.tokens, self.title, self.signed)
        return self._png

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


def _figure(grid: torch.Tensor, tokens: list, title: str, signed: bool) -> bytes:
    import matplotlib
    matplotlib.use("Agg", force=False)
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    heads, queries, keys = grid.shape
    columns = min(4, heads)
    rows = math.ceil(heads / columns)
    cell = 0.9 + 0.09 * keys
    fig = Figure(figsize=(min(16, columns * cell + 0.8), min(20, rows * cell + 0.6)), dpi=80)
    bound = float(grid.abs().max()) or 1.0
    colours = ListedColormap((DIVERGING if signed else SEQUENTIAL) / 255.0)
    for head in range(heads):
        ax = fig.add_subplot(rows, columns, head + 1)
        image = ax.imshow(grid[head].numpy(), cmap=colours, vmin=-bound if signed else 0.0, vmax=bound,
                          interpolation="nearest", aspect="equal")
        ax.set_title(f"head {head}", fontsize=8)
        ax.set_xticks(range(keys), [t.replace("$", r"\$") for t in tokens[-keys:]], rotation=90, fontsize=6)
        first_column = head % columns == 0          # query labels once per row of heads: they would overlap
        ax.set_yticks(range(queries), [t.replace("$", r"\$") if first_column else "" for t in tokens[-queries:]],
                      fontsize=6)
    fig.colorbar(image, ax=fig.axes, fraction=0.02, pad=0.02).ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(title.replace("$", r"\$"), fontsize=9)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()
