"""`pip install .` from a fresh clone builds the extension and leaves the clone as it was: the build
hook's npm step installs from the committed lock without rewriting package-lock.json."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(command: list, cwd: Path, **env) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env})
    assert done.returncode == 0, f"{' '.join(map(str, command))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.build
def test_pip_install_from_a_fresh_clone_leaves_git_status_clean(tmp_path):
    clone = tmp_path / "nbgrad"
    _run(["git", "clone", "--quiet", str(ROOT), str(clone)], tmp_path)
    if (ROOT / "node_modules").is_dir():       # the same packages the lock names, without the network
        shutil.copytree(ROOT / "node_modules", clone / "node_modules", symlinks=True)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch==2.13.0\n")
    # no isolation: the build tools are this environment's (hatchling, hatch-jupyter-builder, jupyter-builder)
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
          "--no-build-isolation", "-c", str(constraints), "--target", str(tmp_path / "site"), "."], clone,
         PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert _run(["git", "status", "--porcelain"], clone) == ""
    built = tmp_path / "site" / "share" / "jupyter" / "labextensions" / "nbgrad"
    assert (built / "package.json").is_file() and list((built / "static").glob("*.js"))
    assert (tmp_path / "site" / "nbgrad" / "views" / "panel.js").is_file()
