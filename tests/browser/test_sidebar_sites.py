"""The sidebar lists a module's sites when asked (its "sites" button), and a click on a site inserts
`PATH.source.NAME.output` at the cursor. The list stays after a cell, whether the tree is kept (no model changed)
or rebuilt, and a second click on the button hides it."""
from labtools import run_cell_for_sidebar, run_notebook, screenshot, show_sidebar

SETUP = "%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()"


def test_a_modules_sites_are_listed_on_a_click(lab, page):
    run_notebook(page, lab, "sites.ipynb", [SETUP, ""])
    show_sidebar(page)
    row = '.nbgrad-node-row[data-path="model.transformer.h[0].attn"]'
    page.wait_for_selector('.nbgrad-node[data-path="model.transformer.h[0]"]', state="attached", timeout=60_000)
    # Open every branch until the row's button shows (the tree is built when the kernel's reply comes).
    page.wait_for_function(
        "row => { document.querySelectorAll('#nbgrad-sidebar details').forEach(d => d.open = true);"
        " const b = document.querySelector(row + ' .nbgrad-sites-button'); return !!b && b.offsetParent !== null; }",
        arg=row, timeout=30_000)
    assert page.locator(".nbgrad-sites").count() == 0          # nothing is asked for until the click
    page.locator(f"{row} .nbgrad-sites-button").click()
    sites = page.locator('.nbgrad-sites[data-path="model.transformer.h[0].attn"] .nbgrad-site')
    _wait_for_sites(page, sites)
    sites.first.scroll_into_view_if_needed()
    screenshot(page, "sidebar-sites")
    names = sites.all_inner_texts()
    assert "self_c_attn_1" in names and "attention_interface_1" in names, names
    page.evaluate("() => window.jupyterapp.shell.currentWidget.content.activeCellIndex = 1")
    sites.filter(has_text="attention_interface_1").first.click()
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.content.widgets[1].model.sharedModel"
                           ".getSource().includes('source.attention_interface_1.output')", timeout=10_000)
    source = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets[1].model.sharedModel"
                           ".getSource()")
    assert source == "model.transformer.h[0].attn.source.attention_interface_1.output"

    # A cell that changes no model keeps the tree, and the list is asked for anew; one that changes a model rebuilds
    # the tree, and the list is still there after it, shown again from the last reply and asked for anew.
    old_row = page.locator(row).element_handle()
    run_cell_for_sidebar(page, 1, "x = 1")
    assert page.evaluate("old => old.isConnected", old_row)
    _wait_for_sites(page, sites)
    run_cell_for_sidebar(page, 1, "model.transformer.h[1].probe = torch.nn.Identity()")
    assert not page.evaluate("old => old.isConnected", old_row)
    _wait_for_sites(page, sites)
    assert "attention_interface_1" in sites.all_inner_texts()
    page.locator(f"{row} .nbgrad-sites-button").click()           # again: hidden
    page.wait_for_function("() => !document.querySelector('.nbgrad-sites')", timeout=10_000)
    old_row = page.locator(row).element_handle()
    run_cell_for_sidebar(page, 1, "del model.transformer.h[1].probe")   # and not brought back by the next rebuild
    assert not page.evaluate("old => old.isConnected", old_row)
    assert page.locator(row).count() == 1
    assert page.locator(".nbgrad-sites").count() == 0

def _wait_for_sites(page, sites):
    """Wait for the listed sites; on a timeout, say what the sidebar showed instead."""
    try:
        sites.first.wait_for(timeout=30_000)
    except Exception as error:
        shown = page.evaluate("() => { const s = document.querySelector('#nbgrad-sidebar');"
                              " return s ? s.innerText.slice(0, 2000) : 'no sidebar'; }")
        raise AssertionError(f"no sites listed; the sidebar showed: {shown!r}") from error
