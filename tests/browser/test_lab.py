"""JupyterLab in headless Chromium: panels render and respond, the sidebar lists the model tree and
inserts paths, magic lines are highlighted, and a saved notebook shows its panels with no kernel."""
import json

from labtools import (Lab, open_notebook, open_without_a_kernel, run_command, run_notebook,
                      screenshot, show_sidebar, wait_for_kernel_idle, write_notebook)

SETUP = "%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()"
TRACE = ('%%trace model "Hello <img src=x onerror=\\"window.nbgradPwned=1\\"> World" --tokenizer nbgrad.tokenizer_for(model)\n'
         "hs = model.transformer.h[1].output.save()\n"
         "logits = model.output.logits.save()\n"
         "with logits.sum().backward():\n"
         "    g = hs.grad.save()")
SHOW = "%show torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0))"


def _panels(page):
    return page.locator(".jp-OutputArea .nbgrad-panel")


def _active_notebook_source(page, index):
    return page.evaluate("i => window.jupyterapp.shell.currentWidget.content.widgets[i].model.sharedModel.getSource()",
                         index)


def test_news_question_is_answered_by_the_settings(lab):
    settings = lab.api("/lab/api/settings/@jupyterlab/apputils-extension:notification")
    assert settings["settings"]["fetchNews"] == "false"


def test_panels_sidebar_highlighting_and_save(lab, lab_root, page):
    run_notebook(page, lab, "trace.ipynb", [SETUP, TRACE, SHOW, ""])
    assert _panels(page).count() >= 2

    # The %%trace panel: every saved value, the gradient beside its activation.
    trace_panel = _panels(page).nth(0)
    tabs = trace_panel.locator(".nbg-tab").all_inner_texts()
    assert "hs + g" in tabs and "logits" in tabs, tabs
    names = trace_panel.locator(".nbg-card .nbg-name").all_inner_texts()
    assert names == ["hs", "g"], names
    assert "gradient" in trace_panel.locator(".nbg-card").nth(1).inner_text()
    trace_panel.locator(".nbg-tab", has_text="logits").click()
    assert trace_panel.locator("table.nbg-topk").count() == 1
    # Labels are text: the prompt's markup shows as characters and never runs.
    assert page.evaluate("() => window.nbgradPwned") is None
    assert page.evaluate("() => document.querySelectorAll('.jp-OutputArea img[src=x]').length") == 0
    assert "img" in trace_panel.inner_text()
    screenshot(page, "lab-trace-panel")

    # The %show panel responds: moving the slider redraws the heatmap.
    show_panel = _panels(page).nth(1)
    canvas = show_panel.locator("canvas.nbg-heatmap-canvas")
    before = canvas.evaluate("c => c.toDataURL()")
    show_panel.locator("input.nbg-slider").evaluate(
        "s => { s.value = '2'; s.dispatchEvent(new Event('input')); }")
    after = canvas.evaluate("c => c.toDataURL()")
    assert before != after
    assert canvas.evaluate("c => c.dataset.sliceKey") == "2"
    show_panel.scroll_into_view_if_needed()
    screenshot(page, "lab-show-panel-slider")

    # The sidebar lists the model tree with the traced shapes; a click inserts the module's path.
    show_sidebar(page)
    page.wait_for_selector('.nbgrad-node[data-path="model.transformer.h[3]"]', state="attached", timeout=60_000)
    sidebar = page.locator("#nbgrad-sidebar")
    text = sidebar.inner_text()
    assert "GPT2LMHeadModel" in text and "params" in text
    page.evaluate("() => document.querySelectorAll('#nbgrad-sidebar details').forEach(d => d.open = true)")
    page.wait_for_function(
        "() => { const b = document.querySelector('.nbgrad-node[data-path=\"model.transformer.h[1]\"]');"
        " return b && b.parentElement.textContent.includes('out [1, ') && b.parentElement.textContent.includes('grad [1, '); }",
        timeout=30_000)
    page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content;"
                  " nb.activeCellIndex = nb.widgets.length - 1; nb.mode = 'edit'; }")
    page.locator('.nbgrad-node[data-path="model.transformer.h[3]"]').click()
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.content.widgets[3].model.sharedModel"
                           ".getSource().includes('model.transformer.h[3].output')", timeout=10_000)
    assert _active_notebook_source(page, 3) == "model.transformer.h[3].output"
    # A branch's ▼ and its row stay on one line, even where the row is wider than the sidebar.
    lines = page.evaluate("() => [...document.querySelectorAll('#nbgrad-sidebar summary')].map(s =>"
                          " s.getBoundingClientRect().height / s.querySelector('.nbgrad-node-row')"
                          ".getBoundingClientRect().height)")
    assert lines and max(lines) < 1.5, lines
    screenshot(page, "lab-sidebar")

    # The magic line is highlighted as a magic; the body keeps Python highlighting.
    editor = page.locator(".jp-Cell").nth(1).locator(".cm-content")
    assert editor.locator(".nbgrad-magic-name").inner_text() == "%%trace"
    assert editor.locator(".nbgrad-magic-arg").inner_text() == "model"
    assert "--tokenizer" in editor.locator(".nbgrad-magic-option").all_inner_texts()
    body_line = editor.locator(".cm-line").nth(3)
    assert body_line.locator("span").count() >= 2, "body line has no Python token highlighting"

    # What JupyterLab saves keeps the static panel beside the widget view.
    run_command(page, "docmanager:save")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    saved = json.loads((lab_root / "trace.ipynb").read_text())
    kinds = {kind for cell in saved["cells"] for output in cell.get("outputs", []) for kind in output.get("data", {})}
    assert "application/vnd.nbgrad.panel+json" in kinds, kinds


