"""The package's rooms stay readable: small files, short functions, imports that point one way."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nbgrad"
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 40
# The engine: compiling a cell and running it. It never reaches up into the layers built on it.
ENGINE = {"program", "cellast", "dataflow", "rewrite", "compiler", "graph", "errors", "hookset", "scheduler",
          "forward", "gradients", "cellstate", "result", "runtime", "diagnose", "rows", "hints"}
ABOVE_ENGINE = {"magics", "views", "comm", "api", "status", "attribution"}


def source_files():
    built = PACKAGE / "labextension"
    files = [p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".js", ".ts") and built not in p.parents]
    return files + sorted((ROOT / "labextension" / "src").glob("*.ts"))


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_file_is_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{path.relative_to(ROOT)} has {lines} lines"


def python_functions(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def _blank_strings_and_comments(text):
    """Replace comments and string contents by nothing (newlines kept), so braces can be counted."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i) + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
        elif text[i] in "'\"`":
            end = i + 1
            while end < len(text) and text[end] != text[i]:
                end += 2 if text[end] == "\\" else 1
            out.append(text[i] + "\n" * text.count("\n", i, end) + text[i])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


_FUNCTION_HEAD = re.compile(r"(?:function\s*(?P<function>[\w$]*)[^{;]*|=>\s*"
                            r"|(?:async\s+)?(?P<method>[A-Za-z_$][\w$]*)\s*\([^;]*\)\s*(?::\s*[^{;=]+)?)$")
_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "with", "return", "else"}


def script_functions(path):
    """(name, first line, length) of every braced function body in a JavaScript / TypeScript file."""
    text = _blank_strings_and_comments(path.read_text())
    open_braces, line = [], 1
    for index, char in enumerate(text):
        if char == "\n":
            line += 1
        elif char == "{":
            head = _FUNCTION_HEAD.search(text[max(0, index - 300):index].rstrip())
            method = head.group("method") if head else None
            name = (head.group("function") if head else None) or method or "function"
            open_braces.append((line, bool(head) and method not in _NOT_FUNCTIONS, name))
        elif char == "}" and open_braces:
            start, is_function, name = open_braces.pop()
            if is_function:
                yield name, start, line - start + 1


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_functions_are_short(path):
    functions = python_functions(path) if path.suffix == ".py" else script_functions(path)
    long = [f"{name} (line {start}, {length} lines)" for name, start, length in functions
            if length > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(ROOT)}: {', '.join(long)}"


def test_script_function_finder_sees_long_functions(tmp_path):
    sample = tmp_path / "sample.js"
    body = "\n".join(f"  const a{i} = '{{';" for i in range(45))
    sample.write_text(f"export function render(x) {{\n{body}\n  if (x) {{ return 1; }}\n}}\nconst f = () => {{ return 2; }};\n")
    found = list(script_functions(sample))
    assert ("render", 1, 48) in found and ("function", 49, 1) in found
    assert all(name != "if" for name, _, _ in found)


def imported_rooms(path):
    """Top-level rooms of the package that a module imports (`from .x import`, `from ..x import`)."""
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = list(path.relative_to(PACKAGE).parts[:-1])[:len(path.relative_to(PACKAGE).parts) - node.level]
            target = parts + (node.module.split(".") if node.module else [a.name for a in node.names][:1])
            rooms.add(target[0] if target else "")
    return rooms


def test_engine_imports_nothing_above_it():
    for room in ENGINE:
        wrong = imported_rooms(PACKAGE / f"{room}.py") & ABOVE_ENGINE
        assert not wrong, f"nbgrad/{room}.py imports {wrong}"


def test_views_import_nothing_of_the_rest():
    for path in (PACKAGE / "views").glob("*.py"):
        wrong = imported_rooms(path) - {"views"}
        assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}"


def test_runtime_does_not_import_the_compiler():
    assert "compiler" not in imported_rooms(PACKAGE / "runtime.py")
