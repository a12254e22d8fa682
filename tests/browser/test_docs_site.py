"""The documentation site as a reader meets it, with the network blocked: every tutorial page shows its panels
(pictures drawn, not empty boxes, each with its footer), and the reference has every magic and public name.

The site is built once for the module, from a copy of docs/ with two tutorials (a whole build executes all ten:
minutes on a busy machine). `NBGRAD_DOCS_SITE=site` checks a site `make docs` built instead, every tutorial."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nbgrad
from exporttools import REPO as REPO_ROOT

QUICK = ("02", "06")          # autograd from scratch (a %%backward cell) and patching with invokes


def _build(tmp: Path) -> Path:
    try:
        import myst_nb  # noqa: F401
    except ImportError:        # `make test` installs the docs extra; a bare `pytest` may lack it
        if os.environ.get("CI") == "true":
            pytest.fail("the docs tools are missing: pip install '.[docs]' (make test installs them)")
        pytest.skip("the docs tools are not installed (pip install '.[docs]')")
    docs = tmp / "docs"
    shutil.copytree(REPO_ROOT / "docs", docs, ignore=shutil.ignore_patterns("_generated", "__pycache__"))
    env = {**os.environ, "NBGRAD_REPO": str(REPO_ROOT), "NBGRAD_DOCS_TUTORIALS": ",".join(QUICK),
           "NBGRAD_DOCS_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
                           "-d", str(tmp / "doctrees"), str(docs), str(tmp / "site")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, _failure(done.stderr)        # -W: a warning fails the build
    return tmp / "site"


def _failure(log: str) -> str:
    """What a failed build said: a failed tutorial's cell and its traceback first (shown with nb_execution_show_tb),
    then the end of the log."""
    start = log.find("CellExecutionError")
    return (log[max(0, start - 500):start + 6000] + "\n...\n" if start >= 0 else "") + log[-3000:]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    built = os.environ.get("NBGRAD_DOCS_SITE")
    if built:
        return Path(built).resolve()
    return _build(tmp_path_factory.mktemp("docs"))


@pytest.fixture(scope="module")
def offline_page(browser):
    """A page that may load files only: every other request is aborted, and listed."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    asked = []

    def network(route):
        if route.request.url.startswith("file:"):
            return route.continue_()
        asked.append(route.request.url)
        return route.abort()
    context.route("**/*", network)
    page = context.new_page()
    page.asked = asked
    yield page
    context.close()


def _tutorials(site: Path) -> list:
    return sorted((site / "_generated" / "tutorials").glob("*.html"))


def test_every_tutorial_page_shows_its_panels_offline(site, offline_page):
    pages = _tutorials(site)
    examples = sorted(p.stem for p in (REPO_ROOT / "examples").glob("*.ipynb"))
    expected = examples if os.environ.get("NBGRAD_DOCS_SITE") else [e for e in examples if e.startswith(QUICK)]
    assert [p.stem for p in pages] == expected
    footers = []
    for path in pages:
        offline_page.goto(path.as_uri(), wait_until="load")
        shown = offline_page.evaluate(PICTURES)
        assert shown["images"] or any(box["pictures"] for box in shown["boxes"]), (path.name, shown)
        assert all(shown["images"]), (path.name, shown)                     # every image drawn
        empty = [box for box in shown["boxes"] if not (box["height"] > 0 and (box["pictures"] or box["text"]))]
        assert not empty, (path.name, empty)                                # no empty box
        footers += offline_page.locator(".cell_output .nbgrad-footer").all_inner_texts()
    assert footers and all(text.startswith(f"nbgrad {nbgrad.__version__} · torch ") for text in footers)
    assert offline_page.asked == [], offline_page.asked


# nbgrad's views in the cells' outputs: its boxes (a panel, a cache, an attention picture, a token heatmap, a
# generation's text and top tokens), with the pictures inside each (images, coloured cells and tokens) and its
# text, and every image of an output, drawn or not.
PICTURES = """() => {
    const outputs = [...document.querySelectorAll('.cell_output')];
    const boxes = outputs.flatMap(o => [...o.querySelectorAll('[class^="nbgrad-"]:not(.nbgrad-footer)')]);
    return {
        boxes: boxes.map(b => ({name: b.className, height: b.getBoundingClientRect().height,
                                pictures: b.querySelectorAll('img, [style*="background"]').length,
                                text: b.innerText.trim().length})),
        images: outputs.flatMap(o => [...o.querySelectorAll('img')])
                       .map(img => img.complete && img.naturalWidth > 0 && img.width > 0),
    };
}"""


def test_the_reference_page_has_every_magic_and_public_name(site, offline_page):
    offline_page.goto((site / "_generated" / "reference.html").as_uri(), wait_until="load")
    headings = offline_page.locator("h3").all_inner_texts()
    public = [name for name in nbgrad.__all__ if name != "__version__"]
    assert [name for name in public if f"nbgrad.{name}" not in [text.strip().rstrip("#").strip() for text in headings]] == []
    for magic in ("%%trace", "%%backward", "%%generate", "%show", "%nbgrad"):
        assert any(magic == text.strip().rstrip("#").strip() for text in headings), (magic, headings)


def test_the_front_page_links_every_guide_page(site, offline_page):
    offline_page.goto((site / "index.html").as_uri(), wait_until="load")
    links = set(offline_page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))"))
    for page in sorted((REPO_ROOT / "docs").glob("*.md")):
        if page.stem != "index":
            assert f"{page.stem}.html" in links, page.name
    assert offline_page.locator("img[src$='panel.png']").evaluate("img => img.naturalWidth > 0")
