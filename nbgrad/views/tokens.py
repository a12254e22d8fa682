"""A row of tokens coloured by a score (saliency, gradient x input): diverging, centred on zero."""
from __future__ import annotations

import html

import torch

from .palette import TEXT2, diverging_rgb, ink

LEGEND_STEPS = 11


def visible(token: str) -> str:
    """A token as text that shows what it is: line breaks and tabs as visible marks, and the spaces of a
    token made of spaces alone as `␣` (a plain space would be an empty label)."""
    token = token.replace("\r", "␍").replace("\n", "↵").replace("\t", "⇥")
    return token.replace(" ", "␣") if token.isspace() else token


def shorten(text: str, room: int) -> str:
    """`text` in at most `room` characters: cut, with `…` where it was cut."""
    return text if len(text) <= room else text[:room - 1] + "…"


def legend_html(bound: float, what: str = "hover for its score") -> str:
    """A colour bar from −bound (blue) through 0 (white) to +bound (red)."""
    steps = [bound * (2 * i / (LEGEND_STEPS - 1) - 1) for i in range(LEGEND_STEPS)]
    swatches = "".join(f'<span title="{value:.3g}" style="display:inline-block;width:14px;height:10px;'
                       f'background-color:rgb{rgb}"></span>' for value, rgb in zip(steps, diverging_rgb(steps, bound or 1.0)))
    return (f'<div style="font-size:11px;color:{TEXT2};margin-top:2px">{-bound:.3g} {swatches} {bound:+.3g}'
            f" &nbsp;blue = negative, white = 0, red = positive; {html.escape(what)}</div>")


class TokenHeatmap:
    def __init__(self, tokens: list, scores, title: str = ""):
        scores = torch.as_tensor(scores).detach().double().reshape(-1)
        if len(tokens) != scores.numel():
            raise ValueError(f"{len(tokens)} tokens but {scores.numel()} scores")
        self.tokens, self.scores, self.title = [str(t) for t in tokens], scores, title

    def colours(self) -> list:
        return diverging_rgb(self.scores.numpy())

    def spans(self) -> str:
        parts = []
        for token, score, rgb in zip(self.tokens, self.scores.tolist(), self.colours()):
            parts.append(f'<span title="{html.escape(repr(token))}: {score:.4g}" style="background-color:rgb{rgb};color:{ink(rgb)};'
                         f'padding:2px 1px;margin:0 1px;border-radius:2px;white-space:pre;font-family:monospace">'
                         f"{html.escape(visible(token))}</span>")
        return f'<div style="line-height:2">{"".join(parts)}</div>'

    def _repr_html_(self) -> str:
        head = f"<div><b>{html.escape(self.title)}</b></div>" if self.title else ""
        bound = float(self.scores.abs().max()) if self.scores.numel() else 0.0
        return f'<div class="nbgrad-tokens">{head}{self.spans()}{legend_html(bound, "hover a token for its score")}</div>'

    def __repr__(self) -> str:
        return "  ".join(f"{t!r}:{s:+.3g}" for t, s in zip(self.tokens, self.scores.tolist()))


def token_heatmap(tokens: list, scores, title: str = "") -> TokenHeatmap:
    return TokenHeatmap(tokens, scores, title)
