"""The guide pages' code runs: each page's Python blocks, in order, in one IPython with the embedded model (as a
reader who ran the tracing page's first cell has it). A block that needs what a test machine lacks is marked by an
HTML comment `<!-- not run: WHY -->` on the line above it and skipped; one that shows an error is marked
`<!-- raises: ErrorType -->` and must raise that error."""
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"(?:<!-- (?P<mark>not run|raises): (?P<why>[^>]*) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.S)
PAGES = ("tracing", "edits", "methods", "scan", "canonical-names")
SETUP = "import torch, nbgrad\nmodel = nbgrad.load_model()"


def blocks(page: str) -> list:
    return [(m["code"], m["mark"], m["why"]) for m in BLOCK.finditer((DOCS / f"{page}.md").read_text())
            if m["lang"] in ("python", "ipython")]


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(shell, page):
    before = dict(shell.user_ns)
    try:
        assert shell.run_cell(SETUP, store_history=False).success
        for code, mark, why in blocks(page):
            if mark == "not run":
                continue
            result = shell.run_cell(code, store_history=False)
            if mark == "raises":
                assert type(result.error_in_exec).__name__ == why.strip(), (page, code, result.error_in_exec)
            else:
                assert result.error_before_exec is None and result.error_in_exec is None, (page, code, result)
    finally:
        for edit in [value for value in shell.user_ns.values() if type(value).__name__ == "Edit"]:
            edit.remove()
        for name in set(shell.user_ns) - set(before):
            del shell.user_ns[name]
        shell.user_ns.update(before)


def test_each_page_checked_has_blocks_that_run():
    counted = {page: sum(mark != "not run" for _, mark, _ in blocks(page)) for page in PAGES}
    assert all(count >= 1 for count in counted.values()), counted
    assert counted["edits"] >= 6 and counted["tracing"] >= 3, counted      # the steering, gradient and skip examples
