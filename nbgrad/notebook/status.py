"""`%nbgrad`: what nbgrad sees in this kernel."""
from __future__ import annotations

import json
from pathlib import Path

from .. import __version__
from .. import models
from ..engine.edit.edits import active_edits, edit_hooks

NAME = "nbgrad"


def extension_state() -> str:
    """The JupyterLab extension as JupyterLab finds it from this environment's Jupyter paths: where it is
    installed (first `labextensions` directory that holds it) and whether page_config disables it.
    Read from files, as `jupyter labextension list` does, without starting that command."""
    from jupyter_core.paths import jupyter_path
    package = next((Path(base, NAME, "package.json") for base in jupyter_path("labextensions")
                    if Path(base, NAME, "package.json").is_file()), None)
    if package is None:
        return "not installed"
    try:
        version = json.loads(package.read_text(encoding="utf-8")).get("version", "?")
    except (OSError, ValueError):
        return f"installed at {package.parent}, but its package.json cannot be read"
    disabled = disabled_extensions()
    state = "disabled" if disabled.get(NAME) else "enabled"
    plugins = sorted(name for name, off in disabled.items() if off and name.startswith(f"{NAME}:"))
    notes = [f"version {version}"]
    if version != __version__:
        notes.append(f"the Python package is {__version__}: reinstall nbgrad")
    if plugins:
        notes.append(f"plugins disabled: {', '.join(plugins)}")
    return f"{state} ({'; '.join(notes)}; {package.parent})"


def disabled_extensions() -> dict:
    """`disabledExtensions` merged over every page_config JupyterLab reads, lowest priority first: the
    application settings, then each Jupyter config directory's `labconfig/` (system up to user), as
    jupyter_server's ConfigManager merges them."""
    from jupyter_core.paths import ENV_JUPYTER_PATH, jupyter_config_path
    files = [Path(ENV_JUPYTER_PATH[0], "lab", "settings", "page_config.json")]
    for directory in reversed(jupyter_config_path()):
        labconfig = Path(directory, "labconfig")
        files.extend(sorted(labconfig.glob("page_config.d/*.json")))    # a directory's own file wins
        files.append(labconfig / "page_config.json")
    merged: dict = {}
    for path in files:
        merged.update(_disabled_in(path))
    return merged


def _disabled_in(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() and path.stat().st_size else {}
    except (OSError, ValueError):
        return {}
    disabled = data.get("disabledExtensions", {}) if isinstance(data, dict) else {}
    if isinstance(disabled, list):
        return {name: True for name in disabled if isinstance(name, str)}
    return {k: bool(v) for k, v in disabled.items()} if isinstance(disabled, dict) else {}


def report(namespace: dict) -> str:
    seen = models.models_seen()
    names = {id(v): k for k, v in namespace.items() if not k.startswith("_")}
    listed = ", ".join(f"{names.get(id(m), '?')} ({type(m).__name__})" for m in seen) or "none"
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for model in seen for m in model.modules())
    edits = [(names.get(id(model), '?'), edit) for model in seen for edit in active_edits(model)]
    held = sum(edit_hooks(model) for model in seen)
    return (f"nbgrad {__version__}\n"
            f"JupyterLab extension: {extension_state()}\n"
            f"models seen: {listed}\n"
            f"hooks live: {hooks - held}" + (f" (beside the {held} hooks of the edits below)" if held else "") +
            "\n" + edits_report(edits))


def edits_report(edits: list) -> str:
    """One line per active edit, in the order they apply on each model."""
    if not edits:
        return "edits active: none"
    lines = [f"edits active: {len(edits)} (each stays on its model until its .remove())"]
    lines += [f"  {name}: {edit.summary()}  [{edit.label}]" for name, edit in edits]
    return "\n".join(lines)
