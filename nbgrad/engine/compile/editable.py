"""What an edit body (`%%edit MODEL`, `nbgrad.edit`) may hold: writes and in-place edits of module events, sites
(`M.source.SITE`), skips (`M.skip(v)`) and gradients (`T.grad[...] = v`), and the reads that feed them. It runs at
every later call of the model, with no cell to return a value to, so saves, caches, backward passes, `stop()`,
invokes and reads that feed no edit are refused, each with a message that says to use %%trace."""
from __future__ import annotations

import ast
import builtins
import textwrap

from ...errors import NbgradError

USE_TRACE = "read and keep values in a %%trace cell, which runs with the edit in place"

# call name -> what it is, for the message
REFUSED_CALLS = {
    "save": "`.save()` keeps a value after a cell",
    "cache": "`cache(...)` keeps every module's value after a cell",
    "stop": "`stop()` ends one run of a cell early",
    "backward": "a backward pass belongs to one cell's run",
    "invoke": "`with invoke(...)` gives one cell's run its inputs",
}


def edit_mode(source: str) -> str:
    """How to compile an edit body: one with `.grad` as a backward cell, whose one pass is the backward pass that
    reaches each call's tensors after the call (see edit/editstack.py)."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return "trace"          # the compiler says where
    return "backward" if any(isinstance(node, ast.Attribute) and node.attr == "grad" for node in ast.walk(tree)) \
        else "trace"


def check_edit(program) -> None:
    """Raise an NbgradError naming the first line of `program` (an edit body) that an edit cannot hold."""
    tree = ast.parse(program.source)
    refused = _refused_form(tree)
    if refused is not None:
        line, what = refused
        raise NbgradError(f"{what}, and an edit has no cell to return to: it runs at every later call of the "
                          f"model. An edit only writes and edits (`M.output = v`, `M.output[:, -1] = 0`); "
                          f"{USE_TRACE}", line)
    if not any(node.events for node in program.graph.nodes):
        raise NbgradError("an edit writes or edits what a module returns or receives (`M.output = v`, "
                          "`M.output[:, -1] = 0`, `M.input = v`); this one touches no module")
    node = _lone_read(program)
    if node is not None:
        event = node.events[0]
        raise NbgradError(f"`{event.describe()}` is read here and no edit uses it: an edit has no cell to return "
                          f"a value to, it runs at every later call of the model. To look at values, {USE_TRACE}",
                          node.line)


def _refused_form(tree: ast.AST):
    """(line, what) of the first save, cache, stop, gradient, backward pass or invoke, in source order."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in REFUSED_CALLS:
                found.append((node.lineno, node.col_offset, REFUSED_CALLS[name]))
    if not found:
        return None
    line, _, what = min(found)
    return line, what


def _lone_read(program):
    """The first statement that only reads events and that no other statement uses, if any."""
    nodes = program.graph.nodes
    used = {dep for node in nodes for dep in node.deps}
    for node in nodes:
        if node.events and not any(event.write for event in node.events) and node.index not in used:
            return node
    return None


def check_names(program, namespace: dict) -> None:
    """A name the body reads that neither the notebook nor the body binds: refused when the edit is installed (the
    body reads the notebook's names then), not a NameError at every later call of the model."""
    bound = set(namespace).union(dir(builtins), *(node.spec.binds for node in program.nodes))
    for node in program.nodes:
        unknown = sorted(name for name in node.spec.reads - bound if not name.startswith("__nbgrad"))
        if unknown:
            raise NbgradError(f"name '{unknown[0]}' is not defined: an edit reads the notebook's names when it is "
                              f"installed; define {unknown[0]} first (in an earlier cell), then install the edit",
                              node.spec.line)
