"""Attribution pictures in JupyterLab: a saved (untrusted, so sanitized) notebook still shows the
diverging colours and the hover values, and token text never becomes markup."""
import json

import torch

import nbgrad
from helpers import tiny_gpt2
from labtools import open_notebook, screenshot, wait_for_kernel_idle
from nbgrad.views.attribution import AttributionView

HOSTILE = '<img src=x onerror="window.nbgradPwned=1">'


def _output(bundle: dict) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": bundle}


def _saved_notebook(path):
    tokens = ["The", HOSTILE, " cat", " sat"]
    heat = AttributionView(torch.tensor([1.0, -2.0, 0.0, 3.0]), tokens, title="tokens")
    grid = nbgrad.attribution_patching(tiny_gpt2(), torch.tensor([[3, 14, 15, 92]]), torch.tensor([[3, 14, 27, 92]]),
                                       lambda logits: logits[0, -1, 5], sites="transformer.h.?", check_top=2)
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "source": "shown",
              "outputs": [_output(heat._repr_mimebundle_()), _output(grid._repr_mimebundle_())]}]
    notebook = {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                            "name": "python3"}},
                "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(notebook))


def test_saved_attribution_pictures_keep_colours_and_hover_values(lab, lab_root, page):
    _saved_notebook(lab_root / "attribution.ipynb")
    open_notebook(page, lab, "attribution.ipynb")
    page.wait_for_function("() => document.querySelectorAll('.jp-OutputArea .nbgrad-attribution').length >= 2",
                           timeout=120_000)
    wait_for_kernel_idle(page)
    tokens = page.locator(".jp-OutputArea .nbgrad-attribution").nth(0).locator("span[title]")
    colours = tokens.evaluate_all("spans => spans.map(s => getComputedStyle(s).backgroundColor)")
    assert len(set(colours)) >= 3 and "rgba(0, 0, 0, 0)" not in colours[:4]
    assert tokens.nth(3).get_attribute("title").endswith(": 3")
    assert HOSTILE in tokens.nth(1).inner_text()        # the token is shown as its characters
    assert page.evaluate("() => window.nbgradPwned") is None
    assert page.evaluate("() => document.querySelectorAll('.jp-OutputArea img[src=x]').length") == 0
    cells = page.locator(".jp-OutputArea .nbgrad-attribution").nth(1).locator("td[title]")
    assert cells.count() == 16 and "(exact " in " ".join(cells.evaluate_all("c => c.map(x => x.title)"))
    screenshot(page, "lab-attribution")
