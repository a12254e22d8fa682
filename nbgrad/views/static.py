"""A panel without any front-end code: plain text, and HTML with its pictures as PNG. This is what a
notebook shows with no kernel and no extension, and what an `nbconvert --to html` export shows."""
from __future__ import annotations

import base64
import html
import json

import numpy as np

from .palette import BAD, EDGE, TEXT2, colour_bar_png, heatmap_png, histogram_png

STATS = ("min", "max", "mean", "std", "norm")
ROW_PX, MAX_ROW_PX = 8, 24         # a heatmap row in the picture: never a strip one pixel high
WIDTH_PX, HEIGHT_PX = 480, 240     # what a heatmap aims to fill
esc = html.escape
AXES = "value → · bar height: count"     # a histogram's axes, under it


def in_tabs(data: dict) -> list:
    """[(tab or None, items)]: with invokes, each invoke's tab and its items, then the items of no tab."""
    tabs = data.get("tabs") or []
    groups = [(tab, [item for item in data["items"] if item.get("tab") == index]) for index, tab in enumerate(tabs)]
    rest = [item for item in data["items"] if item.get("tab") is None]
    return groups + ([(None, rest)] if rest or not tabs else [])


def text_summary(data: dict) -> str:
    lines = [data["title"]] if data.get("title") else []
    for tab, items in in_tabs(data):
        if tab is not None:
            lines.append(f"[{tab['title']}]")
        lines.extend(_item_text(item) for item in items)
    return "\n".join(lines)


def _item_text(item: dict) -> str:
    if item["kind"] == "value":
        return f"{item['name']}: {item['value']}"
    s = item["summary"]
    stats = " ".join(f"{k}={s[k]:.4g}" for k in STATS if s.get(k) is not None)
    bad = f" NaN={s.get('nan', 0)} Inf={s.get('inf', 0)}" if s.get("nan") or s.get("inf") else ""
    of = f" of {item['partner']}" if item["kind"] == "gradient" and item.get("partner") else ""
    return (f"{item['name']} ({item['kind']}{of}): {tuple(s['shape'])} {s['dtype']} {s['device']} "
            f"{stats}{bad}" + (f"  [{item['note']}]" if item.get("note") else ""))


def static_html(data: dict) -> str:
    parts = ['<div class="nbgrad-static" style="font-family:sans-serif;font-size:12px">']
    if data.get("title"):
        parts.append(f"<div><b>{esc(data['title'])}</b></div>")
    for tab, items in in_tabs(data):
        if tab is not None:        # an invoke's values under a heading with its input
            parts.append(f'<div style="margin-top:8px"><b>{esc(tab["title"])}</b> '
                         f'<small>{esc(tab.get("about", ""))}</small></div>')
        parts.extend(_item_html(item) for item in items)
    if str(data.get("graph", "")).startswith("data:image/svg+xml;base64,"):
        parts.append(f'<div style="overflow-x:auto"><b>hook graph</b><br/>'     # scrolls in a narrow output
                     f'<img alt="hook graph" src="{esc(data["graph"])}"/></div>')
    parts.append("</div>")
    return "".join(parts)


def _item_html(item: dict) -> str:
    of = f" of <code>{esc(item['partner'])}</code>" if item["kind"] == "gradient" and item.get("partner") else ""
    parts = [f'<div style="border:1px solid {EDGE};border-radius:4px;padding:4px 8px;margin:4px 0">',
             f"<div><code><b>{esc(item['name'])}</b></code> <small>{esc(item['kind'])}{of}</small></div>"]
    if item.get("note"):
        parts.append(f"<div><i>{esc(item['note'])}</i></div>")
    if item["kind"] == "value":
        return "".join(parts) + f"<pre>{esc(item['value'])}</pre></div>"
    parts.append(_summary_html(item["summary"]))
    if item.get("heatmap"):
        parts.append(_heatmap_html(item["heatmap"], item["name"]))
    if item.get("histogram"):
        parts.append(_histogram_html(item["histogram"], item["name"]))
    if item.get("topk"):
        parts.append(topk_table(item["topk"]))
    return "".join(parts) + "</div>"