def executed_notebook(path, cells):
    """A notebook run by a kernel outside the browser and saved with its outputs, as a user would have it."""
    import nbformat
    from nbclient import NotebookClient
    write_notebook(path, cells)
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
                   ).execute()
    nbformat.write(notebook, path)
    return path


def _styled(panel) -> bool:
    """The panel's stylesheet (nbgrad/views/panel.css) reached the page: its font size and its cards' corners."""
    return panel.evaluate("p => getComputedStyle(p).fontSize === '12px' && "
                          "getComputedStyle(p.querySelector('.nbg-card')).borderTopLeftRadius === '4px'")


def test_saved_notebook_shows_static_panels_without_a_kernel(lab_root, page, browser):
    saved = executed_notebook(lab_root / "static.ipynb", [SETUP, TRACE, SHOW])
    assert "application/vnd.nbgrad.panel+json" in saved.read_text()
    no_kernels = Lab(lab_root, ["--KernelSpecManager.allowed_kernelspecs=none"])
    try:
        open_without_a_kernel(page, no_kernels, "static.ipynb")
        page.wait_for_function("() => document.querySelectorAll('.jp-OutputArea .nbgrad-panel').length >= 2",
                               timeout=60_000)
        kernel = page.evaluate("() => { const w = window.jupyterapp.shell.currentWidget;"
                               " return w.sessionContext.session && w.sessionContext.session.kernel ?"
                               " w.sessionContext.session.kernel.name : null; }")
        assert kernel is None
        names = _panels(page).nth(0).locator(".nbg-card .nbg-name").all_inner_texts()
        assert names == ["hs", "g"]
        assert _styled(_panels(page).nth(0)), "the extension's stylesheet did not style the panel"
        screenshot(page, "lab-saved-notebook-no-kernel")
    finally:
        no_kernels.stop()


def test_widget_renders_without_the_extension_renderer(lab, page):
    """The live panel is a plain anywidget: it renders where only the widget view is given."""
    run_notebook(page, lab, "widget.ipynb", [
        "import torch\nfrom nbgrad.views import show\n"
        "w = show(torch.randn(3, 6, 10, generator=torch.Generator().manual_seed(1)), 'x').widget()\nw"])
    page.wait_for_selector(".jp-OutputArea .nbgrad-panel canvas.nbg-heatmap-canvas", timeout=120_000)
    assert page.locator(".jp-OutputArea .nbgrad-rendered-panel").count() == 0    # not the extension's
    assert _styled(_panels(page).first), "the live panel is not styled"
    canvas = page.locator(".jp-OutputArea canvas.nbg-heatmap-canvas").first
    before = canvas.evaluate("c => c.toDataURL()")
    page.locator(".jp-OutputArea input.nbg-slider").first.evaluate(
        "s => { s.value = '1'; s.dispatchEvent(new Event('input')); }")
    assert canvas.evaluate("c => c.toDataURL()") != before
    screenshot(page, "lab-anywidget")


