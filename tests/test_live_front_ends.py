"""Which front ends get the live widget beside the static view: VS Code, Google Colab and marimo, read from the
marks each leaves in the kernel; JupyterLab, Notebook 7 and nbconvert get the static view and nbgrad's MIME data."""
import types

import torch

import nbgrad
from nbgrad.views import live
from nbgrad.views.panel import MIME_TYPE

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _marimo(running: bool):
    module = types.ModuleType("marimo")
    module.running_in_notebook = lambda: running
    return module


def test_each_front_end_is_told_apart_by_its_marks():
    vscode_shell = types.SimpleNamespace(user_ns={"__vsc_ipynb_file__": "x.ipynb"})
    plain_shell = types.SimpleNamespace(user_ns={})
    assert live.widget_front_end(vscode_shell, modules={}, environ={}) == "vscode"
    assert live.widget_front_end(plain_shell, modules={"google.colab": object()}, environ={}) == "colab"
    assert live.widget_front_end(plain_shell, modules={}, environ={"COLAB_RELEASE_TAG": "release-colab-1"}) == "colab"
    assert live.widget_front_end(plain_shell, modules={"marimo": _marimo(True)}, environ={}) == "marimo"
    # marimo imported in a Jupyter kernel (not running the cell), no marks at all, no shell: no widget
    assert live.widget_front_end(plain_shell, modules={"marimo": _marimo(False)}, environ={}) is None
    assert live.widget_front_end(plain_shell, modules={"marimo": types.ModuleType("marimo")}, environ={}) is None
    assert live.widget_front_end(plain_shell, modules={}, environ={}) is None
    assert live.widget_front_end(None, modules={}, environ={}) is None


def test_a_panel_under_colab_carries_the_widget_and_keeps_its_static_view(monkeypatch):
    panel = nbgrad.show(torch.arange(6.0).reshape(2, 3), "x")
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delitem(__import__("sys").modules, "google.colab", raising=False)
    assert WIDGET_VIEW not in panel._repr_mimebundle_()
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-20261120")
    try:
        bundle = panel._repr_mimebundle_()
    finally:
        live.close_all()
    assert WIDGET_VIEW in bundle
    assert {MIME_TYPE, "text/html", "text/plain"} <= set(bundle)
    assert "heatmap of x" in bundle["text/html"]


def test_a_panel_under_marimo_carries_the_widget(monkeypatch):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.setitem(__import__("sys").modules, "marimo", _marimo(True))
    try:
        bundle = nbgrad.show(torch.ones(3), "y")._repr_mimebundle_()
    finally:
        live.close_all()
    assert WIDGET_VIEW in bundle and "text/html" in bundle
