"""Helpers for the browser tests of where notebooks live: an executed notebook built once per run,
servers started by a command line (Notebook 7, `make lab-server`) and stopped with their processes."""
import functools
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from labtools import TOKEN, wait_for_server

REPO = Path(__file__).resolve().parents[2]
PANEL_MIME = "application/vnd.nbgrad.panel+json"
CELLS = [
    "%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()",
    # the gradient saved before its activation, and one whose activation has no name
    '%%trace model "The Eiffel Tower is in"\n'
    "with model.output.logits.sum().backward():\n"
    "    g = model.transformer.h[1].output.grad.save()\n"
    "    early = model.transformer.h[0].output.grad.save()\n"
    "h = model.transformer.h[1].output.save()",
    '%%trace model "Hello World"\nlogits = model.output.logits.save()',
    "%show torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0))",
]


@functools.cache
def executed_notebook() -> Path:
    """The cells above run headless by nbclient with its defaults (widget state saved, as
    `jupyter nbconvert --execute` does), written to a file. Built once per test run."""
    directory = Path(tempfile.mkdtemp(prefix="nbgrad-executed-"))
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(directory)}}).execute()
    path = directory / "executed.ipynb"
    nbformat.write(notebook, path)
    return path


def panel_outputs(path: Path) -> list:
    """The display outputs of a saved notebook that hold an nbgrad panel."""
    notebook = nbformat.read(path, as_version=4)
    return [output for cell in notebook.cells for output in cell.get("outputs", [])
            if PANEL_MIME in output.get("data", {})]


class Server:
    """A Jupyter server started by `argv` in its own process group, waited for on `port`."""

    def __init__(self, argv: list, cwd: Path, port: int, env: dict | None = None, log: Path | None = None):
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.log_path = log or Path(tempfile.mkstemp(prefix="nbgrad-server-", suffix=".log")[1])
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        if wait_for_server(self.url, self.process, 120):
            return
        self.stop()
        raise RuntimeError(f"server did not start: {self.log_path.read_text()[-2000:]}")

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def server_args(port: int) -> list:
    args = ["--no-browser", f"--port={port}", "--ip=127.0.0.1", f"--ServerApp.token={TOKEN}",
            "--ServerApp.disable_check_xsrf=True"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")
    return args


def kernel_expression(page, code: str, expression: str, timeout=120_000) -> str:
    """Run `code` in the current notebook's kernel and return `expression`'s text."""
    page.wait_for_function("() => { const w = window.jupyterapp.shell.currentWidget; return w &&"
                           " w.sessionContext.session && w.sessionContext.session.kernel; }", timeout=timeout)
    return page.evaluate("""async ([code, expression]) => {
        const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        const reply = await kernel.requestExecute({code, user_expressions: {value: expression}}).done;
        const found = reply.content.user_expressions.value;
        return found.status === 'ok' ? found.data['text/plain'] : 'error: ' + found.evalue;
    }""", [code, expression])
