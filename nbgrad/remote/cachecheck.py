"""`cache(...)` of a remote cell checked on the skeleton before anything is sent: its arguments, and modules that
no module of the model matches, are the local run's errors (engine/checks.py, which the run asks too, on the
same module tree)."""
from __future__ import annotations

import ast

from torch import nn

from ..engine.checks import check_cache_call, matching_modules
from .spelling import bindings, reached, value_of

_UNKNOWN = object()


def check_caches(text: str, names: dict, skeleton: nn.Module, gradients: bool) -> None:
    """Raise what the local run raises for the first `cache(...)` of the cell `text` whose arguments are known
    before the run (constants, paths, modules of the model) and that the local run refuses. `gradients`: whether
    the run can take a cache's gradients (a backward pass, autograd on), which the run checks before the modules."""
    tree = ast.parse(text)
    bound, _ = bindings(tree)
    if bound.get("cache"):
        return
    known = {name: value for name, value in names.items() if bound.get(name, 0) == 0}
    calls = [node for node, _ in reached(tree.body, known, bound, ast.Call)
             if isinstance(node.func, ast.Name) and node.func.id == "cache"]
    for call in sorted(calls, key=lambda node: (node.lineno, node.col_offset)):
        args = [value_of(arg, known, _UNKNOWN) for arg in call.args]
        kwargs = {keyword.arg: value_of(keyword.value, known, _UNKNOWN) for keyword in call.keywords}
        if None in kwargs or _UNKNOWN in args or _UNKNOWN in kwargs.values():
            continue                   # `**options`, or a value the run computes: checked there
        check_cache_call(tuple(args), kwargs, call.lineno)
        if kwargs.get("grads") and not gradients:
            continue                   # the run's error about grads=True comes first
        modules = args[0] if args else kwargs.get("modules", "*")
        matching_modules(skeleton, modules, call.lineno)
