"""The live panel: an anywidget, so it renders in JupyterLab, Notebook 7 and VS Code with no
extension of ours."""
from pathlib import Path

import anywidget
import traitlets

HERE = Path(__file__).resolve().parent


class PanelWidget(anywidget.AnyWidget):
    # The module's text, not its path: for a path anywidget ties every instance to a file watcher's
    # signal, which keeps each widget (and its payload) alive after it is closed.
    _esm = (HERE / "panel.js").read_text(encoding="utf-8")
    _css = (HERE / "panel.css").read_text(encoding="utf-8")
    payload = traitlets.Dict().tag(sync=True)
