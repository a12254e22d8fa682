"""The sidebar lists a module's sites when asked (its "sites" button), and a click on a site inserts
`PATH.source.NAME.output` at the cursor."""
from labtools import run_notebook, screenshot

SETUP = "%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()"


def test_a_modules_sites_are_listed_on_a_click(lab, page):
    run_notebook(page, lab, "sites.ipynb", [SETUP, ""])
    page.evaluate("() => window.jupyterapp.shell.activateById('nbgrad-sidebar')")
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
    sites.first.wait_for(timeout=30_000)
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
