"""Every tutorial in examples/ runs headless, offline, and its assertion cells pass."""
import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))


def _runs(path: Path):
    """A tutorial as a test's parameter. One that writes to a fixed folder (`--out /tmp/...`) runs on the browser
    tests' worker (conftest.py), never beside its own run in JupyterLab, which writes to the same folder; one that
    starts a Ray cluster runs on the Ray tests' worker, never beside another cluster."""
    text = path.read_text()
    code = "".join("".join(cell["source"]) for cell in json.loads(text)["cells"] if cell["cell_type"] == "code")
    group = "lab" if "--out /" in text else "ray" if "ray.init(" in code or "nbgrad.remote(" in code else None
    return pytest.param(path, marks=[pytest.mark.xdist_group(group)] if group else [])


def test_the_tutorials_are_all_there():
    assert [p.name[:3] for p in NOTEBOOKS] == [f"{i:02d}_" for i in range(1, len(NOTEBOOKS) + 1)]
    assert len(NOTEBOOKS) >= 6


@pytest.mark.parametrize("path", [_runs(path) for path in NOTEBOOKS], ids=lambda p: p.stem)
def test_notebook_runs_and_its_checks_pass(path):
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs
              if o.output_type == "error"]
    assert not errors, errors
    assert any("assert" in cell.source for cell in notebook.cells if cell.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_carries_no_outputs(path):
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        assert not cell.get("outputs"), f"{path.name} has outputs: clear them before committing"
    assert path.stat().st_size < 100_000