def _summary_html(s: dict) -> str:
    cells = "".join(f"<td>{esc(k)} {esc(format(s[k], '.4g'))}</td>" for k in STATS if s.get(k) is not None)
    for key in ("nan", "inf"):
        count = s.get(key, 0)
        style = ' style="color:{BAD};font-weight:bold"' if count else ""
        cells += f"<td{style}>{key.upper()} {count}</td>"
    grad = f"grad_fn={s['grad_fn']}" if s.get("grad_fn") else f"requires_grad={s['requires_grad']}"
    return (f"<div><code>{esc(str(tuple(s['shape'])))} {esc(s['dtype'])} {esc(s['device'])} {esc(grad)}"
            f"</code></div><table><tr>{cells}</tr></table>")


def _heatmap_html(hm: dict, name: str) -> str:
    """The first slice as a picture, each cell at least ROW_PX high, with a colour bar from its lowest to its
    highest value; the notes say what was sampled."""
    first = hm["slices"][0]
    rows, cols = len(hm["rows"]), len(hm["cols"])
    levels = np.frombuffer(base64.b64decode(first["data"]), dtype=np.uint8).reshape(rows, cols)
    width = max(1, min(MAX_ROW_PX, WIDTH_PX // max(cols, 1)))
    height = max(ROW_PX, min(MAX_ROW_PX, HEIGHT_PX // max(rows, 1)), width)
    bar = _img(colour_bar_png(hm["signed"]), "colour bar", "vertical-align:middle")
    zero = " (diverging, 0 = white)" if hm["signed"] else ""
    notes = "".join(f"<div><small>{esc(note)}</small></div>" for note in [hm.get("axes", ""), *hm.get("notes", [])]
                    if note)
    return (_img(heatmap_png(levels, hm["signed"], width, height), f"heatmap of {name}") +
            f'<div class="nbgrad-colour-bar"><small>{first["lo"]:.4g} {bar} {first["hi"]:.4g}{zero}</small></div>'
            + notes)


def _histogram_html(hist: dict, name: str) -> str:
    what = f"histogram of {hist['sampled']} sampled values" if hist.get("sampled") else "histogram"
    return ('<div style="display:inline-block;vertical-align:top">'
            + _img(histogram_png(hist["counts"]), f"histogram of {name}") +
            f'<div style="display:flex;justify-content:space-between;width:240px"><small>{hist["lo"]:.4g}</small>'
            f'<small style="color:{TEXT2}">{esc(what)}</small><small>{hist["hi"]:.4g}</small></div>'
            f'<div style="text-align:center;width:240px"><small style="color:{TEXT2}">{AXES}</small></div></div>')


def topk_table(topk: dict, first: str = "position", css_class: str = "nbgrad-topk") -> str:
    """The top tokens as a table with its header row: `first` (what a row is), then top 1, top 2, ..."""
    def cell(token, p):
        return f"<td>{esc(json.dumps(token))} {'–' if p is None else f'{p * 100:.1f}%'}</td>"
    head = f"<tr><th>{esc(first)}</th>" + "".join(f"<th>top {i + 1}</th>" for i in range(len(topk["tokens"][0]))) \
        + "</tr>"
    rows = "".join(f"<tr><td>{esc(pos)}</td>" + "".join(cell(t, p) for t, p in zip(topk["tokens"][i], topk["probs"][i]))
                   + "</tr>" for i, pos in enumerate(topk["positions"]))
    return f'<table class="{css_class}">{head}{rows}</table>'


def _img(png: bytes, alt: str, style: str = "") -> str:
    return (f'<img alt="{esc(alt)}" style="image-rendering:pixelated;border:1px solid {EDGE};{style}" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode()}"/>')
