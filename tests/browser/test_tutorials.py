"""Each tutorial, run in JupyterLab: a screenshot of its rendered panels and plots."""
import shutil
from pathlib import Path

import pytest

from labtools import dismiss_popups, open_notebook, run_all_cells, screenshot, wait_for_kernel_idle

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.ipynb")))
def test_tutorial_renders(lab, lab_root, page, name):
    shutil.copy(EXAMPLES / name, lab_root / name)
    open_notebook(page, lab, name)
    wait_for_kernel_idle(page)
    run_all_cells(page, timeout=240_000)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    tracebacks = [e for e in errors if "Traceback" in e or "Error" in e.split("\n")[0]]
    assert not tracebacks, tracebacks[:1]
    pictures = page.locator(".jp-OutputArea .nbgrad-panel, .jp-OutputArea img, .jp-OutputArea .nbgrad-tokens, "
                            ".jp-OutputArea .nbgrad-cache")
    assert pictures.count() >= 1
    dismiss_popups(page)
    pictures.first.scroll_into_view_if_needed()
    screenshot(page, f"tutorial-{Path(name).stem}")
