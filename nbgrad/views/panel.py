"""The inline panel: one display bundle with a live widget, the data for the JupyterLab renderer,
static HTML (pictures as PNG) and plain text."""
from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping

import numpy as np
import torch

from . import payload as build
from .palette import heatmap_png, histogram_png

MIME_TYPE = "application/vnd.nbgrad.panel+json"
MAX_ITEMS = 24
STATS = ("min", "max", "mean", "std", "norm")


class Panel:
    """What a cell shows. `_repr_mimebundle_` gives every front end something to draw."""

    def __init__(self, items: list, title: str = "", notes: list | None = None):
        self.payload = {"nbgrad": 1, "title": title, "notes": notes or [], "items": items,
                        "palettes": build.palettes()}

    @property
    def items(self) -> list:
        return self.payload["items"]

    def widget(self):
        from .widget import PanelWidget
        return PanelWidget(payload=self.payload)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {}
        try:
            widget_bundle = self.widget()._repr_mimebundle_()
            bundle.update(widget_bundle[0] if isinstance(widget_bundle, tuple) else widget_bundle)
        except Exception:       # no widget machinery here: the static forms still show
            pass
        bundle[MIME_TYPE] = self.payload
        bundle["text/html"] = self.static_html()
        bundle["text/plain"] = repr(self)
        return bundle

    def static_html(self) -> str:
        return static_html(self.payload)

    def __repr__(self):
        return text_summary(self.payload)


def text_summary(data: dict) -> str:
    lines = [data["title"]] if data.get("title") else []
    for item in data["items"]:
        if item["kind"] == "value":
            lines.append(f"{item['name']}: {item['value']}")
            continue
        s = item["summary"]
        stats = " ".join(f"{k}={s[k]:.4g}" for k in STATS if s.get(k) is not None)
        bad = f" NaN={s.get('nan', 0)} Inf={s.get('inf', 0)}" if s.get("nan") or s.get("inf") else ""
        lines.append(f"{item['name']} ({item['kind']}): {tuple(s['shape'])} {s['dtype']} {s['device']} "
                     f"{stats}{bad}" + (f"  [{item['note']}]" if item.get("note") else ""))
    return "\n".join(lines)


def _img(png: bytes, alt: str) -> str:
    return (f'<img alt="{html.escape(alt)}" style="image-rendering:pixelated;border:1px solid #eee" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode()}"/>')


def static_html(data: dict) -> str:
    """The panel as plain HTML: what a notebook shows without a kernel or any extension."""
    esc = html.escape
    parts = ['<div class="nbgrad-static" style="font-family:sans-serif;font-size:12px">']
    if data.get("title"):
        parts.append(f"<div><b>{esc(data['title'])}</b></div>")
    for item in data["items"]:
        parts.append('<div style="border:1px solid #ddd;border-radius:4px;padding:4px 8px;margin:4px 0">')
        parts.append(f"<div><code><b>{esc(item['name'])}</b></code> <small>{esc(item['kind'])}</small></div>")
        if item.get("note"):
            parts.append(f"<div><i>{esc(item['note'])}</i></div>")
        if item["kind"] == "value":
            parts.append(f"<pre>{esc(item['value'])}</pre>")
        else:
            parts.extend(_tensor_html(item))
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def _tensor_html(item: dict) -> list:
    """Summary line, stats, heatmap, histogram and top tokens of one tensor item, as HTML parts."""
    esc = html.escape
    s = item["summary"]
    cells = "".join(f"<td>{esc(k)} {esc(format(s[k], '.4g'))}</td>" for k in STATS if s.get(k) is not None)
    for key in ("nan", "inf"):
        count = s.get(key, 0)
        style = ' style="color:#b00020;font-weight:bold"' if count else ""
        cells += f"<td{style}>{key.upper()} {count}</td>"
    grad = f"grad_fn={s['grad_fn']}" if s.get("grad_fn") else f"requires_grad={s['requires_grad']}"
    parts = [f"<div><code>{esc(str(tuple(s['shape'])))} {esc(s['dtype'])} {esc(s['device'])} {esc(grad)}"
             f"</code></div><table><tr>{cells}</tr></table>"]
    hm = item.get("heatmap")
    if hm:
        first = hm["slices"][0]
        levels = np.frombuffer(base64.b64decode(first["data"]), dtype=np.uint8).reshape(len(hm["rows"]), len(hm["cols"]))
        scale = max(1, min(8, 480 // max(len(hm["cols"]), 1)))
        parts.append(_img(heatmap_png(levels, hm["signed"], scale), f"heatmap of {item['name']}"))
        parts.append(f"<div><small>colour range {first['lo']:.4g} … {first['hi']:.4g}"
                     f"{' (diverging, 0 = white)' if hm['signed'] else ''}</small></div>")
    if item.get("histogram"):
        parts.append(_img(histogram_png(item["histogram"]["counts"]), f"histogram of {item['name']}"))
    if item.get("topk"):
        topk = item["topk"]
        rows = "".join(
            f"<tr><td>{esc(pos)}</td>" + "".join(f"<td>{esc(json.dumps(tok))} {p * 100:.1f}%</td>"
                                               for tok, p in zip(topk["tokens"][i], topk["probs"][i])) + "</tr>"
            for i, pos in enumerate(topk["positions"]))
        parts.append(f"<table>{rows}</table>")
    return parts


def _tokens(result, tokenizer) -> list | None:
    ids = getattr(result, "input_ids", None)
    if ids is None or tokenizer is None:
        return None
    return [tokenizer.decode([int(i)]) for i in ids.reshape(-1, ids.shape[-1])[0]]


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
            items.extend(items_for(sub_name, sub_value, tokens=tokens, tokenizer=tokenizer))
    return items or [build.value_item(name, value)]


def panel_for_result(result, tokenizer=None, title: str = "") -> Panel:
    """The panel of a cell's Result; `tokenizer` decodes token ids and logits' top tokens."""
    tokens = _tokens(result, tokenizer)
    items, shown = [], set()
    for name, value in result.saved.items():
        if id(value) in shown:
            continue            # an alias of a value shown already (`e = ...; full = e.save()`)
        shown.add(id(value))
        partner = result.grad_pairs.get(name)
        items.extend(items_for(name, value, tokens=tokens, tokenizer=tokenizer,
                               kind="gradient" if partner else "activation", partner=partner))
    for name, grad in result.leaf_grads.items():
        if grad is None:
            continue
        note = ("accumulated: .grad already held a value before this pass, so it now holds the sum "
                "(call .grad.zero_() or zero_grad() between passes)") if name in result.accumulated else None
        items.append(build.tensor_item(f"{name}.grad", grad, kind="gradient", partner=None, note=note))
    notes = []
    if len(items) > MAX_ITEMS:
        notes.append(f"showing {MAX_ITEMS} of {len(items)} values")
        items = items[:MAX_ITEMS]
    return Panel(items, title=title, notes=notes)


def show(value, name: str = "", tokenizer=None) -> Panel:
    """The panel for any tensor, or a dict / list of tensors."""
    prefix = (name or "value") if isinstance(value, torch.Tensor) else ""
    items = items_for(prefix, value, tokenizer=tokenizer)
    return Panel(items[:MAX_ITEMS], title=name)
