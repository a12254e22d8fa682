"""What a newcomer reads on a panel is whole and labelled: every line of the hook graph's picture (its legend
included) ends inside the picture, a heatmap says what its rows and columns are, a histogram what its axes are."""
import re
import xml.etree.ElementTree as ET

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import nbgrad
from nbgrad.views.hookgraph import hook_graph_svg
from svgdata import SVG

# the cell of docs/images/panel.png: a run through three phases, whose legend is the picture's longest line
CELL = ("hs = model.transformer.h[1].output.save()\n"
        "with model.output.logits[0, -1].max().backward():\n"
        "    g = hs.grad.save()")
CHAR_PX = {"11": 7, "12": 7.3, "13": 8}       # monospace: the width of a character at each size the picture uses


def _overruns(svg: str) -> list:
    """(text, its right end) for each line of text that ends past the picture's right edge."""
    root = ET.fromstring(svg)
    width = float(root.get("width"))
    ends = [(t.text, float(t.get("x")) + CHAR_PX[t.get("font-size")] * len(t.text or ""))
            for t in root.iter(f"{SVG}text") if t.get("textLength") is None]
    return [(text, end) for text, end in ends if end > width]


@pytest.mark.parametrize("ran", [True, False])
def test_no_line_of_the_hook_graph_runs_past_its_edge(default_model, ran):
    graph = nbgrad.trace(default_model, "The Eiffel Tower is in the city of", CELL).graph.to_dict()
    svg = hook_graph_svg(graph if ran else {**graph, "runs": []}, '%%trace model "The Eiffel Tower is in the city of"')
    legend = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text") if t.text.startswith("#n: the run's nth step")]
    assert len(legend) == int(ran)
    assert _overruns(svg) == []
    if ran:      # the legend after three phases is wider than the statements' columns: the picture grows for it
        assert float(ET.fromstring(svg).get("width")) > 900


def test_a_heatmap_names_its_rows_and_columns_in_both_renderings(default_model):
    tokenizer = nbgrad.tokenizer_for(default_model)
    result = nbgrad.trace(default_model, "The cat sat on the", "hs = model.transformer.h[0].output.save()")
    panel = nbgrad.views.panel_for_result(result, tokenizer)
    [item] = [item for item in panel.payload["items"] if item["name"] == "hs"]
    assert tuple(result.saved["hs"].shape) == (1, 5, 128)
    assert item["heatmap"]["axes"] == "rows ↓ axis 1: tokens 0–4 · columns → axis 2: 0–127"
    html = panel.static_html()
    assert "rows ↓ axis 1: tokens 0–4 · columns → axis 2: 0–127" in html
    assert "value → · bar height: count" in html           # under the histogram


@pytest.mark.parametrize("shape, axes", [((5,), "one row · columns → axis 0: 0–4"),
                                         ((3, 1), "rows ↓ axis 0: 0–2 · columns → axis 1: 0"),
                                         ((2, 4, 6), "rows ↓ axis 1: 0–3 · columns → axis 2: 0–5")])
def test_a_tensor_without_tokens_names_its_axes_by_number(shape, axes):
    shown = nbgrad.show(torch.randn(shape), "x")
    [item] = shown.payload["items"]
    assert item["heatmap"]["axes"] == axes
    assert axes in shown.static_html()


