"""The sidebar shows "1 edit on" beside a model after `%%edit`, the edit's cell line and body in its tooltip, and
drops the note after the edit's `.remove()`."""
from labtools import run_command, run_notebook, screenshot, wait_for_kernel_idle

SETUP = "%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()"
EDIT = "%%edit model --out steer\nmodel.transformer.h[0].attn.source.self_c_attn_1.output[:] *= 0.5"
NOTE = '.nbgrad-node-row[data-path="model"] .nbgrad-edits'


def test_the_edits_note_comes_with_an_edit_and_goes_with_its_removal(lab, page):
    run_notebook(page, lab, "edits.ipynb", [SETUP, EDIT, ""])
    page.evaluate("() => window.jupyterapp.shell.activateById('nbgrad-sidebar')")
    note = page.locator(NOTE)
    note.wait_for(timeout=60_000)
    assert note.inner_text() == "1 edit on"
    assert note.get_attribute("title") == ("%%edit model --out steer: "
                                           "model.transformer.h[0].attn.source.self_c_attn_1.output[:] *= 0.5")
    screenshot(page, "sidebar-edits-on")

    old_row = page.locator('.nbgrad-node-row[data-path="model"]').element_handle()
    page.evaluate("() => { const n = window.jupyterapp.shell.currentWidget.content;"
                  " n.widgets[2].model.sharedModel.setSource('steer.remove()'); n.activeCellIndex = 2; }")
    run_command(page, "notebook:run-cell")
    wait_for_kernel_idle(page)
    # A reply asked for before the removal may rebuild the tree first: wait for the rebuild that drops the note.
    page.locator(NOTE).wait_for(state="detached", timeout=30_000)
    page.wait_for_function("old => !old.isConnected", arg=old_row, timeout=30_000)    # the tree was rebuilt
    page.locator('.nbgrad-node-row[data-path="model"]').wait_for(timeout=30_000)     # and still lists the model
    assert page.locator(NOTE).count() == 0
    screenshot(page, "sidebar-edits-off")
