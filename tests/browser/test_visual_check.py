"""The visual check: every panel kind (tensor, logits, gradient beside activation, cache with and without grads,
attention pattern and attribution, token attribution, dataset, graph, invokes, generation) rendered in JupyterLab
and in an offline HTML export, each screenshotted under artifacts/screenshots/visual-{lab,export}-KIND.png, and
measured: no text wider than its own box, colour bars beside heatmaps, export heatmap rows at least ROW_PX high,
the badges right, and the sidebar's types, parameter counts and shapes whole at its width."""
import subprocess
import sys

import nbformat
from nbclient import NotebookClient

from labtools import ARTIFACTS, run_notebook, screenshot, show_sidebar
from visualtools import CELLS, KINDS, OVERFLOWING, PICTURES

ROW_PX = 8
TOKENS = 9            # the prompt's tokens: the logits heatmap's rows


def _check_output(output, kind: str, where: str) -> list:
    """Screenshot one cell's output and return its pictures; no text in it may be wider than its box."""
    output.scroll_into_view_if_needed()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    output.screenshot(path=str(ARTIFACTS / f"visual-{where}-{kind}.png"))
    assert output.evaluate(OVERFLOWING) == [], kind
    pictures = output.evaluate(PICTURES)
    assert all(p["height"] > 0 for p in pictures), (kind, pictures)
    return pictures


def test_every_panel_kind_reads_in_lab(lab, page):
    run_notebook(page, lab, "visual.ipynb", [cell for _, cell in CELLS])
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    assert not page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                            has_text="Traceback").count()
    for index, (kind, _) in enumerate(CELLS):
        if kind:
            _check_output(cells.nth(index).locator(".jp-OutputArea"), kind, "lab")
    by_kind = {kind: cells.nth(index).locator(".jp-OutputArea") for index, (kind, _) in enumerate(CELLS) if kind}
    gradient = by_kind["gradient"].locator(".nbgrad-panel")
    badges = dict(zip(gradient.locator(".nbg-name").all_text_contents(), gradient.locator(".nbg-kind").all_text_contents()))
    assert badges == {"h": "activation", "g": "gradient"}
    for kind in ("tensor", "logits", "gradient"):       # each heatmap has its colour bar
        panel = by_kind[kind].locator(".nbgrad-panel")
        assert panel.locator(".nbg-heatmap").count() == panel.locator(".nbg-legend canvas").count() >= 1
    assert by_kind["logits"].locator("table.nbg-topk th").first.text_content() == "position"
    for kind in ("cache", "cache-grads"):
        cache = by_kind[kind].locator(".nbgrad-cache")
        assert cache.locator(".nbgrad-colour-bar").count() == 1
        assert cache.locator(".nbgrad-row-scale").count() == cache.locator("tr").count() - 1
    dataset = by_kind["dataset"].locator(".nbgrad-panel")
    assert dataset.locator(".nbg-tab").all_text_contents() == ["grad", "act"]       # one tab per value, grad's shown
    assert dict(zip(dataset.locator(".nbg-name").all_text_contents(), dataset.locator(".nbg-kind").all_text_contents())) \
        == {"grad": "gradient"}
    _check_sidebar(page)


def _check_sidebar(page):
    """At the sidebar's own width, every type, parameter count, shape and canonical name is whole (never cut at its
    edge), and each branch's row starts on its ▼'s line (a highlighted row too)."""
    show_sidebar(page)
    page.wait_for_selector("#nbgrad-sidebar .nbgrad-type", timeout=60_000)
    page.evaluate("() => document.querySelectorAll('#nbgrad-sidebar details').forEach(d => d.open = true)")
    page.wait_for_selector("#nbgrad-sidebar details details .nbgrad-type", timeout=60_000)
    screenshot(page, "visual-lab-sidebar")
    cut = page.evaluate("""() => { const box = document.querySelector('#nbgrad-sidebar').getBoundingClientRect();
        return [...document.querySelectorAll('#nbgrad-sidebar .nbgrad-type, #nbgrad-sidebar .nbgrad-params,'
                                             + ' #nbgrad-sidebar .nbgrad-shape, #nbgrad-sidebar .nbgrad-canonical')]
            .filter(el => el.getClientRects().length)
            .filter(el => el.getBoundingClientRect().right > box.right + 0.5 || el.scrollWidth > el.clientWidth + 1)
            .map(el => el.textContent); }""")
    names = page.evaluate("() => [...document.querySelectorAll('#nbgrad-sidebar .nbgrad-tree > details > summary "
                          ".nbgrad-node')].map(el => el.textContent)")
    below = page.evaluate("() => [...document.querySelectorAll('#nbgrad-sidebar summary')].filter(s =>"
                          " s.querySelector('.nbgrad-node-row').getBoundingClientRect().top"
                          " - s.getBoundingClientRect().top > 4).map(s => s.parentElement.dataset.path)")
    assert cut == [], cut
    assert below == [], below
    assert names == ["model", "eager"]                  # not the leftovers `module` and `attn_module`


def _export(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for _, source in CELLS]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()
    nbformat.write(notebook, tmp_path / "visual.ipynb")
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(tmp_path / "visual.ipynb"),
                    "--output-dir", str(tmp_path)], check=True, capture_output=True, timeout=300)
    return tmp_path / "visual.html"


def test_every_panel_kind_reads_in_an_offline_export(browser, tmp_path):
    exported = _export(tmp_path)
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    asked = []
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                  else (asked.append(route.request.url), route.abort()))
    try:
        page = context.new_page()
        page.goto(exported.as_uri(), wait_until="load")
        cells = page.locator(".jp-Cell.jp-CodeCell")
        assert cells.count() == len(CELLS)
        by_kind = {}
        for index, (kind, _) in enumerate(CELLS):
            if kind:
                by_kind[kind] = cells.nth(index).locator(".jp-Cell-outputWrapper")
                pictures = _check_output(by_kind[kind], kind, "export")
                heatmaps = [p for p in pictures if p["alt"].startswith("heatmap of")]
                assert all(p["height"] >= ROW_PX for p in heatmaps)
                assert len([p for p in pictures if p["alt"] == "colour bar"]) == len(heatmaps)
        logits = {p["alt"]: p for p in by_kind["logits"].evaluate(PICTURES)}
        assert logits["heatmap of logits"]["height"] >= TOKENS * ROW_PX
        assert by_kind["logits"].locator("table.nbgrad-topk th").first.text_content() == "position"
        assert "histogram" in by_kind["tensor"].inner_text() and "-3." in by_kind["tensor"].inner_text()
        assert "gradient of model.transformer.h[2].output" in by_kind["dataset"].text_content()
        assert "activation" in by_kind["dataset"].text_content()
        graph = by_kind["graph"].locator("img").first.evaluate(
            "img => img.src.includes(';base64,') ? atob(img.src.split(',')[1]) : decodeURIComponent(img.src)")
        assert "the cell was not run" in graph
        assert by_kind["cache-grads"].locator(".nbgrad-colour-bar").count() == 1
        assert not any("jupyter-widgets" in url or "html-manager" in url for url in asked), asked
    finally:
        context.close()
