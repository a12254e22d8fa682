"""A notebook executed headless keeps static pictures of its panels: an nbconvert HTML export shows them."""
import json

import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter


def test_html_export_shows_the_static_panel(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("%load_ext nbgrad\nimport nbgrad\nmodel = nbgrad.load_model()"),
        nbformat.v4.new_code_cell('%%trace model "Hi <script>alert(1)</script>"\n'
                                  "hidden_state = model.transformer.h[1].output.save()\n"
                                  "logits = model.output.logits.save()"),
    ]
    # JupyterLab saves no widget state by default; the export then falls back to the static HTML.
    NotebookClient(notebook, timeout=120, kernel_name="python3", store_widget_state=False,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = notebook.cells[1].outputs
    assert outputs and "application/vnd.nbgrad.panel+json" in outputs[0]["data"]
    body, _ = HTMLExporter().from_notebook_node(notebook)
    assert "hidden_state" in body and "logits" in body
    assert body.count('src="data:image/png;base64,') >= 4     # heatmap and histogram of each
    assert "<script>alert(1)</script>" not in body


def _export(tmp_path, cells):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    # nbclient's default, as `jupyter nbconvert --execute`: the state of every widget is saved.
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return notebook, HTMLExporter().from_notebook_node(notebook)[0]


def test_export_keeps_the_static_picture_when_widget_state_is_saved(tmp_path):
    setup = "%load_ext nbgrad\nimport torch"
    show = "%show torch.arange(6.0).reshape(2, 3)"
    notebook, body = _export(tmp_path, [setup, show])
    assert body.count('src="data:image/png;base64,') == 3       # the heatmap, its colour bar, the histogram
    # Why the bundle carries no widget in JupyterLab: where it does, nbconvert draws the widget view
    # from the saved state instead (a script from a CDN, nothing offline) and drops the picture.
    notebook, body = _export(tmp_path, [setup + "\nimport nbgrad.views.live as live\nlive.LIVE_WIDGET = True", show])
    assert "application/vnd.jupyter.widget-state+json" in json.dumps(notebook.metadata)
    assert 'src="data:image/png;base64,' not in body and "application/vnd.jupyter.widget-view+json" in body
