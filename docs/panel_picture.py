"""Draws docs/images/panel.png, the picture of a panel on the README and the site's front page: a `%%trace` cell
on the embedded model, its panel's static HTML (what a saved notebook or an export shows) shot in headless
Chromium. `make docs-picture` runs it; the result is committed, so a clone shows it without building anything."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
CHROMIUM = os.environ.get("NBGRAD_CHROMIUM", "/usr/bin/chromium")     # as the browser tests find it
CELL = """%%trace model "The Eiffel Tower is in the city of"
hs = model.transformer.h[1].output.save()
with model.output.logits[0, -1].max().backward():
    g = hs.grad.save()"""


def panel_html() -> str:
    import torch
    from IPython.core.interactiveshell import InteractiveShell
    torch.manual_seed(0)
    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("nbgrad")
    shell.run_cell("import nbgrad\nmodel = nbgrad.load_model()", store_history=False)
    shown = []
    shell.display_pub.publish = lambda data, **kwargs: shown.append(data)
    result = shell.run_cell(CELL, store_history=False)
    result.raise_error()
    return next(data["text/html"] for data in shown if "text/html" in data and "nbgrad-static" in data["text/html"])


def shoot(html: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 600}, device_scale_factor=1)
        page.set_content(f'<!DOCTYPE html><body style="margin:12px;background:white">{html}</body>')
        # The page as wide as the panel's widest part (the hook graph): the picture holds all of it, never a
        # scrollbar or a part cut at the viewport's edge.
        wide = page.evaluate("() => Math.max(...[...document.querySelectorAll('.nbgrad-static *')]"
                             ".map(e => e.getBoundingClientRect().right))")
        page.set_viewport_size({"width": max(900, int(wide) + 24), "height": 600})
        box = page.locator(".nbgrad-static").bounding_box()         # with a margin of white round it
        page.screenshot(path=str(out), full_page=True, clip={"x": box["x"] - 8, "y": box["y"] - 8,
                                                             "width": box["width"] + 16, "height": box["height"] + 16})
        browser.close()


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images" / "panel.png"
    shoot(panel_html(), target)
    print(f"wrote {target}")
