"""A course hands out exported notebooks: `jupyter nbconvert --to html` of an executed notebook, opened
with the network off, shows every panel's static picture (the one the notebook already holds)."""
import re
import subprocess
import sys

from exporttools import executed_notebook, panel_outputs
from labtools import ARTIFACTS


def test_html_export_shows_each_static_picture_offline(browser, tmp_path):
    notebook = executed_notebook()
    outputs = panel_outputs(notebook)
    assert len(outputs) == 3
    assert all("application/vnd.jupyter.widget-view+json" not in o["data"] for o in outputs)
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(notebook),
                    "--output-dir", str(tmp_path)], check=True, capture_output=True, timeout=180)
    exported = tmp_path / "executed.html"
    html = exported.read_text()
    for output in outputs:             # the notebook's own pictures, as it saved them
        pngs = re.findall(r'src="(data:image/png;base64,[^"]+)"', output["data"]["text/html"])
        assert pngs and all(png in html for png in pngs)

    context = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})
    asked = []

    def network(route):                 # the file itself loads; everything else would be the network
        if route.request.url.startswith("file:"):
            return route.continue_()
        asked.append(route.request.url)
        return route.abort()
    context.route("**/*", network)
    try:
        page = context.new_page()
        page.goto(exported.as_uri(), wait_until="load")
        panels = page.locator(".nbgrad-static")
        assert panels.count() == 3
        pictures = page.evaluate("""() => [...document.querySelectorAll('.nbgrad-static')].map(panel =>
            [...panel.querySelectorAll('img')].map(img => img.complete && img.naturalWidth > 0))""")
        # heatmap, its colour bar and histogram of g, early, h; of logits; of the %show tensor; each trace's hook graph
        assert [len(p) for p in pictures] == [10, 4, 3] and all(all(p) for p in pictures), pictures
        first = panels.nth(0).inner_text()
        assert "early" in first and "gradient of model.transformer.h[0].output" in first
        assert panels.nth(1).locator("table").count() >= 2                     # stats and top-k tokens
        assert not any("html-manager" in url or "jupyter-widgets" in url for url in asked), asked
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "export-offline.png"), full_page=False)
    finally:
        context.close()
