"""The inline panel: one display bundle with the data for nbgrad's renderer, static HTML (pictures as
PNG), plain text, and the live widget where the front end needs one (see `live`)."""
from __future__ import annotations

import base64
from collections.abc import Mapping

import torch

from . import live
from . import payload as build
from .gradients import gradient_targets
from .hookgraph import hook_graph_svg
from .static import static_html, text_summary
from .tokens import shorten, visible
from .widget import PanelWidget

MIME_TYPE = "application/vnd.nbgrad.panel+json"
MAX_ITEMS = 24

__all__ = ["MIME_TYPE", "Panel", "panel_for_result", "show", "static_html", "text_summary"]


class Panel(PanelWidget):
    """What a cell shows. `_repr_mimebundle_` gives every front end something to draw.

    A panel is also a widget, so it can stand in an ipywidgets layout (`VBox([slider, nbgrad.show(x)])`).
    ipywidgets opens a comm for every widget it builds; a panel opens one only when a layout asks for its
    model id, so a panel displayed by itself sends its MIME bundle and nothing else."""

    def __init__(self, items: list, title: str = "", notes: list | None = None, graph: str | None = None,
                 tabs: list | None = None):
        payload = {"nbgrad": 1, "title": title, "notes": notes or [], "items": items,
                   "palettes": build.palettes()}
        if tabs:
            payload["tabs"] = tabs         # [{title, about}]: an item's "tab" is its index here (invokes)
        if graph:
            payload["graph"] = graph       # the hook graph of the run, an SVG data URI
        super().__init__(payload=payload)

    def open(self):
        """Called by ipywidgets when the widget is built: the comm waits until a layout needs it."""

    @property
    def model_id(self):
        if self.comm is None:
            PanelWidget.open(self)
            live.track(self)
        return self.comm.comm_id

    @property
    def items(self) -> list:
        return self.payload["items"]

    def widget(self):
        """A live widget of this panel, displayed as the widget alone (no MIME bundle of nbgrad's)."""
        return PanelWidget(payload=self.payload)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = self._widget_bundle() if live.wants_widget() else {}
        bundle[MIME_TYPE] = self.payload
        bundle["text/html"] = self.static_html()
        bundle["text/plain"] = repr(self)
        return bundle

    def _widget_bundle(self) -> dict:
        try:
            widget = self.widget()
            data = widget._repr_mimebundle_()
        except Exception:       # no widget machinery here: the static forms still show
            return {}
        live.track(widget)
        return dict(data[0] if isinstance(data, tuple) else data)

    def static_html(self) -> str:
        return static_html(self.payload)

    def __repr__(self):
        return text_summary(self.payload)


def _tokens(result, tokenizer) -> list | None:
    ids = getattr(result, "input_ids", None)
    if ids is None or tokenizer is None:
        return None
    return [visible(tokenizer.decode([int(i)])) for i in ids.reshape(-1, ids.shape[-1])[0]]


def items_for(name: str, value, *, tokens=None, tokenizer=None, kind="activation", partner=None, note=None):
    """Panel items for a value: a tensor, or the tensors inside a tuple / list / dict / ModelOutput."""
    if isinstance(value, torch.Tensor):
        return [build.tensor_item(name, value, kind=kind, partner=partner, tokens=tokens, tokenizer=tokenizer,
                                  note=note)]
    if isinstance(value, Mapping):
        pairs = [(f"{name}.{k}" if name else str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        pairs = [(f"{name}[{i}]", v) for i, v in enumerate(value)]
    else:
        return [build.value_item(name, value)]
    items = []
    for sub_name, sub_value in pairs:
        if isinstance(sub_value, (torch.Tensor, Mapping, list, tuple)):
            items.extend(items_for(sub_name, sub_value, tokens=tokens, tokenizer=tokenizer, kind=kind))
    return items or [build.value_item(name, value)]


def panel_for_result(result, tokenizer=None, title: str = "") -> Panel:
    """The panel of a cell's Result; `tokenizer` decodes token ids and logits' top tokens. With invokes,
    each invoke's saved values get a tab titled with its INPUT, the whole batch's values a tab of their own."""
    invokes = getattr(result, "invokes", None) or []
    tokens = _tokens(result, tokenizer) if len(invokes) <= 1 else None
    items, shown, tabs = [], set(), []
    gradients = gradient_targets(result.graph, result.saved)
    for tab, names in _groups(result, invokes):
        if tab is not None:
            tabs.append(tab)
        for name in names:
            value = result.saved[name]
            if id(value) in shown:
                continue        # an alias of a value shown already (`e = ...; full = e.save()`)
            shown.add(id(value))
            partner = result.grad_pairs.get(name) or gradients.get(name) or None
            kind = "gradient" if name in result.grad_pairs or name in gradients else "activation"
            for item in items_for(name, value, tokens=tokens, tokenizer=tokenizer, kind=kind, partner=partner):
                items.append(item if tab is None else {**item, "tab": len(tabs) - 1})
    items.extend(_leaf_grad_items(result))
    notes = []
    if len(items) > MAX_ITEMS:
        notes.append(f"showing {MAX_ITEMS} of {len(items)} values")
        items = items[:MAX_ITEMS]
    return Panel(items, title=title, notes=notes, graph=_graph_picture(result, title), tabs=tabs)


def _graph_picture(result, title: str) -> str | None:
    """The run's hook graph as an SVG data URI, for the panel's "graph" tab (none without statements)."""
    graph = getattr(result, "graph", None)
    if graph is None or not getattr(graph, "nodes", None):
        return None
    svg = hook_graph_svg(graph.to_dict(), title)
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def _groups(result, invokes: list) -> list:
    """[(tab or None, saved names)]: one tab per invoke, titled with its INPUT cut short (the whole INPUT
    in `about`), then the values saved outside every invoke."""
    by_invoke = getattr(result, "saved_invokes", {}) or {}
    if not invokes:
        return [(None, list(result.saved))]
    groups = [({"title": f"invoke {k}: {_cut(value)}", "about": f"invoke {k}'s input: {_cut(value, 400)}"},
               [n for n in result.saved if by_invoke.get(n) == k]) for k, value in enumerate(invokes)]
    rest = [name for name in result.saved if name not in by_invoke]
    whole = {"title": "whole batch", "about": "saved outside every invoke: all the invokes' rows together"}
    return groups + ([(whole, rest)] if rest else [])


def _cut(value, room: int = 22) -> str:
    """An invoke's INPUT as a short title: a string as it reads, anything else as its repr."""
    text = " ".join(value.split()) if isinstance(value, str) else " ".join(repr(value).split())
    text = f'"{text}"' if isinstance(value, str) else text
    return shorten(text, room)


def _leaf_grad_items(result) -> list:
    items = []
    for name, grad in result.leaf_grads.items():
        if grad is None:
            continue
        note = ("accumulated: .grad already held a value before this pass, so it now holds the sum "
                "(call .grad.zero_() or zero_grad() between passes)") if name in result.accumulated else None
        items.append(build.tensor_item(f"{name}.grad", grad, kind="gradient", partner=None, note=note))
    return items


def show(value, name: str = "", tokenizer=None) -> Panel:
    """The panel for any tensor, or a dict / list of tensors."""
    prefix = (name or "value") if isinstance(value, torch.Tensor) else ""
    items = items_for(prefix, value, tokenizer=tokenizer)
    return Panel(items[:MAX_ITEMS], title=name)
