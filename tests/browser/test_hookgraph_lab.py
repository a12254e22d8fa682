"""The hook graph, seen in JupyterLab: `%%trace --graph` draws the compiled cell, the panel's "graph" tab
draws the run (a `.grad` read written before the backward line runs inside the backward pass), an invoke
cell's panel has a tab per invoke; all of it stays in the saved notebook, opened again with no kernel.
The pictures' own data is checked: name-labelled arrows, the pass's group, the run's numbered steps."""
import base64
import json
from urllib.parse import unquote

from labtools import ARTIFACTS, Lab, open_without_a_kernel, run_notebook, screenshot
from svgdata import groups, name_arrows, steps

SETUP = "%load_ext nbgrad\nimport nbgrad\nmodel = nbgrad.load_model()"
BODY = ("hs = model.transformer.h[1].output\n"          # the seeds' gradient cell: .grad read before backward
        "g = hs.grad.save()\n"
        "loss = model.output.logits[0, -1].max()\n"
        "loss.backward()")
GRAPH = f'%%trace model "The cat sat on the" --graph\n{BODY}'
RUN = f'%%trace model "The cat sat on the"\n{BODY}'
INVOKES = ("%%trace model\n"
           'with invoke("The cat sat on the mat and looked out of the window"):\n'
           "    a = model.lm_head.output[:, -1].save()\n"
           'with invoke("Paris"):\n'
           "    b = model.lm_head.output[:, -1].save()\n"
           "whole = model.transformer.h[0].output.save()")
INVOKE_TABS = ['invoke 0: "The cat sat on the m…', 'invoke 1: "Paris"', "whole batch", "graph"]


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


def _check_pictures(page, tag: str) -> None:
    """Cell 2's `--graph` picture, cell 3's graph tab, cell 4's invoke tabs, as a person sees them."""
    cells = page.locator(".jp-Notebook .jp-Cell")
    compiled = cells.nth(1).locator(".jp-OutputArea-output img").first
    compiled.wait_for(state="visible", timeout=120_000)
    _drawn(compiled)
    svg = _svg_of(compiled)
    # line 2 waits for `hs` from line 1 and runs inside the backward pass that line 4 starts
    assert name_arrows(svg) == {(0, 1): "hs", (2, 3): "loss"}
    [group] = groups(svg, "nbg-pass")
    assert (group.get("data-start-line"), group.get("data-members")) == ("4", "1")
    compiled.screenshot(path=str(screenshot_path(f"lab-hookgraph-compiled{tag}")))

    panel = cells.nth(2).locator(".nbgrad-panel").first
    panel.wait_for(state="visible", timeout=120_000)
    tabs = panel.locator(".nbg-tab")
    assert tabs.all_inner_texts()[-1] == "graph", tabs.all_inner_texts()
    tabs.filter(has_text="graph").click()
    ran = panel.locator(".nbg-card img").first
    ran.wait_for(state="visible", timeout=30_000)
    _drawn(ran)
    assert ran.evaluate("i => i.clientWidth === i.naturalWidth")      # at its own size: scroll, not shrink
    svg = _svg_of(ran)
    order = steps(svg)                   # the run order: line 2 (node 1) last, in backward pass 0
    assert sorted(order) == list(range(1, len(order) + 1)) and order[len(order)] == (1, "backward pass 0")
    assert [g.get("data-phase") for g in groups(svg, "nbg-legend")][-1] == "backward pass 0"
    ran.screenshot(path=str(screenshot_path(f"lab-hookgraph-run-tab{tag}")))
    _check_invoke_panel(cells.nth(3), tag)


def _check_invoke_panel(cell, tag: str) -> None:
    """One tab per invoke titled with its input, the whole batch's tab, the graph last."""
    panel = cell.locator(".nbgrad-panel").first
    panel.wait_for(state="visible", timeout=120_000)
    tabs = panel.locator(".nbg-tab")
    assert tabs.all_inner_texts() == INVOKE_TABS
    assert "looked out of the window" in tabs.first.get_attribute("title")
    for title, names in zip(INVOKE_TABS, (["a"], ["b"], ["whole"])):
        tabs.filter(has_text=title).click()
        assert panel.locator(".nbg-card .nbg-name").all_inner_texts() == names, title
        if title == INVOKE_TABS[0]:
            assert "looked out of the window" in panel.locator(".nbg-about").inner_text()
            panel.screenshot(path=str(screenshot_path(f"lab-invoke-panel{tag}")))
    tabs.filter(has_text="graph").click()
    picture = panel.locator(".nbg-card img").first
    picture.wait_for(state="visible", timeout=30_000)
    assert "[invoke 0] line 2" in _svg_of(picture) and "[invoke 1] line 4" in _svg_of(picture)
    panel.screenshot(path=str(screenshot_path(f"lab-invoke-graph-tab{tag}")))


def _check_not_shrunk_in_a_narrow_window(page) -> None:
    """In a window narrower than the `--graph` picture, the picture keeps its own size and its output
    scrolls sideways: a person reads it at full size instead of squinting at a shrunk one."""
    size = page.viewport_size
    page.set_viewport_size({"width": 800, "height": size["height"]})
    try:
        compiled = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output img").first
        compiled.scroll_into_view_if_needed()
        page.wait_for_function("i => i.getBoundingClientRect().right > window.innerWidth",
                               arg=compiled.element_handle(), timeout=30_000)
        assert compiled.evaluate("i => i.clientWidth === i.naturalWidth"), "the picture was shrunk to the window"
        output = compiled.locator("xpath=ancestor::*[contains(@class, 'jp-OutputArea-output')][1]")
        assert output.evaluate("o => o.scrollWidth > o.clientWidth && getComputedStyle(o).overflowX !== 'hidden'")
        screenshot(page, "lab-hookgraph-narrow-window")
    finally:
        page.set_viewport_size(size)


def screenshot_path(name: str):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / f"{name}.png"


def test_graph_option_and_graph_tab_survive_a_saved_notebook(lab, lab_root, page, browser):
    run_notebook(page, lab, "hookgraph.ipynb", [SETUP, GRAPH, RUN, INVOKES])
    _check_pictures(page, "")
    screenshot(page, "lab-hookgraph")
    _check_not_shrunk_in_a_narrow_window(page)
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
        _check_pictures(page, "-no-kernel")
        screenshot(page, "lab-hookgraph-no-kernel")
    finally:
        context.close()
        no_kernels.stop()
