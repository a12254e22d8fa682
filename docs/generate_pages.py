"""The pages the docs build writes itself (into docs/_generated/, ignored by git): the tutorials' copies, the
reference of every magic and every public name.
`python docs/generate_pages.py OUT` writes them; tests/test_docs_reference.py reads them."""
import filecmp
import inspect
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(os.environ.get("NBGRAD_REPO", Path(__file__).resolve().parents[1]))


def write_all(out: Path) -> None:
    (out / "tutorials").mkdir(parents=True, exist_ok=True)
    copy_tutorials(out / "tutorials")
    _write(out / "reference.md", reference())


def _write(path: Path, text: str) -> None:
    """Only a changed page is written: Sphinx reads again only what is newer than its last build."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def tutorials() -> list:
    """examples/*.ipynb; NBGRAD_DOCS_TUTORIALS="02,06" keeps those whose names start so (a quicker build)."""
    chosen = [p for p in os.environ.get("NBGRAD_DOCS_TUTORIALS", "").split(",") if p]
    return [p for p in sorted((ROOT / "examples").glob("*.ipynb"))
            if not chosen or any(p.name.startswith(prefix) for prefix in chosen)]


def copy_tutorials(out: Path) -> None:
    wanted = {p.name for p in tutorials()}
    for old in out.glob("*.ipynb"):
        if old.name not in wanted:
            old.unlink()
    for notebook in tutorials():
        target = out / notebook.name
        if not target.exists() or not filecmp.cmp(notebook, target, shallow=False):
            shutil.copy2(notebook, target)


def magics() -> dict:
    """{"%%trace": help, "%show": help, ...}: every magic of nbgrad's Magics classes, which `%load_ext nbgrad`
    registers, with its help text."""
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    if "nbgrad" not in shell.extension_manager.loaded:
        shell.extension_manager.load_extension("nbgrad")
    found = {}
    for instance in shell.magics_manager.registry.values():
        if not type(instance).__module__.startswith("nbgrad."):
            continue
        for kind, prefix in (("cell", "%%"), ("line", "%")):
            for name in instance.magics[kind]:
                text = inspect.cleandoc(shell.magics_manager.magics[kind][name].__doc__ or "")
                found[prefix + name] = inspect.cleandoc(text.removeprefix("::"))     # magic_arguments' rST mark
    return dict(sorted(found.items(), key=lambda item: (not item[0].startswith("%%"), item[0])))


def public_names() -> list:
    import nbgrad
    return [name for name in nbgrad.__all__ if name != "__version__"]


def reference() -> str:
    import nbgrad
    parts = ["# Reference\n",
             f"nbgrad {nbgrad.__version__}. Every magic `%load_ext nbgrad` adds (its help, as `%%trace?` prints "
             "it), then every public name of the `nbgrad` package, from its docstring.\n",
             "## Magics\n"]
    for name, text in magics().items():
        parts.append(f"### `{name}`\n\n```text\n{text}\n```\n")
    parts.append("## Python API\n")
    for name in public_names():
        parts.append(api_entry(name, getattr(nbgrad, name)))
    return "\n".join(parts)


def api_entry(name: str, value) -> str:
    """A public name: its signature, its docstring (Markdown, as nbgrad writes them), and for a class each public
    method and property with its own."""
    parts = [f"### `nbgrad.{name}`\n", f"```python\nnbgrad.{name}{_signature(value)}\n```\n",
             inspect.cleandoc(value.__doc__ or "") + "\n"]
    if inspect.isclass(value):
        for member, attribute in vars(value).items():
            doc = getattr(attribute, "__doc__", None) if not member.startswith("_") else None
            if doc and (callable(attribute) or isinstance(attribute, property)):
                call = _signature(attribute) if callable(attribute) else ""
                parts.append(f"- `{member}{call}`: " + " ".join(inspect.cleandoc(doc).split()) + "\n")
    return "\n".join(parts)


def _signature(value) -> str:
    try:
        return str(inspect.signature(value)).replace("(self, ", "(").replace("(self)", "()")
    except (TypeError, ValueError):
        return ""


if __name__ == "__main__":
    write_all(Path(sys.argv[1]))