def _contrast(a, b) -> float:
    def lum(rgb):
        return sum(w * (c / 255 / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4)
                   for w, c in zip((0.2126, 0.7152, 0.0722), rgb))
    high, low = sorted((lum(a), lum(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_text_on_a_data_coloured_cell_stands_out_from_every_colour_of_both_maps():
    from nbgrad.views.palette import DIVERGING, SEQUENTIAL, ink
    inks = {"#000": (0, 0, 0), "#fff": (255, 255, 255)}
    for colour in [tuple(int(c) for c in rgb) for rgb in (*DIVERGING, *SEQUENTIAL)]:
        chosen = ink(colour)
        assert _contrast(inks[chosen], colour) >= 4.5, (colour, chosen)
        assert _contrast(inks[chosen], colour) >= max(_contrast(rgb, colour) for rgb in inks.values()) - 1e-9
    tokens = nbgrad.views.token_heatmap(["near", "end"], [0.01, -1.0])._repr_html_()
    inked = dict((text, colour) for colour, text in re.findall(r'color:(#[0-9a-f]{3});[^>]*>([^<]*)</span>', tokens))
    assert inked == {"near": "#000", "end": "#fff"}        # near-white cell: black text; the saturated end: white


def test_the_matplotlib_heatmaps_say_what_their_colours_and_axes_are(monkeypatch):
    from nbgrad.views import attention
    from nbgrad.views.attribution import AttributionView
    pattern = torch.softmax(torch.randn(2, 3, 3, generator=torch.Generator().manual_seed(0)), -1)
    for grid, signed, label in ((pattern, False, "attention weight (query → key)"),
                                (pattern - 0.3, True, "score: blue < 0 < red")):
        low, high = (-0.7, 0.7) if signed else (0.0, 1.0)
        fig = attention._figure(grid, ["a", "b", "c"], "t", (low, high, 0), signed)
        assert fig.axes[-1].get_ylabel() == label                     # the colour bar, last of the axes
        assert (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()) == ("key", "query")
    exact = torch.full((2, 3), float("nan"))
    exact[0, 1] = 0.5
    view = AttributionView(torch.randn(2, 3), ["a", "b", "c"], rows=["h.0", "h.1"], title="t", exact=exact)
    drawn = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *args, **kw: drawn.append(fig) or savefig(fig, *args, **kw))
    view.png()
    [figure] = drawn
    axes, bar = figure.axes
    assert (axes.get_xlabel(), axes.get_ylabel()) == ("token position   (• = checked exactly)", "site")
    assert bar.get_ylabel() == "score: blue < 0 < red"


def test_the_gradient_flow_names_its_dotted_lines_in_a_legend_that_covers_no_bar(monkeypatch, default_model):
    from nbgrad.views.gradflow import figure_png, layer_stats
    default_model.zero_grad(set_to_none=True)
    default_model(torch.tensor([[1, 2, 3]])).logits[0, -1].max().backward()
    drawn = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *args, **kw: drawn.append(fig) or savefig(fig, *args, **kw))
    try:
        figure_png(layer_stats(default_model), {}, "gradient flow: model")
    finally:
        default_model.zero_grad(set_to_none=True)
    [axes] = drawn[0].axes
    legend = axes.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "thresholds: vanishing < 1e-07, exploding > 1000", "max |grad|", "mean |grad|"]
    renderer = FigureCanvasAgg(drawn[0]).get_renderer()
    assert legend.get_window_extent(renderer).y0 >= axes.get_window_extent(renderer).y1 - 1    # above the bars
    assert axes.get_ylabel() == "parameter"


def test_the_graph_options_note_has_its_own_line_under_the_title(default_model):
    from nbgrad.notebook.graph import NOT_RUN
    from nbgrad.views.hookgraph import HookGraphPicture
    graph = nbgrad.trace(default_model, "The Eiffel Tower is in the city of", CELL).graph.to_dict()
    title = '%%trace model "The Eiffel Tower is in the city of" --graph'
    svg = HookGraphPicture({**graph, "runs": []}, "", title, note=NOT_RUN).svg
    texts = {t.text: float(t.get("y")) for t in ET.fromstring(svg).iter(f"{SVG}text")}
    assert texts[title] < texts[NOT_RUN] < 40              # the note: the second line, above the legend
    assert _overruns(svg) == []
    assert float(ET.fromstring(svg).get("width")) < 8 * len(f"{title} · {NOT_RUN}")    # not one long line
    legend = ET.fromstring(svg).find(f"{SVG}g[@transform='translate(0,18)']")
    assert legend is not None and legend.find(f"{SVG}text").text.startswith("arrows: ")    # moved down for it


def test_the_cache_panel_names_its_axes_and_writes_each_column_label_along_its_column():
    from nbgrad.views.cache import CachePanel
    rows = [{"path": "transformer.h.0", "shape": [1, 12, 8], "values": [float(i) for i in range(12)], "signed": False}]
    html = CachePanel({"rows": rows, "nbytes": 1, "modules": 1, "memory": "1 B"}).html()
    header = re.search(r"<tr>(.*?)</tr>", html).group(1)
    assert "module ↓ · position →" in header
    labels = re.findall(r'<th style="([^"]*)">(\d+)</th>', header)
    assert [label for _, label in labels] == [str(i) for i in range(12)]
    assert all("writing-mode:vertical-rl" in style for style, _ in labels)     # "10" and "11" never run together
