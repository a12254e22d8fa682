"""The tests hold in a clone of any name: in one whose folder is `nbgrad` (what `git clone` makes), every frame of
torch and transformers under its `.venv/` has `/nbgrad/` in its path, so a test that told nbgrad's frames by that
string would call the model's frames nbgrad's. Here the path-reading tests run from such a clone."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The tests that tell frames apart by their file: nbgrad's own against the model's and torch's.
PATH_READING = ["tests/test_second_pass.py", "tests/test_errors.py", "tests/test_hook_loops.py"]


def _clone_named_nbgrad(tmp_path: Path) -> Path:
    """A copy of this working tree (tracked and new files, not ignored ones) in a folder named `nbgrad`, whose
    `.venv/site` is this environment's site-packages: imported from there, torch's frames lie under `/nbgrad/`."""
    clone = tmp_path / "nbgrad"
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z",
                             "nbgrad", "tests", "pyproject.toml"], cwd=ROOT, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    (clone / ".venv").mkdir()
    (clone / ".venv" / "site").symlink_to(sysconfig.get_paths()["purelib"], target_is_directory=True)
    return clone


def test_the_path_reading_tests_pass_in_a_clone_named_nbgrad(tmp_path):
    clone = _clone_named_nbgrad(tmp_path)
    site = clone / ".venv" / "site"
    probe = subprocess.run([sys.executable, "-c", "import nbgrad, transformers; print(nbgrad.__file__); "
                            "print(transformers.__file__)"], cwd=clone, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": f"{clone}{os.pathsep}{site}"})
    nbgrad_file, transformers_file = probe.stdout.split()
    assert nbgrad_file == str(clone / "nbgrad" / "__init__.py")
    assert clone.name == "nbgrad" and Path(transformers_file).is_relative_to(site)    # a library's frames lie in it
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-o", "addopts=", *PATH_READING], cwd=clone, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": f"{clone}{os.pathsep}{site}", "HF_HUB_OFFLINE": "1",
                               "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
