"""`make lab` rebuilds only what changed: the extension when one of its sources is newer than the build, the
installed package when the package, the extension or pyproject.toml is newer than the last install, and nothing
when nothing changed (so that `make lab` after `make test` starts the server at once). Checked with `make -n`
on a tree of empty files whose times are set one after the other, as a finished `make install` leaves them."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["labextension/src/index.ts", "labextension/style/index.css", "labextension/tsconfig.json", "package.json",
           "package-lock.json", "nbgrad/views/panel.js", "nbgrad/views/panel.css", "nbgrad/api.py",
           "pyproject.toml", "install.json"]
# What a finished `make install` leaves, oldest first.
BUILT = ["venv/bin/python", "node_modules/.package-lock.json", "venv/.torch", "venv/.tools",
         "nbgrad/labextension/package.json", "venv/.installed"]
NPM_BUILD, PIP_INSTALL, SERVER = "npm run build:prod", "install --no-build-isolation", "jupyter lab"


@pytest.fixture
def tree(tmp_path):
    shutil.copy2(ROOT / "Makefile", tmp_path / "Makefile")
    for when, name in enumerate(SOURCES + BUILT):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path, (1_000_000 + when, 1_000_000 + when))
    return tmp_path


def _planned(tree: Path, changed: str = None) -> str:
    """What `make -n lab` would run, after `changed` (if any) was edited."""
    if changed is not None:
        os.utime(tree / changed, (2_000_000, 2_000_000))
    done = subprocess.run(["make", "-n", "lab", "VENV=venv", "LAB_DIR=work"], cwd=tree, capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if not k.startswith("MAKE")})
    assert done.returncode == 0, done.stderr
    assert SERVER in done.stdout
    return done.stdout


def test_nothing_changed_starts_the_server_without_building(tree):
    planned = _planned(tree)
    assert NPM_BUILD not in planned and PIP_INSTALL not in planned and "npm install" not in planned


@pytest.mark.parametrize("changed", ["labextension/src/index.ts", "labextension/style/index.css",
                                     "nbgrad/views/panel.js", "package.json"])
def test_an_extension_source_changed_rebuilds_and_reinstalls(tree, changed):
    planned = _planned(tree, changed)
    assert NPM_BUILD in planned and PIP_INSTALL in planned
    assert planned.index(NPM_BUILD) < planned.index(PIP_INSTALL) < planned.index(SERVER)


@pytest.mark.parametrize("changed", ["nbgrad/api.py", "pyproject.toml"])
def test_a_package_change_reinstalls_without_rebuilding(tree, changed):
    planned = _planned(tree, changed)
    assert PIP_INSTALL in planned and NPM_BUILD not in planned


def test_each_step_prints_one_line_and_keeps_its_tools_output_in_a_log(tree):
    planned = _planned(tree, "labextension/src/index.ts")
    steps = [line for line in planned.splitlines() if NPM_BUILD in line or PIP_INSTALL in line]
    assert len(steps) == 2
    for line in steps:
        assert 'echo "nbgrad: ' in line and "> build/logs/" in line
