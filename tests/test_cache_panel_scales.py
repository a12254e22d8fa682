"""The Cache panel gives each row its own colour scale, written at the row's end, and a colour bar: a row of
small gradients beside a row of large norms still shows its structure."""
import re

import nbgrad
from nbgrad.views.cache import CachePanel
from nbgrad.views.palette import DIVERGING, SEQUENTIAL

IDS_TEXT = "The cat sat on the"


def _rows(html: str) -> dict:
    """row label -> ([cell colours as (r, g, b)], the row's scale text)."""
    found = {}
    for label, body in re.findall(r'<tr><th style="[^"]*">([^<]*)</th>(.*?)</tr>', html):
        colours = [tuple(int(h[i:i + 2], 16) for i in (0, 2, 4)) for h in re.findall(r"background:#([0-9a-f]{6})", body)]
        scale = re.search(r'class="nbgrad-row-scale"[^>]*>([^<]*)<', body).group(1)
        found[label] = (colours, scale)
    return found


def _summary(rows) -> dict:
    return {"rows": [{"path": p, "shape": [1, len(v), 8], "values": v, "signed": s} for p, v, s in rows],
            "nbytes": 1, "modules": len(rows), "memory": "1 B"}


def test_each_row_has_its_own_scale_so_small_gradients_show_structure():
    html = CachePanel(_summary([("lm_head", [100.0, 146.0, 120.0], False),
                                ("transformer.h.0", [1.0, 2.0, 3.0], False),
                                ("transformer.h.3 grad×act", [5.6e-5, -2.8e-5, 0.0], True)])).html()
    rows = _rows(html)
    small, scale = rows["transformer.h.0"]
    assert small[-1] == tuple(SEQUENTIAL[255]) and len(set(small)) == 3 and scale == "0 … 3"
    grads, scale = rows["transformer.h.3 grad×act"]
    assert grads[0] == tuple(DIVERGING[255]) and grads[2] == tuple(DIVERGING[128]) and scale == "±5.6e-05"
    assert grads[1] not in (tuple(DIVERGING[127]), tuple(DIVERGING[128]))     # -half the bound: clearly blue
    assert rows["lm_head"][1] == "0 … 146"
    assert 'class="nbgrad-colour-bar"' in html and "blue = negative" in html and "its own colour scale" in html


def test_a_models_cache_panel_shows_every_rows_scale(default_model):
    ns = {"model": default_model}
    nbgrad.trace(default_model, IDS_TEXT, "c = cache(grads=True)\nmodel.output.logits[0, -1].max().backward()", ns)
    default_model.zero_grad(set_to_none=True)
    summary = ns["c"].summary()
    rows = _rows(CachePanel(summary).html())
    assert len(rows) == len(summary["rows"])
    for row in summary["rows"]:
        colours, scale = rows[row["path"]]
        top = max(abs(v) for v in row["values"])
        if top > 0:                                      # the row's largest cell takes the scale's end
            assert tuple(DIVERGING[255] if row["signed"] else SEQUENTIAL[255]) in colours or \
                tuple(DIVERGING[0]) in colours
        assert scale.startswith("±" if row["signed"] else "0 … ")
