"""Sphinx settings of nbgrad's documentation site (`make docs` -> site/).

Sphinx + MyST-NB + Furo: the tutorials are notebooks, and MyST-NB executes them with a Jupyter kernel and keeps
every output's MIME bundle, so nbgrad's static panel (HTML with PNG pictures) is what a page shows; the reference
comes from the docstrings through autodoc, as for PyTorch, Captum and Ray; Furo ships its assets (no CDN).
Generated pages (the tutorials' copies, the reference) go to docs/_generated/, ignored by git."""
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("NBGRAD_REPO", DOCS.parent))        # a test builds a copy of docs/ elsewhere
sys.path.insert(0, str(ROOT))          # this checkout's nbgrad, in Sphinx and in the kernels it starts
sys.path.insert(0, str(DOCS))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import generate_pages  # noqa: E402  (docs/generate_pages.py)

generate_pages.write_all(DOCS / "_generated")

project = "nbgrad"
author = "the nbgrad authors"
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
html_theme = "furo"
html_title = "nbgrad"
html_static_path = []
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# MyST-NB renders every MIME type of an output before it picks the one to show, and warns about each it cannot
# draw: nbgrad's panel data (application/vnd.nbgrad.panel+json, for its JupyterLab renderer) is one, beside the
# static HTML the page shows.
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"

# The tutorials run once and are kept in a Jupyter cache keyed by each notebook's code: a later build reuses
# the outputs until a tutorial's code changes.
nb_execution_mode = os.environ.get("NBGRAD_DOCS_EXECUTE", "cache")
nb_execution_cache_path = os.environ.get("NBGRAD_DOCS_CACHE", str(ROOT / "build" / "jupyter_cache"))
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True             # a tutorial that fails says which cell and why, in the build's log
nb_execution_in_temp = False
# A panel's static HTML (its pictures as PNG) before any widget view: the site is read with no kernel.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", 90),
                              ("html", "application/vnd.nbgrad.panel+json", 91)]
nb_ipywidgets_js = {}                  # no widget scripts fetched from a CDN
nb_output_stderr = "show"               # nbgrad's one-line notes go to stderr
