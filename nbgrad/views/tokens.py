"""A row of tokens coloured by a score (saliency, gradient x input): diverging, centred on zero."""
from __future__ import annotations

import html

import torch

from .palette import DIVERGING


class TokenHeatmap:
    def __init__(self, tokens: list, scores, title: str = ""):
        scores = torch.as_tensor(scores).detach().double().reshape(-1)
        if len(tokens) != scores.numel():
            raise ValueError(f"{len(tokens)} tokens but {scores.numel()} scores")
        self.tokens, self.scores, self.title = list(tokens), scores, title

    def colours(self) -> list:
        bound = float(self.scores.abs().max()) or 1.0
        levels = ((self.scores / bound + 1) / 2 * 255).round().clamp(0, 255).long().tolist()
        return [tuple(int(c) for c in DIVERGING[level]) for level in levels]

    def _repr_html_(self) -> str:
        spans = []
        for token, score, (r, g, b) in zip(self.tokens, self.scores.tolist(), self.colours()):
            spans.append(f'<span title="{score:.4g}" style="background:rgb({r},{g},{b});padding:2px 1px;'
                         f'margin:0 1px;border-radius:2px;white-space:pre;font-family:monospace">'
                         f"{html.escape(token)}</span>")
        bound = float(self.scores.abs().max())
        head = f"<div><b>{html.escape(self.title)}</b></div>" if self.title else ""
        legend = (f'<div style="font-size:11px;color:#666">blue = negative, red = positive; '
                  f"scale ±{bound:.3g}; hover a token for its score</div>")
        return f'<div class="nbgrad-tokens">{head}<div style="line-height:2">{"".join(spans)}</div>{legend}</div>'

    def __repr__(self) -> str:
        return "  ".join(f"{t!r}:{s:+.3g}" for t, s in zip(self.tokens, self.scores.tolist()))


def token_heatmap(tokens: list, scores, title: str = "") -> TokenHeatmap:
    return TokenHeatmap(tokens, scores, title)
