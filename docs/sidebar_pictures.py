"""Draws the sidebar's pictures in docs/images/ (sidebar-canonical.png, sidebar-edits.png, sidebar-remote.png): a
notebook run in JupyterLab (the browser tests' server and helpers), the branches folded down to what a picture is
about, and the sidebar shot from the top of one row to the bottom of another, so no row is cut in half at an edge.
The remote model is nbgrad's RemoteModel on a ModelHolder in the kernel's own process (`ray.get` answers at once), as
the browser test of remote models builds it: what the sidebar shows of a model on a cluster, without one.
`make docs-picture` runs it, after docs/panel_picture.py; the results are committed."""
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from labtools import CHROMIUM, CHROMIUM_ARGS, Lab, dismiss_popups, run_notebook  # noqa: E402

SETUP = ("%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()\n"
         "net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())")
REMOTE = ("import ray\nfrom nbgrad.remote.actor import ModelHolder\nfrom nbgrad.remote.handle import RemoteModel\n"
          "class Call:\n    def __init__(self, function): self.remote = function\n"
          "class Here:\n    def __init__(self, holder): self.holder = holder\n"
          "    def __getattr__(self, name): return Call(getattr(self.holder, name))\n"
          "ray.get = lambda answer: answer\n"
          "big = RemoteModel(nbgrad.load_model, {'name': 'shared'}, actor=Here(ModelHolder(nbgrad.load_model)))")
EDIT = "%%edit model --out cut\nmodel.transformer.h[1].mlp.skip(model.transformer.h[1].ln_2.output)"
# picture -> (the branch it is about: open, with every branch on the way; the row at its top, the part at its bottom)
PICTURES = {
    "sidebar-canonical": ("model.transformer.h[3].attn", "model.transformer.h[3]", "model.transformer.h[3].attn"),
    "sidebar-edits": ("model.transformer.h[1]", "model", "model.transformer.h[1].mlp"),
    "sidebar-remote": ("big.transformer", "big", "big.transformer.h"),
}
FOLD = ("p => document.querySelectorAll('#nbgrad-sidebar details').forEach(d => { const own = d.dataset.path;"
        " d.open = p === own || p.startsWith(own + '.') || p.startsWith(own + '['); })")
# the sidebar's left and width, the top of the first row, the bottom of the last part (a branch: its whole box)
CLIP = """([top, bottom]) => {
  const side = document.querySelector('#nbgrad-sidebar').getBoundingClientRect();
  const first = document.querySelector(`#nbgrad-sidebar .nbgrad-node-row[data-path="${top}"]`).getBoundingClientRect();
  const last = document.querySelector(`#nbgrad-sidebar details[data-path="${bottom}"]`).getBoundingClientRect();
  return {x: side.left, y: first.top, width: side.width, height: last.bottom - first.top};    // no row beside them
}"""


def shoot(page, name: str, out: Path) -> None:
    branch, top, bottom = PICTURES[name]
    page.wait_for_function("p => { document.querySelectorAll('#nbgrad-sidebar details').forEach(d => d.open = true);"
                           " const b = document.querySelector(`#nbgrad-sidebar details[data-path=\"${p}\"]`);"
                           " return !!b && b.offsetParent !== null; }", arg=bottom, timeout=60_000)
    page.evaluate(FOLD, branch)
    page.evaluate("t => document.querySelector(`#nbgrad-sidebar .nbgrad-node-row[data-path=\"${t}\"]`)"
                  ".scrollIntoView({block: 'start'})", top)          # the picture's top at the sidebar's top
    dismiss_popups(page)
    page.screenshot(path=str(out / f"{name}.png"), clip=page.evaluate(CLIP, [top, bottom]))


def main(out: Path) -> None:
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as root, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        lab = Lab(Path(root))
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
            run_notebook(page, lab, "sidebar.ipynb", [SETUP, REMOTE, EDIT])
            page.evaluate("() => window.jupyterapp.shell.activateById('nbgrad-sidebar')")
            for name in PICTURES:
                shoot(page, name, out)
                print(f"wrote {out / name}.png")
        finally:
            lab.shut_down_kernels()
            lab.stop()
            browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images")
