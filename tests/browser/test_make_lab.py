"""`make lab` as a user meets it: the server it starts may reach the hub (the environment it gives the
kernel has no offline switch), and running and saving a tutorial there leaves `git status` as it was."""
import hashlib
import os
import shutil
import subprocess
import time

from exporttools import REPO, PANEL_MIME, Server, kernel_expression, server_args
from labtools import TOKEN, _free_port, run_command, screenshot, wait_for_kernel_idle

OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
CHECK = ("import os, huggingface_hub.constants as hub",     # transformers 5 asks huggingface_hub
         "[os.environ.get(k) for k in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE')]"
         " + [hub.HF_HUB_OFFLINE, hub.is_offline_mode()]")


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout


def _examples() -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((REPO / "examples").glob("*.ipynb"))}


def _user_env() -> dict:
    """The shell a user types `make lab` in: no offline switch, not inside another make."""
    drop = {*OFFLINE, "MAKEFLAGS", "MAKELEVEL", "MFLAGS"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_make_lab_reaches_the_hub_and_keeps_the_repository_clean(page):
    dry_run = subprocess.run(["make", "-n", "lab-server"], cwd=REPO, env=_user_env(), check=True,
                             capture_output=True, text=True).stdout
    assert "jupyter lab" in dry_run and "OFFLINE" not in dry_run
    status, examples = _git_status(), _examples()
    port = _free_port()
    work = REPO / "notebooks" / f"browser-test-{port}"         # beside a user's own working copy
    created_parent = not work.parent.exists()
    args = [a for a in server_args(port) if a not in ("--allow-root", "--ip=127.0.0.1")]   # the Makefile gives those
    args.append("--LabApp.expose_app_in_browser=True")
    server = None
    try:
        server = Server(["make", "--no-print-directory", "lab-server", f"LAB_DIR={work}",
                         f"LAB_ARGS={' '.join(args)}"], cwd=REPO, port=port, env=_user_env(),
                        log=REPO / "artifacts" / f"make-lab-{port}.log")
        assert sorted(p.name for p in work.glob("*.ipynb")) == sorted(examples)
        name = sorted(examples)[0]
        page.goto(f"{server.url}/lab/tree/{name}?token={TOKEN}&reset")
        page.wait_for_selector(".jp-Notebook", timeout=120_000)
        wait_for_kernel_idle(page)
        assert kernel_expression(page, *CHECK) == "[None, None, False, False]"
        run_command(page, "notebook:run-all-cells")
        page.wait_for_selector(".jp-OutputArea .nbgrad-panel", timeout=240_000)
        wait_for_kernel_idle(page, timeout=240_000)
        run_command(page, "docmanager:save")
        deadline = time.time() + 60
        while PANEL_MIME not in (work / name).read_text() and time.time() < deadline:
            time.sleep(0.5)
        assert PANEL_MIME in (work / name).read_text()          # the run was saved, in the working copy
        assert _git_status() == status and _examples() == examples
        screenshot(page, "make-lab-saved")
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
        if created_parent and work.parent.exists() and not any(work.parent.iterdir()):
            work.parent.rmdir()
