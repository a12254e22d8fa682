"""JupyterLab's dark theme (and its light one), chosen in its settings: the sidebar's notes (a module's gradient
shape, a touched row) and a panel's parts (tabs, kind chips, stats, a NaN count, axis captions) keep a WCAG AA text
contrast of 4.5:1 against what they are drawn on, as does every text of every panel kind in the dark theme; the
screenshots under artifacts/screenshots/ (dark-*.png, light-*.png) show them."""
import json
import urllib.request

import pytest

from labtools import ARTIFACTS, TOKEN, run_notebook, screenshot, show_sidebar
from visualtools import CELLS

SETUP = "%load_ext nbgrad\nimport torch, nbgrad\nmodel = nbgrad.load_model()"
TRACE = ('%%trace model "The Eiffel Tower is in the city of"\n'
         "hs = model.transformer.h[1].output.save()\n"
         "with model.output.logits[0, -1].max().backward():\n"
         "    g = hs.grad.save()\n"
         "    w = model.transformer.h[1].mlp.c_fc.output.grad.save()")
BAD = "nbgrad.show(torch.tensor([[1.0, float('nan')], [2.0, -3.0]]), 'bad')"
THEMES = "/lab/api/settings/@jupyterlab/apputils-extension:themes"
SIDEBAR = ["#nbgrad-sidebar .nbgrad-grad", "#nbgrad-sidebar .nbgrad-touched .nbgrad-node",
           "#nbgrad-sidebar .nbgrad-touched .nbgrad-type", "#nbgrad-sidebar .nbgrad-touched .nbgrad-params",
           "#nbgrad-sidebar .nbgrad-shape", "#nbgrad-sidebar .nbgrad-status"]
PANEL = [".nbg-title", ".nbg-tab", ".nbg-tab.nbg-active", ".nbg-name", ".nbg-kind", ".nbg-kind.nbg-gradient",
         ".nbg-summary", ".nbg-stats td", ".nbg-legend span", ".nbg-axes", ".nbg-hover", ".nbg-footer", ".nbg-bad"]

# An element's text colour and the colour under it, each as the page paints it: the
# backgrounds from the first opaque one around the element up to its own are laid on a canvas, one over the
# other, and the text colour over them (so a translucent shade or text colour counts as it is seen), then the
# WCAG contrast ratio of the two. Any CSS colour form (rgb(), color(srgb ...) from color-mix) is read by the canvas.
CONTRAST_OF = """node => {
  const ctx = Object.assign(document.createElement('canvas'), {width: 1, height: 1}).getContext('2d');
  const paint = colours => { ctx.clearRect(0, 0, 1, 1);
    for (const c of colours) { ctx.fillStyle = c; ctx.fillRect(0, 0, 1, 1); }
    return [...ctx.getImageData(0, 0, 1, 1).data]; };
  const lum = rgb => rgb.slice(0, 3)
    .map(x => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; })
    .reduce((t, x, i) => t + x * [0.2126, 0.7152, 0.0722][i], 0);
  const backs = [];
  for (let n = node; n; n = n.parentElement) {
    backs.unshift(getComputedStyle(n).backgroundColor);
    if (paint([backs[0]])[3] === 255) break;
  }
  const back = paint(backs), text = paint([...backs, getComputedStyle(node).color]);
  const [a, b] = [lum(text), lum(back)];
  return {ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), text: text.slice(0, 3), back: back.slice(0, 3)};
}"""
CONTRASTS = f"""selectors => {{ const of = {CONTRAST_OF};
  return Object.fromEntries(selectors.map(s => {{ const n = document.querySelector(s); return [s, n && of(n)]; }}));
}}"""
# Every shown element with text of its own inside `root`, with the text's contrast where it is under 4.5:1.
LOW_IN = f"""root => {{ const of = {CONTRAST_OF};
  return [...root.querySelectorAll('*')].filter(n => n.getClientRects().length
      && [...n.childNodes].some(c => c.nodeType === 3 && c.textContent.trim()))
    .map(n => ({{...of(n), what: `${{n.tagName.toLowerCase()}}.${{n.className}}: ${{n.textContent.slice(0, 40)}}`}}))
    .filter(found => found.ratio < 4.5); }}"""


