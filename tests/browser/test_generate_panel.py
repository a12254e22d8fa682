"""The %%generate panel in JupyterLab: generated text and top tokens by step, and a step slider that
shows each step's saved values."""
from labtools import open_notebook, run_command, screenshot, wait_for_kernel_idle, write_notebook

SETUP = "%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()"
GENERATE = ('%%generate model "The capital of France is" --max-new-tokens 4\n'
            "h = model.transformer.h[1].output.save()\n"
            "if step == 2:\n"
            "    only_two = model.output.logits[:, -1].save()")


def test_generation_panel_and_its_step_slider(lab, lab_root, page):
    write_notebook(lab_root / "generate.ipynb", [SETUP, GENERATE])
    open_notebook(page, lab, "generate.ipynb")
    wait_for_kernel_idle(page)
    run_command(page, "notebook:run-all-cells")
    page.wait_for_selector(".jp-OutputArea .nbgrad-panel", timeout=180_000)
    wait_for_kernel_idle(page)
    panel = page.locator(".jp-OutputArea .nbgrad-panel").first
    assert panel.locator(".nbg-tab").all_inner_texts() == ["generation", "h", "only_two"]
    text = panel.locator(".nbg-card").first.inner_text()
    assert "prompt:" in text and "continuation:" in text
    assert panel.locator("table.nbg-topk tr").count() == 1 + 4        # a header, then one row per step
    screenshot(page, "lab-generate-panel")

    panel.locator(".nbg-tab", has_text="h").click()
    slider = panel.locator("input.nbg-step-slider")
    assert slider.get_attribute("max") == "3"
    assert "[1, 7, 128]" in panel.locator(".nbg-step-view .nbg-summary").first.inner_text()   # step 0: the prompt
    slider.evaluate("s => { s.value = '2'; s.dispatchEvent(new Event('input')); }")
    assert "[1, 1, 128]" in panel.locator(".nbg-step-view .nbg-summary").first.inner_text()   # KV cache: one position
    assert "2 (of 0–3)" in panel.locator(".nbg-step-view label").inner_text()
    screenshot(page, "lab-generate-step-slider")

    panel.locator(".nbg-tab", has_text="only_two").click()
    assert "nothing saved at this step" in panel.locator(".nbg-step-view").inner_text()
    slider = panel.locator("input.nbg-step-slider")
    slider.evaluate("s => { s.value = '2'; s.dispatchEvent(new Event('input')); }")
    assert panel.locator(".nbg-step-view table.nbg-topk").count() == 1      # logits: their top tokens

    editor = page.locator(".jp-Cell").nth(1).locator(".cm-content")
    assert editor.locator(".nbgrad-magic-name").inner_text() == "%%generate"
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
