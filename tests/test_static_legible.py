"""The static panel (what a saved notebook and an offline HTML export show) reads as well as the live one: every
heatmap row at least ROW_PX high with a colour bar, the top-k table with its header, histograms with their ends,
a colour range that is the slice's own, a dataset run's gradient badged "gradient", and a progress bar in text."""
import base64
import re
import struct

import torch

import nbgrad
from nbgrad.views import payload
from nbgrad.views.dataset import dataset_panel
from nbgrad.views.static import ROW_PX


def _pictures(html: str) -> dict:
    """alt text -> (width, height) of each PNG in the HTML, read from its header."""
    found = {}
    for alt, data in re.findall(r'<img alt="([^"]*)"[^>]*src="data:image/png;base64,([^"]+)"', html):
        width, height = struct.unpack(">II", base64.b64decode(data)[16:24])
        found[alt] = (width, height)
    return found


def test_logits_are_a_picture_with_rows_a_reader_can_see_and_the_table_keeps_its_header(default_model):
    tokenizer = nbgrad.tokenizer_for(default_model)
    result = nbgrad.trace(default_model, "The cat sat on the", "logits = model.lm_head.output.save()", no_grad=True)
    logits = result.saved["logits"]
    assert tuple(logits.shape) == (1, 5, 580)
    html = nbgrad.views.panel_for_result(result, tokenizer).static_html()
    width, height = _pictures(html)["heatmap of logits"]
    assert height >= 5 * ROW_PX and width >= 256               # 5 rows, 256 sampled columns of 580
    assert "colour bar" in _pictures(html)
    assert "<th>position</th><th>top 1</th>" in html
    assert "sampled: 5 of 5 rows, 256 of 580 columns" in html


def test_histograms_keep_their_lowest_and_highest_value():
    x = torch.linspace(-3.25, 7.5, 1000)
    html = nbgrad.show(x, "x").static_html()
    assert "histogram of x" in _pictures(html)
    assert re.search(r"<small>-3\.25</small>.*histogram.*<small>7\.5</small>", html)


def test_the_colour_range_is_the_whole_slices_not_the_samples():
    values = torch.zeros(5, 580)
    values[2, 1] = 10.81            # column 1 is not among the 256 evenly spaced columns drawn
    values[3, 3] = -2.0
    assert 1 not in payload._sample_indices(580, payload.MAX_COLS)
    [first] = payload.heatmap(values, None, None, signed=True)["slices"]
    assert (first["lo"], first["hi"]) == (-10.81, 10.81) or abs(first["hi"] - 10.81) < 1e-6
    assert abs(first["lo"] + 10.81) < 1e-6
    unsigned = payload.heatmap(values.abs(), None, None, signed=False)["slices"][0]
    assert abs(unsigned["hi"] - 10.81) < 1e-6 and unsigned["lo"] == 0.0
    assert "10.81" in nbgrad.show(values, "v").static_html()


def test_a_gradient_saved_alone_over_a_dataset_is_badged_gradient(shell, default_model):
    from IPython.core.displaypub import CapturingDisplayPublisher
    shell.user_ns.update(model=default_model, texts=["The cat sat", "A dog ran", "One two", "Red sky"])
    publisher, shell.display_pub = shell.display_pub, CapturingDisplayPublisher()
    try:
        shell.run_cell_magic("trace", "model --over texts --batch-size 2",
                             "grad = model.transformer.h[2].output.grad[:, -1].save()\n"
                             "act = model.transformer.h[2].output[:, -1].save()\n"
                             "model.lm_head.output[:, -1].max().backward()")
        outputs = shell.display_pub.outputs
    finally:
        shell.display_pub = publisher
        default_model.zero_grad(set_to_none=True)
    [bundle] = [o["data"] for o in outputs if "application/vnd.nbgrad.panel+json" in o["data"]]
    kinds = {item["name"]: (item["kind"], item["partner"]) for item in bundle["application/vnd.nbgrad.panel+json"]["items"]}
    assert kinds == {"grad": ("gradient", "model.transformer.h[2].output"), "act": ("activation", None)}
    assert "grad (gradient of model.transformer.h[2].output)" in bundle["text/plain"]


def test_a_dataset_panel_without_the_cell_badges_nothing_as_gradient():
    panel = dataset_panel({"g": [torch.ones(1, 3), torch.zeros(1, 3)]})
    assert panel.items[0]["kind"] == "activation"


def test_the_progress_bar_of_a_dataset_run_is_text(capsys):
    from nbgrad.datasets.run import _progress
    with _progress(3, True) as bar:
        assert type(bar).__module__ == "tqdm.std"             # not tqdm.notebook's widget
        bar.update(3)


def test_the_generation_panels_table_of_top_tokens_keeps_its_header(default_model):
    from nbgrad.views.generation import generation_panel
    result = nbgrad.generate(default_model, "The cat sat on the", "", max_new_tokens=3)
    panel = generation_panel(result.input_ids, result.output, result.top_next, result.saved,
                             nbgrad.tokenizer_for(default_model), "gen")
    html = panel._repr_mimebundle_()["text/html"]
    assert '<table class="nbgrad-generation-topk"><tr><th>step</th><th>top 1</th>' in html
    assert html.count("<tr><td>step ") == 3
