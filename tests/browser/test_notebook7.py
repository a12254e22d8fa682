"""The executed notebook in Notebook 7: its saved panels show on opening, and run again with a kernel
the panels are live (tabs, sliders) and drawn by nbgrad's renderer, not a widget."""
import shutil
import sys

from exporttools import Server, executed_notebook, server_args
from labtools import TOKEN, _free_port, dismiss_popups, run_command, screenshot, wait_for_kernel_idle

PANELS = ".jp-OutputArea .nbgrad-panel"


def test_notebook7_shows_the_live_panel(page, tmp_path):
    shutil.copy(executed_notebook(), tmp_path / "executed.ipynb")
    port = _free_port()
    server = Server([sys.executable, "-m", "jupyter", "notebook", *server_args(port),
                     f"--ServerApp.root_dir={tmp_path}", "--JupyterNotebookApp.expose_app_in_browser=True"],
                    cwd=tmp_path, port=port, log=tmp_path / "notebook7.log")
    try:
        page.goto(f"{server.url}/notebooks/executed.ipynb?token={TOKEN}")
        page.wait_for_selector(".jp-Notebook", timeout=120_000)
        assert "/notebooks/executed.ipynb" in page.url and "/lab" not in page.url
        page.wait_for_function(f"() => document.querySelectorAll('{PANELS}').length >= 3", timeout=60_000)
        wait_for_kernel_idle(page)
        page.evaluate("() => document.querySelectorAll('.jp-OutputArea .nbgrad-panel')"
                      ".forEach(p => p.dataset.before = '1')")
        run_command(page, "notebook:run-all-cells")
        page.wait_for_function(         # every panel replaced by one from this kernel's run
            f"() => {{ const p = document.querySelectorAll('{PANELS}');"
            " return p.length >= 3 && [...p].every(x => !x.dataset.before); }", timeout=240_000)
        wait_for_kernel_idle(page, timeout=240_000)
        trace = page.locator(PANELS).nth(0)
        tabs = trace.locator(".nbg-tab").all_inner_texts()
        assert "h + g" in tabs and "early" in tabs, tabs            # the gradient saved first joins h
        assert trace.locator(".nbg-card .nbg-name").all_inner_texts() == ["h", "g"]
        show = page.locator(PANELS).nth(2)
        canvas = show.locator("canvas.nbg-heatmap-canvas")
        before = canvas.evaluate("c => c.toDataURL()")
        show.locator("input.nbg-slider").evaluate("s => { s.value = '2'; s.dispatchEvent(new Event('input')); }")
        assert canvas.evaluate("c => c.toDataURL()") != before and canvas.evaluate("c => c.dataset.sliceKey") == "2"
        assert page.locator(".jp-OutputArea .nbgrad-rendered-panel").count() >= 3      # nbgrad's renderer
        dismiss_popups(page)
        trace.scroll_into_view_if_needed()
        screenshot(page, "notebook7-live-panel")
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
    finally:
        server.stop()
