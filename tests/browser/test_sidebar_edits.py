"""The sidebar shows "1 edit on" beside a model after `%%edit`, the edit's cell line and body in its tooltip, and
drops the note after the edit's `.remove()`. A cell that changes no model leaves the tree as it is (what is open,
scrolled or hovered stays so); one that changes a model rebuilds it."""
from labtools import run_cell_for_sidebar, run_notebook, screenshot, show_sidebar

SETUP = "%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()"
EDIT = "%%edit model --out steer\nmodel.transformer.h[0].attn.source.self_c_attn_1.output[:] *= 0.5"
NOTE = '.nbgrad-node-row[data-path="model"] .nbgrad-edits'


def test_the_edits_note_comes_with_an_edit_and_goes_with_its_removal(lab, page):
    run_notebook(page, lab, "edits.ipynb", [SETUP, EDIT, ""])
    show_sidebar(page)
    note = page.locator(NOTE)
    note.wait_for(timeout=60_000)
    assert note.inner_text() == "1 edit on"
    assert note.get_attribute("title") == ("%%edit model --out steer: "
                                           "model.transformer.h[0].attn.source.self_c_attn_1.output[:] *= 0.5")
    screenshot(page, "sidebar-edits-on")

    old_row = page.locator('.nbgrad-node-row[data-path="model"]').element_handle()
    run_cell_for_sidebar(page, 2, "x = 1")
    assert page.evaluate("old => old.isConnected", old_row)                         # nothing changed: the tree kept
    run_cell_for_sidebar(page, 2, "steer.remove()")
    assert not page.evaluate("old => old.isConnected", old_row)                     # the tree was rebuilt
    assert page.locator('.nbgrad-node-row[data-path="model"]').count() == 1       # and still lists the model
    assert page.locator(NOTE).count() == 0
    screenshot(page, "sidebar-edits-off")