def test_magic_line_does_not_indent_the_body(lab, lab_root, page):
    write_notebook(lab_root / "typing.ipynb", [""])
    open_notebook(page, lab, "typing.ipynb")
    page.locator(".jp-Cell .cm-content").first.click()
    page.keyboard.type('%%trace model "Hello (world" --no-grad')
    page.keyboard.press("Enter")
    page.keyboard.type("x = 1")
    source = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets[0].model.sharedModel.getSource()")
    assert source == '%%trace model "Hello (world" --no-grad\nx = 1', repr(source)
    editor = page.locator(".jp-Cell .cm-content").first
    assert editor.locator(".nbgrad-magic-name").inner_text() == "%%trace"
    assert editor.locator(".cm-line").nth(1).locator("span").count() >= 1    # `x = 1` highlighted as Python
    screenshot(page, "lab-typing-magic")


def test_backward_cells_are_highlighted(lab, lab_root, page):
    write_notebook(lab_root / "backward.ipynb", [""])
    open_notebook(page, lab, "backward.ipynb")
    page.locator(".jp-Cell .cm-content").first.click()
    page.keyboard.type("%%backward (w * x).sum() --retain-graph -q")
    page.keyboard.press("Enter")
    page.keyboard.type("g = w.grad.save()")
    source = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets[0].model.sharedModel.getSource()")
    assert source == "%%backward (w * x).sum() --retain-graph -q\ng = w.grad.save()", repr(source)
    editor = page.locator(".jp-Cell .cm-content").first
    page.wait_for_selector(".jp-Cell .cm-content .nbgrad-magic-name", timeout=10_000)
    assert editor.locator(".nbgrad-magic-name").inner_text() == "%%backward"
    assert editor.locator(".nbgrad-magic-arg").inner_text() == "(w * x).sum()"
    assert editor.locator(".nbgrad-magic-option").all_inner_texts() == ["--retain-graph", "-q"]
    assert editor.locator(".cm-line").nth(1).locator("span").count() >= 1    # the body highlighted as Python
    screenshot(page, "lab-backward-magic")


def test_sidebar_says_what_is_missing(lab, lab_root, page):
    write_notebook(lab_root / "states.ipynb", ["x = 1", "%load_ext nbgrad", "import nbgrad\nmodel = nbgrad.load_model()"])
    open_notebook(page, lab, "states.ipynb")
    wait_for_kernel_idle(page)
    page.evaluate("() => window.jupyterapp.shell.activateById('nbgrad-sidebar')")
    status = page.locator("#nbgrad-sidebar .nbgrad-status")
    run_command(page, "notebook:run-cell-and-select-next")
    page.wait_for_function("() => document.querySelector('#nbgrad-sidebar .nbgrad-status').textContent"
                           ".includes('%load_ext nbgrad')", timeout=30_000)
    run_command(page, "notebook:run-cell-and-select-next")
    page.wait_for_function("() => document.querySelector('#nbgrad-sidebar .nbgrad-status').textContent"
                           ".includes('No model in the kernel')", timeout=30_000)
    run_command(page, "notebook:run-cell-and-select-next")
    page.wait_for_function("() => document.querySelector('#nbgrad-sidebar .nbgrad-status').textContent"
                           ".includes('1 model')", timeout=60_000)
    assert "GPT2LMHeadModel" in page.locator("#nbgrad-sidebar").inner_text()
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
    page.wait_for_function("() => document.querySelector('#nbgrad-sidebar .nbgrad-status').textContent"
                           ".includes('No kernel')", timeout=30_000)
    assert status.inner_text().startswith("No kernel")
