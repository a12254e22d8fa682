"""The live widget behind a panel: which front ends get one, and how many a long session keeps.

JupyterLab and Notebook 7 draw a panel from its own MIME data with nbgrad's renderer, which is as
interactive as the widget and needs no kernel, so there the display bundle carries no widget. VS Code,
Google Colab and marimo draw widgets but not nbgrad's MIME type: they get the anywidget as well (the
static HTML and text stay in the bundle for every other reader). A widget only where one is
needed also keeps `jupyter nbconvert --to html` on the static picture: nbconvert prefers a widget view
whose state the notebook saved (`nbconvert --execute` and nbclient save it by default) over the
bundle's HTML, and the script that would draw it comes from a CDN.

Each cell keeps only the widgets of its latest run: running it again closes the earlier ones. At most
MAX_LIVE panel widgets stay open in a session; beyond that the oldest close (their outputs go blank).
"""
from __future__ import annotations

import os
import sys
from collections import OrderedDict

LIVE_WIDGET = None      # None: only where the front end needs it (see widget_front_end); True: always; False: never
MAX_LIVE = 64

_live: OrderedDict = OrderedDict()      # id(widget) -> (widget, cell, execution)


def wants_widget(shell=None) -> bool:
    """Whether a panel's display bundle should carry the live widget."""
    if LIVE_WIDGET is not None:
        return bool(LIVE_WIDGET)
    return widget_front_end(shell if shell is not None else _shell()) is not None


def widget_front_end(shell=None, modules=None, environ=None) -> str | None:
    """The front end that draws widgets but not nbgrad's MIME type, from the marks it leaves in the kernel:
    "vscode", "colab", "marimo", or None (JupyterLab, Notebook 7, nbconvert, a terminal)."""
    modules = sys.modules if modules is None else modules
    environ = os.environ if environ is None else environ
    if shell is not None and "__vsc_ipynb_file__" in getattr(shell, "user_ns", {}):
        return "vscode"             # VS Code's Jupyter extension binds this name in every kernel it runs
    if "google.colab" in modules or "COLAB_RELEASE_TAG" in environ:
        return "colab"              # Colab's runtime imports google.colab and sets this variable
    if _marimo_running(modules):
        return "marimo"
    return None


def _marimo_running(modules) -> bool:
    """marimo's kernel has marimo loaded, and `marimo.running_in_notebook()` says it is running the cell
    (False where marimo is only imported, in a script or another kernel)."""
    marimo = modules.get("marimo")
    try:
        return bool(marimo.running_in_notebook()) if marimo is not None else False
    except Exception:           # an older marimo without it, or a stand-in module
        return False


def track(widget, shell=None) -> None:
    """Keep `widget` open; close the widgets of earlier runs of the same cell, and the oldest past MAX_LIVE."""
    cell, execution = current_execution(shell if shell is not None else _shell())
    if cell is not None:
        for key, (_, old_cell, old_execution) in list(_live.items()):
            if old_cell == cell and old_execution != execution:
                _close(key)
    _live[id(widget)] = (widget, cell, execution)
    while len(_live) > MAX_LIVE:
        _close(next(iter(_live)))


def current_execution(shell) -> tuple:
    """(cell, execution) of the request the kernel is running: the front end's cell id (JupyterLab,
    Notebook 7 and VS Code send one) or else the cell's code, and the request's message id."""
    kernel = getattr(shell, "kernel", None)
    try:
        parent = kernel.get_parent() or {}
    except Exception:           # no kernel (plain IPython), or one without per-request parents
        return None, None
    metadata, content = parent.get("metadata") or {}, parent.get("content") or {}
    cell = metadata.get("cellId") or content.get("code")
    return cell, (parent.get("header") or {}).get("msg_id")


def live_count() -> int:
    return len(_live)


def close_all() -> None:
    for key in list(_live):
        _close(key)


def _close(key) -> None:
    widget = _live.pop(key)[0]
    widget.close()


def _shell():
    """The running IPython shell, if any. Views never import IPython (only `notebook/` does): a kernel
    that runs one has it loaded already, and outside one there is no shell to ask."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None
