"""The picture of an Attribution: token or site × position heatmap, diverging and centred on zero, a
legend, values on hover, PNG and text beside the HTML, and every label escaped."""
import base64
import re

import torch

import nbgrad
from helpers import tiny_gpt2
from nbgrad.views.attribution import MAX_CELLS, AttributionView

HOSTILE = ["<script>alert(1)</script>", "a&b", "$\\frac{$", "\n", '"quoted"']


def cell_colours(html):
    return re.findall(r"background-color:rgb\((\d+), (\d+), (\d+)\)", html)


def test_bundle_has_html_png_and_text_with_every_label_escaped():
    view = AttributionView(torch.tensor([-2.0, 0.0, 1.0, 2.0, 0.5]), HOSTILE, title="<b>title</b>")
    bundle = view._repr_mimebundle_()
    html = bundle["text/html"]
    assert "<script>" not in html and "&lt;script&gt;" in html and "a&amp;b" in html
    assert "&lt;b&gt;title&lt;/b&gt;" in html and "&quot;quoted&quot;" in html
    assert "↵" in html         # a line break token is shown as a mark, not as a line break
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")   # "$\frac{$" is not read as math
    assert "'<script>alert(1)</script>':-2" in bundle["text/plain"]


def test_diverging_colours_centred_on_zero_with_legend_and_hover_values():
    view = AttributionView(torch.tensor([-2.0, 0.0, 2.0]), ["neg", "zero", "pos"])
    html = view.html()
    negative, zero, positive = [tuple(map(int, c)) for c in cell_colours(html)[:3]]
    assert negative[2] > negative[0] and positive[0] > positive[2] and min(zero) > 240
    assert 'title="&#x27;neg&#x27;: -2"' in html and 'title="&#x27;pos&#x27;: 2"' in html
    assert "blue = negative, white = 0, red = positive" in html and "-2 " in html and "+2" in html


def test_site_by_position_grid_with_exact_checks():
    model = tiny_gpt2()
    clean, corrupt = torch.tensor([[3, 14, 15, 92]]), torch.tensor([[3, 14, 27, 92]])
    result = nbgrad.attribution_patching(model, clean, corrupt, lambda logits: logits[0, -1, 5],
                                         sites="transformer.h.?", check_top=2)
    bundle = result._repr_mimebundle_()
    html = bundle["text/html"]
    for name in result.sites:
        assert f">{name}</th>" in html
    assert html.count("•") >= 2 and "checked exactly (•)" in html and "(exact " in html
    assert "4 sites × 4 positions; largest |score|:" in bundle["text/plain"]
    assert "(exact " in bundle["text/plain"] and base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    assert "metric on the corrupt run" in html


def test_large_grids_keep_the_strongest_rows_within_the_cell_budget():
    scores = torch.zeros(300, 40)
    scores[123, 5] = 9.0
    view = AttributionView(scores, [f"t{i}" for i in range(40)], rows=[f"site.{i}" for i in range(300)])
    html = view.html()
    shown = MAX_CELLS // 40
    assert html.count("<tr>") == shown + 1 and ">site.123</th>" in html
    assert f"showing the {shown} of 300 sites with the largest |score|" in html


def test_integrated_gradients_panel_shows_the_completeness_check(default_model):
    result = nbgrad.attribute(default_model, "Monday comes before", " Tuesday", steps=8)
    bundle = result._repr_mimebundle_()
    assert "completeness: sum of attributions" in bundle["text/html"]
    assert f"delta {result.delta:.3g}" in bundle["text/plain"]
    assert result.title in bundle["text/plain"] and "nbgrad-tokens" in bundle["text/html"]
