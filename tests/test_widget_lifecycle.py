"""Panel widgets in a real kernel, driven as a notebook front end drives it (requests name their cell):
none where nbgrad's renderer draws the panel, one per cell where a widget is needed however often the
cell runs, and never more than the session's bound. bench/widgets.py runs 1,000 cells."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import widgets  # noqa: E402

SETUP = "%load_ext nbgrad\nimport torch"
SHOW = "%show torch.arange(12.0).reshape(3, 4)"


@pytest.fixture
def kernel():
    session = widgets.Kernel()
    session.run(SETUP, "setup")
    yield session
    session.stop()


def test_jupyterlab_gets_no_widget(kernel):
    for i in range(3):
        kernel.run(SHOW, f"cell-{i}")
    assert kernel.probe()["widgets"] == 0


def test_rerunning_a_cell_keeps_one_widget_and_the_session_is_bounded(kernel):
    kernel.run("__vsc_ipynb_file__ = 'x.ipynb'\nimport nbgrad.views.live as live\nlive.MAX_LIVE = 3", "setup-2")
    for _ in range(4):
        kernel.run(SHOW, "a")
    assert kernel.probe()["widgets"] == 1
    kernel.run(SHOW + "\n" + SHOW, "b")               # two panels from one run of a cell: both stay
    assert kernel.probe()["widgets"] == 3
    kernel.run(SHOW, "a")                             # a's earlier widget closes, a's new one opens
    assert kernel.probe()["widgets"] == 3
    for i in range(3):
        kernel.run(SHOW, f"c-{i}")
    found = kernel.run("", "probe-2", {"live": "live.live_count()", **widgets.PROBE})
    assert found["live"]["data"]["text/plain"] == "3" and found["widgets"]["data"]["text/plain"] == "3"


def test_a_closed_panel_widget_is_freed(monkeypatch):
    """Closing must free the widget and its payload (anywidget given a file path for `_esm` keeps
    every instance alive through the file watcher's signal)."""
    import gc
    import weakref

    import torch
    from nbgrad.views import live, show
    monkeypatch.setattr(live, "LIVE_WIDGET", True)
    monkeypatch.setattr(live, "MAX_LIVE", 2)
    live.close_all()
    show(torch.ones(2, 3), "first")._repr_mimebundle_()
    first = weakref.ref(next(iter(live._live.values()))[0])
    for _ in range(3):
        show(torch.ones(2, 3), "later")._repr_mimebundle_()
    gc.collect()
    assert live.live_count() == 2 and first() is None
    live.close_all()


def test_the_widget_carries_the_panel_stylesheet():
    """Where nbgrad's extension is missing (VS Code, a lab without it) the widget styles itself: anywidget
    puts `_css` on the page, and panel.js no longer does."""
    from nbgrad.views.widget import PanelWidget
    css = (Path(__file__).resolve().parents[1] / "nbgrad" / "views" / "panel.css").read_text()
    assert PanelWidget._css == css and ".nbgrad-panel .nbg-card {" in css
    assert ".nbgrad-panel" not in PanelWidget._esm


def test_a_panel_opens_its_comm_only_when_a_layout_takes_it():
    """Displayed by itself a panel sends its MIME bundle and opens no comm; placed in an ipywidgets layout
    it is a widget there, its comm opened by the layout, and counted among the session's live widgets."""
    import ipywidgets
    import torch
    from nbgrad.views import live, show
    live.close_all()
    alone = show(torch.ones(2, 3), "alone")
    bundle = alone._repr_mimebundle_()
    assert alone.comm is None and "application/vnd.jupyter.widget-view+json" not in bundle
    inside = show(torch.ones(2, 3), "inside")
    box = ipywidgets.VBox([ipywidgets.IntSlider(), inside])
    assert inside.comm is not None and box.get_state()["children"][1] == f"IPY_MODEL_{inside.model_id}"
    assert inside.payload["items"][0]["name"] == "inside" and live.live_count() == 1
    live.close_all()
    box.close()
