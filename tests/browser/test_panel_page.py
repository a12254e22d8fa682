"""The panel's front end on a bare page, through anywidget's `render({model, el})` contract and nothing
else: what VS Code's widget renderer gives it (VS Code itself cannot run here). No JupyterLab API,
no network; tabs pair gradients in either order, NaN logits read as "–"."""
import base64
import json
import re
from pathlib import Path

import torch

import nbgrad
from nbgrad.views import panel_for_result, show

PANEL_JS = Path(nbgrad.__file__).resolve().parent / "views" / "panel.js"


class Vocab:
    def __len__(self):
        return 7

    def decode(self, ids):
        return f"<t{ids[0]}>"


def _render(page, payload) -> None:
    source = base64.b64encode(PANEL_JS.read_bytes()).decode()
    page.set_content("<html><body><div id='out'></div></body></html>")
    page.evaluate("""async ([source, payload]) => {
        const module = await import('data:text/javascript;base64,' + source);
        const model = { get: (key) => payload, on: () => {} };     // anywidget's model, as any host gives it
        module.default.render({ model, el: document.getElementById('out') });
    }""", [source, payload])


def test_panel_js_uses_no_host_api():
    text = PANEL_JS.read_text()
    assert not re.search(r"^\s*import\b|require\(|@jupyterlab|jupyterapp|@jupyter-widgets", text, re.M)


def test_bare_page_renders_pairs_and_reads_nan(page, default_model):
    result = nbgrad.trace(default_model, "Hello World", """
with model.output.logits.sum().backward():
    g = model.transformer.h[1].output.grad.save()
h = model.transformer.h[1].output.save()
""")
    default_model.zero_grad(set_to_none=True)
    _render(page, json.loads(json.dumps(panel_for_result(result, nbgrad.tokenizer_for(default_model)).payload)))
    # h and its gradient share one tab; the run's hook graph has its own
    assert page.locator(".nbg-tab").all_inner_texts() == ["h + g", "graph"]
    assert page.locator(".nbg-card .nbg-name").all_inner_texts() == ["h", "g"]
    assert "of h" in page.locator(".nbg-card").nth(1).inner_text()

    logits = torch.randn(1, 3, 7, generator=torch.Generator().manual_seed(0))
    logits[0, 0, 0] = float("nan")
    _render(page, json.loads(json.dumps(show(logits, "logits", tokenizer=Vocab()).payload, allow_nan=False)))
    rows = page.locator("table.nbg-topk tr")
    assert rows.nth(1).inner_text().count("–") == 5 and "%" in rows.nth(2).inner_text()
    canvas = page.locator("canvas.nbg-heatmap-canvas")
    assert canvas.evaluate("c => c.width > 0 && c.height > 0")


def test_a_dataset_runs_panel_has_a_row_per_example(page, default_model):
    from labtools import screenshot
    from nbgrad.views.dataset import dataset_panel
    prompts = ["The Eiffel Tower is in", "Hi", "A longer prompt about several things", "Paris", "x y z"]
    namespace = {"model": default_model}
    nbgrad.trace(default_model, None, "last = model.transformer.h[1].output[:, -1].save()\n"
                 "full = model.transformer.h[1].output.save()", namespace, over=prompts, batch_size=2)
    panel = dataset_panel({name: namespace[name] for name in ("last", "full")}, "%%trace model --over prompts")
    _render(page, json.loads(json.dumps(panel.payload)))
    assert page.locator(".nbg-tab").all_inner_texts() == ["last", "full[0]"]      # a tab per value
    card = page.locator(".nbg-card")
    assert card.count() == 1 and "one per example on axis 0: 5 examples" in card.inner_text()
    canvas = card.locator("canvas.nbg-heatmap-canvas")
    assert canvas.evaluate("c => c.width > 0 && c.height > 0")
    page.set_viewport_size({"width": 1000, "height": 700})
    screenshot(page, "panel-dataset-run")


def test_the_live_panel_draws_its_footer(page, shell, default_model):
    from IPython.utils.capture import capture_output
    from nbgrad.views.panel import MIME_TYPE
    shell.user_ns.update(fm=default_model)
    with capture_output() as captured:
        shell.run_cell('%%trace fm "Hello World"\nh = fm.transformer.h[0].output.save()').raise_error()
    payload = captured.outputs[0].data[MIME_TYPE]
    _render(page, json.loads(json.dumps(payload)))
    footer = page.locator(".nbgrad-panel .nbg-footer")
    assert footer.inner_text() == payload["footer"]
    assert f"torch {torch.__version__}" in payload["footer"] and payload["footer"].endswith('%%trace fm "Hello World"')
    assert footer.evaluate("node => !node.nextElementSibling")         # last, under the tabs' body
