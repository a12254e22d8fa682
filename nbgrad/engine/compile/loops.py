"""Loops over modules: which loop iterables nbgrad may evaluate before the model runs, so that every
module a loop yields is hooked ahead and the loop's reads are answered in whatever order it asks
(`reversed(model.transformer.h)`, `model.named_modules()` with containers before their children)."""
from __future__ import annotations

import ast

from .cellast import is_path

# Calls that only list modules (no side effect, no model run): safe to evaluate early.
MODULE_LISTINGS = frozenset({"named_modules", "modules", "children", "named_children", "values", "items"})
WRAPPERS = frozenset({"reversed", "list", "tuple", "enumerate", "sorted"})


def is_module_iterable(expr: ast.expr, free: frozenset | None = None) -> bool:
    """An iterable of modules (or of tuples holding modules) that can be evaluated before the run from names
    the cell does not bind: a path, `P.named_modules()` and the other listings, `reversed(...)`, `list(...)`,
    `enumerate(...)`, a slice with constant bounds, or a list / tuple of paths."""
    if is_path(expr, free):
        return True
    if isinstance(expr, (ast.List, ast.Tuple)):
        return bool(expr.elts) and all(is_path(element, free) for element in expr.elts)
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Slice):
        bounds = (expr.slice.lower, expr.slice.upper, expr.slice.step)
        return all(b is None or _is_constant(b) for b in bounds) and is_module_iterable(expr.value, free)
    if not isinstance(expr, ast.Call) or expr.keywords and not _constant_keywords(expr):
        return False
    if isinstance(expr.func, ast.Attribute) and expr.func.attr in MODULE_LISTINGS:
        return all(_is_constant(a) for a in expr.args) and is_path(expr.func.value, free)
    if isinstance(expr.func, ast.Name) and expr.func.id in WRAPPERS and (free is None or expr.func.id in free):
        return len(expr.args) == 1 and is_module_iterable(expr.args[0], free)
    return False


def _is_constant(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant)


def _constant_keywords(call: ast.Call) -> bool:
    return all(k.arg is not None and _is_constant(k.value) for k in call.keywords)

