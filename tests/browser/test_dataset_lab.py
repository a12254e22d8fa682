"""A dataset run in JupyterLab: the progress line, and a panel whose heatmap has a row per example."""
from labtools import run_notebook, screenshot

SETUP = ("%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()\n"
         "prompts = ['The Eiffel Tower is in', 'Hi', 'A longer prompt about several things', 'Paris', 'x y z']")
CELL = ("%%trace model --over prompts --batch-size 2\n"
        "last = model.transformer.h[1].output[:, -1].save()\nfull = model.transformer.h[1].output.save()")


def test_a_dataset_run_shows_its_values_a_row_per_example(lab, page):
    run_notebook(page, lab, "dataset.ipynb", [SETUP, CELL])
    panel = page.locator(".jp-OutputArea .nbgrad-panel").first
    panel.wait_for(timeout=60_000)
    assert "saved, one value per example: last (5 values), full (5 values)" in page.locator(".jp-OutputArea").nth(1) \
        .inner_text()
    assert panel.locator(".nbg-tab").all_inner_texts()[:2] == ["last", "full[0]"]
    card = panel.locator(".nbg-card").first
    assert "[5, 128]" in card.inner_text() and "one per example on axis 0: 5 examples" in card.inner_text()
    assert card.locator("canvas.nbg-heatmap-canvas").evaluate("c => c.width > 0 && c.height > 0")
    panel.scroll_into_view_if_needed()
    screenshot(page, "lab-dataset-run")
