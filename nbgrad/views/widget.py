"""The live panel: an anywidget, so it renders in JupyterLab, Notebook 7 and VS Code with no
extension of ours."""
from pathlib import Path

import anywidget
import traitlets

HERE = Path(__file__).resolve().parent


class PanelWidget(anywidget.AnyWidget):
    _esm = HERE / "panel.js"
    payload = traitlets.Dict().tag(sync=True)
