"""The provenance footer of a view: what produced it (the nbgrad, torch and transformers versions, the model,
the cell's magic line), quiet under the picture, so a saved or exported notebook says where each came from.
The caller (the notebook's magics) says what produced it; this only draws it, on whatever bundle a view gives."""
from __future__ import annotations

import html

from .panel import MIME_TYPE

FIELDS = ("nbgrad", "torch", "transformers")


def footer_text(provenance: dict) -> str:
    """`nbgrad 0.1.0 · torch 2.13.0 · transformers 5.0.0 · GPT2LMHeadModel · %%trace model "..."`."""
    parts = [f"{name} {provenance[name]}" for name in FIELDS if provenance.get(name)]
    parts += [provenance[key] for key in ("model", "line") if provenance.get(key)]
    return " · ".join(parts)


def footer_html(provenance: dict) -> str:
    return (f'<div class="nbgrad-footer" style="color:var(--jp-ui-font-color2, #666);font-size:10px;font-family:sans-serif;margin-top:6px">'
            f"{html.escape(footer_text(provenance))}</div>")


class Footed:
    """`view` as displayed with its footer: in its static HTML (inside the panel's box), and in the payload of
    nbgrad's renderer and of the live widget (panel.js draws it). A view with neither keeps its bundle."""

    def __init__(self, view, provenance: dict):
        self.view, self.provenance = view, provenance
        payload = getattr(view, "payload", None)
        if isinstance(payload, dict):       # before the widget or the bundle is made from it
            payload.update(self._stamp())

    def _stamp(self) -> dict:
        """What nbgrad's renderer reads: the fields, and the line it draws (panel.js)."""
        return {"provenance": self.provenance, "footer": footer_text(self.provenance)}

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = self.view._repr_mimebundle_(include, exclude)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle, None)
        data = dict(data)
        if isinstance(data.get(MIME_TYPE), dict):
            data[MIME_TYPE] = {**data[MIME_TYPE], **self._stamp()}
        page = data.get("text/html")
        if isinstance(page, str):
            inside = page.endswith("</div>")
            data["text/html"] = (page[:-6] + footer_html(self.provenance) + "</div>" if inside
                                 else page + footer_html(self.provenance))
        return (data, metadata) if metadata is not None else data

    def __repr__(self):
        return repr(self.view)

    def __getattr__(self, name):            # the view's own attributes (`.items`, `.payload`) stay at hand
        if name in ("view", "provenance"):
            raise AttributeError(name)
        return getattr(self.view, name)
