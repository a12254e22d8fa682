"""The documentation's reference covers every magic `%load_ext nbgrad` adds and every public name of the
package (docs/generate_pages.py writes it; tests/browser/test_docs_site.py checks the built pages)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import nbgrad

DOCS = Path(__file__).resolve().parents[1] / "docs"
sys.path.insert(0, str(DOCS))
import generate_pages  # noqa: E402


@pytest.fixture(scope="module")
def reference():
    return generate_pages.reference()


def _added_by_the_extension() -> set:
    """The magics `%load_ext nbgrad` adds to a fresh IPython (in a process of its own)."""
    script = ("from IPython.core.interactiveshell import InteractiveShell as S; s = S.instance(); "
              "m = s.magics_manager.magics; before = {k: set(t) for k, t in m.items()}; "
              "s.extension_manager.load_extension('nbgrad'); "
              "print(*[p + n for k, p in (('cell', '%%'), ('line', '%')) for n in set(m[k]) - before[k]])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          cwd=DOCS.parent, timeout=300)
    return set(done.stdout.split())


def test_every_magic_has_its_section_with_its_help(reference):
    magics = _added_by_the_extension()
    assert {"%%trace", "%%backward", "%%generate", "%show", "%nbgrad"} <= magics
    headed = set(re.findall(r"^### `(%%?\w+)`$", reference, re.M))
    assert headed == magics
    trace = reference.split("### `%%trace`")[1].split("### ")[0]
    assert "--no-grad" in trace and "run under torch.no_grad()" in trace       # argparse's help, as %%trace? shows


def test_every_public_name_is_documented_from_its_docstring(reference):
    assert "Run `source` (the body of a `%%trace` cell)" in reference.split("### `nbgrad.trace`")[1]
    public = [name for name in nbgrad.__all__ if name != "__version__"]
    documented = re.findall(r"^### `nbgrad\.(\w+)`$", reference, re.M)
    assert documented == public
    undocumented = [name for name in public if not (getattr(nbgrad, name).__doc__ or "").strip()]
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_the_site_picks_up_every_page_in_docs_by_a_glob():
    index = (DOCS / "index.md").read_text()
    assert re.search(r":glob:\n\ninstall\ntracing\n\*\n", index)
    for page in ("tracing", "invokes", "cache", "sites", "datasets", "panels", "attribution", "instructors",
                 "architecture", "install"):
        assert (DOCS / f"{page}.md").is_file(), page
