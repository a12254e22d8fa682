"""What a newcomer reads in the sidebar: a module named at length ends in an ellipsis at the sidebar's edge, whole in
its tooltip and in what a click inserts; the "N edits on" chip keeps a WCAG AA contrast (4.5:1) in the light and the
dark theme; a module an edit skips says "skipped", and a cell that reads inside it hears that it was skipped."""
from labtools import run_command, run_notebook, screenshot, show_sidebar

LONG = "residual_stream_projection_into_the_sparse_autoencoder_dictionary"
SETUP = ("%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()\n"
         f"net = torch.nn.Sequential()\nnet.add_module({LONG!r}, torch.nn.Linear(2, 3))\n"
         "net.add_module('relu', torch.nn.ReLU())")
EDIT = "%%edit model --out cut\nmodel.transformer.h[1].mlp.skip(model.transformer.h[1].ln_2.output)"
READ = "%%trace model \"The Eiffel Tower is in\"\nfc = model.transformer.h[1].mlp.c_fc.output.save()"
SIDEBAR = "#nbgrad-sidebar"
NOTE = f'{SIDEBAR} .nbgrad-node-row[data-path="model"] > .nbgrad-edits'
SKIPPED = f'{SIDEBAR} .nbgrad-node-row[data-path="model.transformer.h[1].mlp"] > .nbgrad-skipped'
SOURCE = "i => window.jupyterapp.shell.currentWidget.content.widgets[i].model.sharedModel.getSource()"

# The WCAG contrast ratio of an element's text on its own background (opaque, or the first opaque one around it).
CONTRAST = """s => {
  const rgba = c => { const v = c.match(/[\\d.]+/g).map(Number); return v.length > 3 ? v : [...v, 1]; };
  const lum = ([r, g, b]) => [r, g, b].map(x => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; })
    .reduce((t, x, i) => t + x * [0.2126, 0.7152, 0.0722][i], 0);
  const node = document.querySelector(s);
  let back = node;
  while (back && rgba(getComputedStyle(back).backgroundColor)[3] < 1) { back = back.parentElement; }
  const [a, b] = [lum(rgba(getComputedStyle(node).color)), lum(rgba(getComputedStyle(back).backgroundColor))];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


def _open_all(page, selector):
    page.wait_for_function(
        "s => { document.querySelectorAll('#nbgrad-sidebar details').forEach(d => d.open = true);"
        " const b = document.querySelector(s); return !!b && b.offsetParent !== null; }", arg=selector, timeout=60_000)


def _theme(page, name, light):
    run_command(page, "apputils:change-theme", {"theme": name})
    page.wait_for_function("l => document.body.dataset.jpThemeLight === l", arg=str(light).lower(), timeout=30_000)
    page.locator("#jupyterlab-splash").wait_for(state="detached", timeout=30_000)    # shown while the theme loads


def test_long_names_edits_and_skips_are_legible(lab, page):
    run_notebook(page, lab, "legible.ipynb", [SETUP, EDIT, READ, ""])
    show_sidebar(page)
    name = f'{SIDEBAR} .nbgrad-node[data-path="net.{LONG}"]'
    _open_all(page, name)
    _long_name(page, name)
    _edits_and_skip(page)
    assert "never came: GPT2MLP was skipped (`.skip(...)`), so nothing inside it ran" in page.locator(
        ".jp-Cell").nth(2).locator(".jp-OutputArea-output").inner_text()
    for theme, light in (("JupyterLab Light", True), ("JupyterLab Dark", False)):
        _theme(page, theme, light)
        for chip in (NOTE, SKIPPED):
            assert page.evaluate(CONTRAST, chip) >= 4.5, (theme, chip, page.evaluate(CONTRAST, chip))
        _fold_all_but(page, "model.transformer.h[1].mlp")       # both marks in one picture (docs/images/)
        page.locator(NOTE).scroll_into_view_if_needed()
        screenshot(page, f"sidebar-edits-{'light' if light else 'dark'}")


def _fold_all_but(page, path):
    """Close every branch but those on the way to `path` (and it)."""
    page.evaluate("p => document.querySelectorAll('#nbgrad-sidebar details').forEach(d => {"
                  " const own = d.dataset.path; d.open = p === own || p.startsWith(own + '.') || p.startsWith(own + '['); })",
                  path)
    page.locator(SKIPPED).wait_for(state="visible", timeout=10_000)


def _long_name(page, name):
    """Cut with an ellipsis inside the sidebar, whole in the tooltip and in what a click inserts."""
    button = page.locator(name)
    button.scroll_into_view_if_needed()
    shown = page.evaluate("s => { const b = document.querySelector(s), edge = document.querySelector("
                          "'#nbgrad-sidebar').getBoundingClientRect().right; return [getComputedStyle(b).textOverflow,"
                          " b.scrollWidth > b.clientWidth, b.getBoundingClientRect().right <= edge + 0.5]; }", name)
    assert shown == ["ellipsis", True, True], shown
    assert button.get_attribute("title").split("\n")[0] == LONG
    screenshot(page, "sidebar-long-name")
    page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = 3;"
                  " nb.mode = 'edit'; }")
    button.click()
    page.wait_for_function(f"() => ({SOURCE})(3).length > 0", timeout=10_000)
    assert page.evaluate(SOURCE, 3) == f"net.{LONG}.output"


def _edits_and_skip(page):
    assert page.locator(NOTE).inner_text() == "1 edit on"
    skipped = page.locator(SKIPPED)
    assert skipped.inner_text() == "skipped"
    assert skipped.get_attribute("title") == ("skipped at every call (M.skip) by %%edit model --out cut: "
                                              "nothing inside it runs")
    assert page.locator(f"{SIDEBAR} .nbgrad-skipped").count() == 1
