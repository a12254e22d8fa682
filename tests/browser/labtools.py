"""Helpers for the browser tests: a JupyterLab server on localhost, notebooks, screenshots."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

# The system Chromium; NBGRAD_CHROMIUM names another (a build unpacked where apt-get cannot install).
CHROMIUM = os.environ.get("NBGRAD_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
TOKEN = "nbgrad-test-token"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]


def require_browser():
    missing = not os.path.exists(CHROMIUM)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = True
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests need {CHROMIUM} and the playwright package (apt-get install chromium)")
        pytest.skip("no system Chromium here; CI installs it and runs these tests")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# JupyterLab asks whether to fetch its news in a toast that covers the page; the answer is a setting.
QUIET_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                  {"fetchNews": "false", "checkForUpdates": False}}


def user_settings_dir() -> str:
    """A settings directory of this server's own (never the user's, never shared with a server beside
    it), with the news question answered."""
    settings = Path(tempfile.mkdtemp(prefix="nbgrad-lab-settings-"))
    for name, values in QUIET_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    return str(settings)


def wait_for_server(url: str, process, timeout: float) -> bool:
    """Poll the server's status until it answers (True), or its process ends or `timeout` s pass (False)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
            return True
        except Exception:
            if process.poll() is not None:
                return False
            time.sleep(0.5)
    return False


class Lab:
    def __init__(self, root: Path, extra_args=()):
        self.root = root
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings_dir = user_settings_dir()
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JUPYTER_PLATFORM_DIRS="1")
        args = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={self.port}", "--ip=127.0.0.1",
                f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
                "--ServerApp.disable_check_xsrf=True", f"--LabApp.user_settings_dir={self.settings_dir}",
                f"--LabApp.workspaces_dir={self.settings_dir}/workspaces", *extra_args]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--allow-root")
        self.log = open(root / f"lab-{self.port}.log", "w")
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=root)
        if wait_for_server(self.url, self.process, 90):
            return
        self.stop()
        raise RuntimeError(f"jupyter lab did not start: {(root / f'lab-{self.port}.log').read_text()[-2000:]}")

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"{self.url}{path}?token={TOKEN}", method=method)
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self):
        """End every session this server runs, so no test finds another's kernel."""
        for session in self.api("/api/sessions"):
            self.api(f"/api/sessions/{session['id']}", method="DELETE")

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={TOKEN}&reset"

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)
        self.log.close()
        shutil.rmtree(self.settings_dir, ignore_errors=True)


def write_notebook(path: Path, cells: list) -> Path:
    notebook = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                           "id": f"cell-{index}", "source": source} for index, source in enumerate(cells)],
                "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                             "language_info": {"name": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(notebook))
    return path


def dismiss_popups(page):
    """A kernel-choice dialog would cover what the screenshot is for. (The news question never comes:
    the server's settings answer it, see QUIET_SETTINGS.) Only the dialog's button: the notebook
    toolbar's kernel name is a "No Kernel" button too, and clicking it opens the dialog."""
    button = page.locator(".jp-Dialog").get_by_role("button", name="No Kernel", exact=True)
    if button.count() and button.first.is_visible():
        button.first.dispatch_event("click")     # a click at its point would land on the dialog's frame
        page.locator(".jp-Dialog").first.wait_for(state="detached", timeout=30_000)


def screenshot(page, name: str):
    dismiss_popups(page)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)


def run_command(page, command: str, args: dict | None = None):
    page.evaluate("([c, a]) => window.jupyterapp.commands.execute(c, a)", [command, args or {}])


def run_all_cells(page, timeout=240_000):
    """Run every cell and wait until none is running and the kernel is idle (a state, not a time)."""
    run_command(page, "notebook:run-all-cells")
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return w.content.widgets.every(c => c.model.type !== 'code' || c.model.executionState !== 'running')"
        " && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status === 'idle'; }", timeout=timeout)


def wait_for_kernel_idle(page, timeout=120_000):
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.status === 'idle'; }", timeout=timeout)


def open_notebook(page, lab: Lab, name: str):
    page.goto(lab.notebook_url(name))
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget", timeout=60_000)


def run_notebook(page, lab: Lab, name: str, cells: list):
    """Write a notebook of `cells` into the server's root, open it, and run every cell (until none is running and
    the kernel is idle)."""
    write_notebook(lab.root / name, cells)
    open_notebook(page, lab, name)
    wait_for_kernel_idle(page)
    run_all_cells(page)


def show_sidebar(page, timeout=60_000):
    """Show the nbgrad sidebar once every request it made for the models is answered (its tree is not aria-busy):
    a reply that comes later would rebuild the tree under the test."""
    page.evaluate("() => window.jupyterapp.shell.activateById('nbgrad-sidebar')")
    page.wait_for_selector('#nbgrad-sidebar .nbgrad-tree[aria-busy="false"]', state="attached", timeout=timeout)


def run_cell_for_sidebar(page, index: int, source: str, timeout=30_000):
    """Run cell `index` as `source`, and wait until the sidebar has answered the request that its run made."""
    tree = "#nbgrad-sidebar .nbgrad-tree"
    answered = int(page.get_attribute(tree, "data-answered") or 0)
    page.evaluate("([i, s]) => { const n = window.jupyterapp.shell.currentWidget.content;"
                  " n.widgets[i].model.sharedModel.setSource(s); n.activeCellIndex = i; }", [index, source])
    run_command(page, "notebook:run-cell")
    wait_for_kernel_idle(page)
    page.wait_for_function("([t, a]) => { const e = document.querySelector(t);"
                           " return +e.dataset.answered > a && e.getAttribute('aria-busy') === 'false'; }",
                           arg=[tree, answered], timeout=timeout)


def open_without_a_kernel(page, lab: Lab, name: str):
    """Open a notebook on a server that has no kernel to give, and answer "No Kernel" when it asks."""
    open_notebook(page, lab, name)
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(state="visible", timeout=60_000)        # which kernel? there is none to choose
    dialog.get_by_role("button", name="No Kernel", exact=True).first.dispatch_event("click")
    dialog.wait_for(state="detached", timeout=30_000)
