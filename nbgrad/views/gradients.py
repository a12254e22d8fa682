"""Which saved values are gradients, read from the cell's own statements, for the panel's labels.

The engine pairs a saved gradient with the name of the tensor it flowed into when that tensor has a
name. A gradient saved straight from a module path (`g = model.transformer.h[0].output.grad.save()`),
or a slice of one, has no such name: the statement still says it is a gradient, and of what."""
from __future__ import annotations

import ast
import re
import textwrap

PASS_THROUGH = {"save", "clone", "detach", "cpu", "float", "double", "contiguous", "squeeze"}


def gradient_targets(graph, names) -> dict:
    """saved name -> source text of the tensor whose `.grad` it holds ("" inside a comprehension)."""
    sources = [getattr(node, "source", "") for node in getattr(graph, "nodes", ()) or ()]
    return _targets(sources, names)


def gradient_targets_in_cell(cell: str, names) -> dict:
    """The same, read from a cell's whole text (a dataset run, whose panel has no graph at hand)."""
    return _targets([cell], names)


def _targets(sources: list, names) -> dict:
    bound = {}
    for source in sources:
        for target, of in _gradient_assignments(source):
            bound[target] = of
    found = {}
    for name in names:
        base = re.split(r"[\[.]", name, maxsplit=1)[0]
        if base in bound:
            found[name] = bound[base] if base == name else ""
    return found


def _gradient_assignments(source: str):
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:           # the header of a compound statement: its body is other nodes
        return
    for statement in ast.walk(tree):
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            of = _gradient_of(statement.value)
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                if of is not None and isinstance(target, ast.Name):
                    yield target.id, of


def _gradient_of(expression) -> str | None:
    """`X` for `X.grad` under saves, copies and indexing; "" for a comprehension of such; else None."""
    in_comprehension = False
    while expression is not None:
        if isinstance(expression, (ast.ListComp, ast.GeneratorExp)):
            expression, in_comprehension = expression.elt, True
        elif isinstance(expression, ast.Subscript):
            expression = expression.value
        elif isinstance(expression, ast.Call):
            expression = _unwrap(expression)
        elif isinstance(expression, ast.Attribute) and expression.attr == "grad":
            return "" if in_comprehension else ast.unparse(expression.value)
        else:
            return None
    return None


def _unwrap(call: ast.Call):
    """What `nbgrad.save(x)`, `save(x)`, `x.save()`, `x.clone()`, ... are a copy or view of."""
    func = call.func
    save_function = (isinstance(func, ast.Name) and func.id == "save") or (
        isinstance(func, ast.Attribute) and func.attr == "save" and isinstance(func.value, ast.Name)
        and func.value.id == "nbgrad")
    if save_function and len(call.args) == 1:
        return call.args[0]
    if isinstance(func, ast.Attribute) and func.attr in PASS_THROUGH:
        return func.value
    return None
