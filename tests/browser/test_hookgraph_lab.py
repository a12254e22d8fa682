"""The hook graph, seen in JupyterLab: `%%trace --graph` draws the compiled cell, the panel's "graph" tab
draws the run (a `.grad` read written before the backward line runs inside the backward pass), and both
pictures stay in the saved notebook, opened again with no kernel."""
import base64
import json
from urllib.parse import unquote

from labtools import (ARTIFACTS, Lab, open_notebook, open_without_a_kernel, run_all_cells, screenshot,
                      wait_for_kernel_idle, write_notebook)

SETUP = "%load_ext nbgrad\nimport nbgrad\nmodel = nbgrad.load_model()"
BODY = ("hs = model.transformer.h[1].output\n"
        "g = hs.grad.save()\n"
        "logits = model.output.logits\n"
        "logits.sum().backward()")
GRAPH = f'%%trace model "The Eiffel Tower is in" --graph\n{BODY}'
RUN = f'%%trace model "The Eiffel Tower is in"\n{BODY}'


def _svg_of(image) -> str:
    """The SVG text behind an <img> whose source is an SVG data URI."""
    source = image.get_attribute("src")
    assert source.startswith("data:image/svg+xml"), source[:60]
    head, _, data = source.partition(",")
    return base64.b64decode(data).decode() if head.endswith(";base64") else unquote(data)


def _drawn(image) -> None:
    """The browser decoded the picture and gave it a size a person can read."""
    image.scroll_into_view_if_needed()
    size = image.evaluate("i => i.complete ? [i.naturalWidth, i.naturalHeight, i.clientWidth] : null")
    assert size is not None and size[0] > 300 and size[1] > 100 and size[2] > 300, size


def _check_pictures(page) -> None:
    """Cell 2's `--graph` picture and cell 3's panel with its graph tab, as a person sees them."""
    cells = page.locator(".jp-Notebook .jp-Cell")
    compiled = cells.nth(1).locator(".jp-OutputArea-output img").first
    compiled.wait_for(state="visible", timeout=120_000)
    _drawn(compiled)
    svg = _svg_of(compiled)
    assert "hs.grad" in svg and "model.transformer.h[1].output" in svg and "g = hs.grad.save()" in svg
    assert "backward" in svg
    compiled.screenshot(path=str(screenshot_path("lab-hookgraph-compiled")))

    panel = cells.nth(2).locator(".nbgrad-panel").first
    panel.wait_for(state="visible", timeout=120_000)
    tabs = panel.locator(".nbg-tab")
    assert "graph" in tabs.all_inner_texts(), tabs.all_inner_texts()
    tabs.filter(has_text="graph").click()
    ran = panel.locator(".nbg-card img").first
    ran.wait_for(state="visible", timeout=30_000)
    _drawn(ran)
    svg = _svg_of(ran)
    # The run order: line 3 waited in the forward pass and was woken by hs.grad in backward pass 0.
    assert "woken by hs.grad" in svg or "hs.grad" in svg
    assert "backward pass 0" in svg, svg[:400]
    ran.screenshot(path=str(screenshot_path("lab-hookgraph-run-tab")))


def screenshot_path(name: str):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / f"{name}.png"


def test_graph_option_and_graph_tab_survive_a_saved_notebook(lab, lab_root, page, browser):
    write_notebook(lab_root / "hookgraph.ipynb", [SETUP, GRAPH, RUN])
    open_notebook(page, lab, "hookgraph.ipynb")
    wait_for_kernel_idle(page)
    run_all_cells(page)
    _check_pictures(page)
    screenshot(page, "lab-hookgraph")
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    saved = json.loads((lab_root / "hookgraph.ipynb").read_text())
    kinds = [set(output.get("data", {})) for cell in saved["cells"] for output in cell.get("outputs", [])]
    assert any("image/svg+xml" in kind for kind in kinds), kinds
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")

    no_kernels = Lab(lab_root, ["--KernelSpecManager.allowed_kernelspecs=none"])
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()           # a page that never saw the first server
    try:
        open_without_a_kernel(page, no_kernels, "hookgraph.ipynb")
        _check_pictures(page)
        screenshot(page, "lab-hookgraph-no-kernel")
    finally:
        context.close()
        no_kernels.stop()
