"""README is the front door: short, every code block in it runs (in order, in one IPython with the embedded
model), and every link leads somewhere that exists. A block that needs what a test machine lacks (a cluster, a
hub) is marked by an HTML comment `<!-- not run: WHY -->` on the line above it, and skipped."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.S)


def blocks() -> list:
    return [(m["lang"], m["code"], m["why"]) for m in BLOCK.finditer(README.read_text())]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and MyST (myst_heading_anchors) make it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_readme_is_short_and_shows_a_panel():
    text = README.read_text()
    assert len(text.splitlines()) <= 130
    assert "](docs/images/panel.png)" in text and (ROOT / "docs" / "images" / "panel.png").is_file()


def test_every_python_block_runs(shell):
    python = [(code, why) for lang, code, why in blocks() if lang in ("python", "ipython")]
    assert len(python) >= 10
    before = dict(shell.user_ns)         # README binds `model`, `x`, ...: the session's names come back after
    try:
        for code, why in python:
            if why is not None:
                continue
            result = shell.run_cell(code, store_history=False)
            assert result.error_before_exec is None and result.error_in_exec is None, (code, result)
        patched = shell.user_ns["patched"]       # one patch per layer, each a [1, vocab] row
        assert len(patched) == 4 and patched[0].shape[0] == 1 and len(shell.user_ns["last"]) == 3
    finally:
        for name in set(shell.user_ns) - set(before):
            del shell.user_ns[name]
        shell.user_ns.update(before)


def test_every_other_block_is_a_shell_command():
    assert {lang for lang, _, _ in blocks()} <= {"python", "ipython", "sh"}


@pytest.mark.parametrize("link", sorted(set(re.findall(r"\]\(([^)\s]+)\)", README.read_text()))))
def test_every_link_resolves(link):
    if re.match(r"https?://", link):
        pytest.skip("a web link: the tests run offline")
    path, _, anchor = link.partition("#")
    target = ROOT / path
    assert target.exists(), link
    if anchor:
        headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M)
        assert anchor in [_slug(h) for h in headings], (link, [_slug(h) for h in headings])
