"""Kernel memory and live panel widgets over many displayed `%%trace` cells, in a real kernel.

Run: `python bench/widgets.py [--cells 1000]`. Cells are sent as JupyterLab sends them (an
execute_request whose metadata names the cell), in three sessions:
  - JupyterLab / Notebook 7: the bundle carries no widget (nbgrad's renderer draws the MIME data);
  - VS Code (the kernel has `__vsc_ipynb_file__`), one cell run again and again;
  - VS Code, every run a different cell.
Prints the kernel's resident memory after warm-up and at the end, and the panel widgets alive.
"""
from __future__ import annotations

import argparse
import time

from jupyter_client.manager import start_new_kernel

SETUP = "%load_ext nbgrad\nimport nbgrad\nmodel = nbgrad.load_model()"
CELL = """%%trace model "The capital of France is Paris."
hs = model.transformer.h[1].output.save()
logits = model.output.logits
with logits.sum().backward():
    g = hs.grad.save()
model.zero_grad(set_to_none=True)
"""
PROBE = {"rss": "int(open('/proc/self/statm').read().split()[1]) * __import__('os').sysconf('SC_PAGE_SIZE')",
         "widgets": "sum(isinstance(w, __import__('nbgrad.views.widget').views.widget.PanelWidget) for w in "
                    "__import__('ipywidgets').widgets.widget._instances.values())"}


class Kernel:
    """A python3 kernel driven like a notebook front end: each request names its cell."""

    def __init__(self):
        self.manager, self.client = start_new_kernel(kernel_name="python3")

    def run(self, code: str, cell_id: str, expressions: dict | None = None) -> dict:
        content = {"code": code, "silent": False, "store_history": True, "allow_stdin": False,
                   "user_expressions": expressions or {}, "stop_on_error": True}
        msg = self.client.session.msg("execute_request", content, metadata={"cellId": cell_id})
        self.client.shell_channel.send(msg)
        while True:
            reply = self.client.get_shell_msg(timeout=300)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                break
        self._drain(msg["header"]["msg_id"])
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"cell failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")
        return reply["content"].get("user_expressions", {})

    def _drain(self, msg_id: str) -> None:
        """Read the request's outputs up to its idle status (a front end would draw them)."""
        while True:
            out = self.client.get_iopub_msg(timeout=300)
            if out["parent_header"].get("msg_id") == msg_id and out["msg_type"] == "status" \
                    and out["content"]["execution_state"] == "idle":
                return

    def probe(self) -> dict:
        found = self.run("", "probe", PROBE)
        return {key: int(value["data"]["text/plain"]) for key, value in found.items()}

    def stop(self):
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def session(cells: int, vscode: bool, same_cell: bool, warmup: int = 20) -> dict:
    kernel = Kernel()
    try:
        kernel.run(SETUP + ("\n__vsc_ipynb_file__ = 'bench.ipynb'" if vscode else ""), "setup")
        for i in range(warmup):
            kernel.run(CELL, "cell" if same_cell else f"warm-{i}")
        start = kernel.probe()
        began = time.perf_counter()
        for i in range(cells):
            kernel.run(CELL, "cell" if same_cell else f"cell-{i}")
        seconds = time.perf_counter() - began
        end = kernel.probe()
    finally:
        kernel.stop()
    return {"start_mb": start["rss"] / 2 ** 20, "end_mb": end["rss"] / 2 ** 20, "widgets": end["widgets"],
            "ms_per_cell": seconds / cells * 1e3}


SESSIONS = (("JupyterLab / Notebook 7, different cells", False, False),
            ("VS Code, the same cell re-run", True, True),
            ("VS Code, different cells", True, False))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--session", type=int, choices=range(len(SESSIONS)), action="append",
                        help="run only these sessions (0: JupyterLab, 1: VS Code re-run, 2: VS Code different)")
    args = parser.parse_args(argv)
    print(f"{args.cells} displayed %%trace cells (hs, its gradient) in a kernel; RSS after warm-up -> end")
    for index, (label, vscode, same) in enumerate(SESSIONS):
        if args.session and index not in args.session:
            continue
        r = session(args.cells, vscode, same)
        print(f"  {label:42s} RSS {r['start_mb']:7.1f} -> {r['end_mb']:7.1f} MB ({r['end_mb'] - r['start_mb']:+6.1f})"
              f"   panel widgets alive {r['widgets']:5d}   {r['ms_per_cell']:.0f} ms/cell")


if __name__ == "__main__":
    main()
