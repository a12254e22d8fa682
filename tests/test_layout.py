"""The package's rooms stay readable: small files, short functions, imports that point one way."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nbgrad"
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 40


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


def imported_modules(path):
    """Modules of the package that a file imports (`from .x import y`, `from ..x import y`), as dotted paths
    below `nbgrad` (`engine.run.runtime`), lazy imports inside functions included."""
    here = list(path.relative_to(PACKAGE).with_suffix("").parts)
    package = here[:-1] if here[-1] != "__init__" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            base = base + (node.module.split(".") if node.module else [])
            found.update(".".join(base + [alias.name]) if _is_module(base + [alias.name]) else ".".join(base)
                         for alias in node.names)
    return found


def _is_module(parts) -> bool:
    return PACKAGE.joinpath(*parts).with_suffix(".py").is_file() or PACKAGE.joinpath(*parts, "__init__.py").is_file()


def room_of(dotted: str) -> str:
    return dotted.split(".")[0] if dotted else ""


# The folders and the arrows between them: each room may import the rooms listed, and no other.
# errors < engine, names < models < api, generation < attribution, datasets < remote, notebook; views stand alone.
ALLOWED = {
    "errors": {"errors"},
    "names": {"names", "errors"},
    "engine": {"engine", "errors"},
    "models": {"models", "engine", "errors"},
    "views": {"views"},
    "api": {"api", "engine", "errors", "models", "names", "views", ""},
    "generation": {"generation", "engine", "errors", "models", "names", ""},
    "attribution": {"attribution", "engine", "errors", "models", "views"},
    "datasets": {"datasets", "api", "engine", "errors", "models", "names"},
    "remote": {"remote", "datasets", "api", "generation", "engine", "errors", "models", "names"},
    "notebook": {"notebook", "api", "generation", "attribution", "datasets", "engine", "errors", "models",
                 "names", "views", ""},
}
ROOMS = set(ALLOWED) | {""}


def python_files():
    return sorted(p for p in PACKAGE.rglob("*.py") if PACKAGE / "labextension" not in p.parents)


def test_every_file_stands_in_a_known_room():
    strays = [str(p.relative_to(PACKAGE)) for p in python_files()
              if room_of(".".join(p.relative_to(PACKAGE).with_suffix("").parts)) not in ROOMS
              and p.parent != PACKAGE]
    assert not strays, f"files in no room of the layout: {strays}"


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_arrows(path):
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    room = "" if len(parts) == 1 and parts[0] == "__init__" else room_of(".".join(parts))
    if room == "" or room not in ALLOWED:
        return      # the package's own __init__ gathers the public API from every room
    wrong = {dotted for dotted in imported_modules(path) if room_of(dotted) not in ALLOWED[room]}
    assert not wrong, f"{path.relative_to(ROOT)} ({room}/) imports {sorted(wrong)}"


def test_the_arrows_have_no_circle():
    def reaches(start, target, seen=()):
        return any(room == target or (room not in seen and reaches(room, target, seen + (room,)))
                   for room in ALLOWED.get(start, ()) - {start, ""})
    circles = [room for room in ALLOWED if reaches(room, room)]
    assert not circles, f"rooms that reach themselves: {circles}"


def module_circles():
    """Circles of imports between the package's modules (lazy imports inside functions included; a package's
    `__init__` gathers names and is left out), each as the sorted list of its modules."""
    modules = {".".join(p.relative_to(PACKAGE).with_suffix("").parts): p for p in python_files()
               if p.name != "__init__.py"}
    edges = {name: imported_modules(path) & set(modules) - {name} for name, path in modules.items()}
    circles, done = [], set()
    for start in sorted(modules):
        reached = _reach(start, edges)
        if start in reached and start not in done:
            circle = sorted(name for name in reached if start in _reach(name, edges))
            done.update(circle)
            circles.append(circle)
    return circles


def _reach(start, edges):
    reached, frontier = set(), [start]
    while frontier:
        for following in edges[frontier.pop()] - reached:
            reached.add(following)
            frontier.append(following)
    return reached


def test_no_module_imports_itself_in_a_circle():
    circles = module_circles()
    assert not circles, "modules that import each other round a circle: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_sees_a_circle(tmp_path, monkeypatch):
    package = tmp_path / "nbgrad"
    (package / "room").mkdir(parents=True)
    (package / "room" / "__init__.py").write_text("")
    (package / "room" / "first.py").write_text("from .second import thing\n")
    (package / "room" / "second.py").write_text("def f():\n    from .first import other\n")
    (package / "room" / "third.py").write_text("from .first import thing\n")
    monkeypatch.setitem(globals(), "PACKAGE", package)
    assert module_circles() == [["room.first", "room.second"]]


def test_running_a_cell_does_not_import_the_compiler():
    for path in (PACKAGE / "engine" / "run").glob("*.py"):
        assert "engine.compile.compiler" not in imported_modules(path), path.name


IPYTHON = ("IPython", "ipykernel", "ipywidgets", "traitlets", "comm")


def _imports_ipython(path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(name.split(".")[0] in IPYTHON for name in names):
            return True
    return False


def test_only_the_notebook_room_imports_ipython():
    wrong = [str(p.relative_to(PACKAGE)) for p in python_files()
             if _imports_ipython(p) and "notebook" not in p.relative_to(PACKAGE).parts
             and p != PACKAGE / "views" / "widget.py"]
    assert not wrong, f"IPython imported outside nbgrad/notebook/: {wrong}"


def test_the_layout_finds_imports(tmp_path):
    assert "engine.run.runtime" in imported_modules(PACKAGE / "api.py")
    assert "errors.diagnose" in imported_modules(PACKAGE / "engine" / "checks.py")
    assert _imports_ipython(PACKAGE / "notebook" / "magics.py")


def test_readme_and_pyproject_ask_for_the_same_python():
    readme = re.search(r"Python (3\.\d+)\+", (ROOT / "README.md").read_text()).group(1)
    required = re.search(r'requires-python = ">=(3\.\d+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert readme == required, f"README says Python {readme}+, pyproject.toml >={required}"


RUN_CORE_LINES = 2900        # issue 45: one scheduler, no second interpreter, every feature kept within this


def test_the_run_core_stays_within_its_lines():
    lines = sum(len(path.read_text().splitlines()) for path in (PACKAGE / "engine" / "run").glob("*.py"))
    assert lines <= RUN_CORE_LINES, f"engine/run/ has {lines} lines, more than {RUN_CORE_LINES}"
