"""An edit's `for i in range(N):` loop over a list of modules, both known when it is installed: an index past the
end of the list is refused then, with its line, rather than at the model's first call."""
from __future__ import annotations

import ast

from torch import nn

from ...errors import ModulePathError


def check_loop_ranges(source: str, namespace: dict) -> None:
    """Each `for NAME in range(literal ints):` whose body indexes a module list (`model.transformer.h[NAME]`,
    the list a dotted path of the namespace) with NAME: every index the loop reaches is in the list."""
    for loop in ast.walk(ast.parse(source)):
        indices = _literal_range(loop) if isinstance(loop, ast.For) and isinstance(loop.target, ast.Name) else None
        if not indices:
            continue
        for node in ast.walk(loop):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and \
                    node.slice.id == loop.target.id:
                _check(node, _module_list(node.value, namespace), indices, loop, _event_of(node, loop))


def _event_of(node: ast.Subscript, loop: ast.For) -> str:
    """The whole path the cell reads through `node` (`model.transformer.h[i].mlp.output`): a canonical name is then
    said as the cell wrote it (names/rewrite.py's in_cell_words replaces whole paths)."""
    def base(attribute):
        while isinstance(attribute, ast.Attribute):
            attribute = attribute.value
        return attribute
    chains = [ast.unparse(a) for a in ast.walk(loop) if isinstance(a, ast.Attribute) and base(a) is node]
    return max(chains, key=len, default=ast.unparse(node))


def _literal_range(loop: ast.For) -> range | None:
    call = loop.iter
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"
            and not call.keywords and 1 <= len(call.args) <= 3):
        return None
    try:
        return range(*(ast.literal_eval(arg) for arg in call.args))
    except (ValueError, TypeError, SyntaxError):
        return None


def _module_list(node: ast.expr, namespace: dict):
    path, names = node, []
    while isinstance(path, ast.Attribute):
        names.append(path.attr)
        path = path.value
    if not isinstance(path, ast.Name) or path.id not in namespace:
        return None
    value = namespace[path.id]
    for name in reversed(names):
        value = getattr(value, name, None)
    return value if isinstance(value, (nn.ModuleList, nn.Sequential)) else None


def _check(node: ast.Subscript, modules, indices: range, loop: ast.For, event: str) -> None:
    if modules is None:
        return
    count, target = len(modules), ast.unparse(node.value)
    bad = next((i for i in indices if not -count <= i < count), None)
    if bad is not None:
        raise ModulePathError(f"{event} is not in the model for {loop.target.id} = {bad}: the loop "
                              f"of line {loop.lineno} runs over {ast.unparse(loop.iter)}, and {target} has {count} "
                              f"layers, indices 0–{count - 1}", node.lineno)
