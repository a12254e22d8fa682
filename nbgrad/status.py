"""`%nbgrad`: what nbgrad sees in this kernel."""
from __future__ import annotations

import re
import subprocess
import sys

from . import __version__, models


def extension_state() -> str:
    """'enabled', 'disabled' or 'not installed', as `jupyter labextension list` reports nbgrad."""
    try:
        out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"],
                             capture_output=True, text=True, timeout=60)
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        return "unknown (jupyter labextension list did not run)"
    for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():
        words = line.split()
        if words[:1] == ["nbgrad"]:
            state = "enabled" if "enabled" in words else "disabled"
            return f"{state}, OK" if "OK" in words else f"{state}, with problems: {line.strip()}"
    return "not installed"


def report(namespace: dict) -> str:
    seen = models.models_seen()
    names = {id(v): k for k, v in namespace.items() if not k.startswith("_")}
    listed = ", ".join(f"{names.get(id(m), '?')} ({type(m).__name__})" for m in seen) or "none"
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for model in seen for m in model.modules())
    return (f"nbgrad {__version__}\n"
            f"JupyterLab extension: {extension_state()}\n"
            f"models seen: {listed}\n"
            f"hooks live: {hooks}")