def _set_theme(lab, theme: str):
    """The theme as a user setting (what Settings > Theme writes), through the server's settings API."""
    body = json.dumps({"raw": json.dumps({"theme": theme})}).encode()
    request = urllib.request.Request(f"{lab.url}{THEMES}?token={TOKEN}", data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).close()


@pytest.fixture(params=[("JupyterLab Dark", "dark"), ("JupyterLab Light", "light")], ids=["dark", "light"])
def themed(lab, request):
    """(the server, the theme's short name) with the theme chosen in the user's settings before the page opens."""
    _set_theme(lab, request.param[0])
    yield lab, request.param[1]
    _set_theme(lab, "JupyterLab Light")          # the session's server: the next test opens in the light theme


def _low(contrasts: dict) -> dict:
    missing = [s for s, found in contrasts.items() if found is None]
    assert not missing, f"not on the page: {missing}"
    return {s: found for s, found in contrasts.items() if found["ratio"] < 4.5}


def test_the_sidebar_and_a_panel_read_in_either_theme(themed, page):
    lab, theme = themed
    run_notebook(page, lab, f"{theme}.ipynb", [SETUP, TRACE, BAD])
    page.wait_for_function("l => document.body.dataset.jpThemeLight === l", arg=str(theme == "light").lower(),
                           timeout=60_000)
    show_sidebar(page)
    page.wait_for_function("() => { document.querySelectorAll('#nbgrad-sidebar details').forEach(d => d.open = true);"
                           " const g = document.querySelector('#nbgrad-sidebar .nbgrad-grad');"
                           " return !!g && g.offsetParent !== null; }", timeout=60_000)
    page.wait_for_selector(".jp-OutputArea .nbgrad-panel .nbg-bad", timeout=120_000)
    assert _low(page.evaluate(CONTRASTS, SIDEBAR)) == {}
    panel = page.locator(".jp-OutputArea .nbgrad-panel").first
    panel.locator(".nbg-tab", has_text="hs").click()                   # hs with its gradient g beside it
    page.wait_for_selector(".jp-OutputArea .nbgrad-panel .nbg-kind.nbg-gradient", timeout=30_000)
    assert _low(page.evaluate(CONTRASTS, [f".jp-OutputArea .nbgrad-panel {s}" for s in PANEL])) == {}
    page.locator("#nbgrad-sidebar .nbgrad-grad").first.scroll_into_view_if_needed()
    screenshot(page, f"{theme}-sidebar")
    panel.scroll_into_view_if_needed()
    screenshot(page, f"{theme}-panel")


@pytest.fixture
def dark(lab):
    _set_theme(lab, "JupyterLab Dark")
    yield lab
    _set_theme(lab, "JupyterLab Light")


def test_every_panel_kind_reads_in_the_dark_theme(dark, page):
    """Each panel kind of the visual check: all of its text at 4.5:1 or more on what it is drawn on, and its
    screenshot under artifacts/screenshots/dark-KIND.png."""
    run_notebook(page, dark, "dark-kinds.ipynb", [cell for _, cell in CELLS])
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=60_000)
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    low = {}
    for index, (kind, _) in enumerate(CELLS):
        if kind:
            output = cells.nth(index).locator(".jp-OutputArea")
            output.scroll_into_view_if_needed()
            output.screenshot(path=str(ARTIFACTS / f"dark-{kind}.png"))
            low.update({kind: found for found in [output.evaluate(LOW_IN)] if found})
    (ARTIFACTS / "dark-low-contrast.json").write_text(json.dumps(low, indent=1))     # what fell short, to read
    assert low == {}, sorted(low)
