"""Sites inside a function: every call and every assignment of its source, named as nnsight 0.8 names
them, and a copy of the function in which each site calls `__nbgrad_site__(name, callee, *args)`.

Naming: a call by its callee's attribute chain joined with `_` (`self.c_attn(x)` -> `self_c_attn`,
subscripts dropped, a method of an unnamed value by its own name: `f(x).split(...)` -> `split`, nothing
nameable -> `call`); an assignment by its target's chain (`query_states`, `self.cache` -> `self_cache`).
Then `_N`: how many sites of that name came before, counted in the order Python evaluates (a call's
arguments before the call, an assignment's value before its target), branches not taken included.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
import types
from typing import NamedTuple

from ...errors import NbgradError

SITE_CALL = "__nbgrad_site__"     # what every site calls in the rewritten function
BIND = "__nbgrad_bind__"          # the identity an assignment's value passes through
_SHELL = "__nbgrad_shell__"


class NoSourceError(NbgradError):
    """A forward (or a called function) whose Python source cannot be read."""


class SiteCode(NamedTuple):
    code: types.CodeType          # the rewritten function's code (same free variables, maybe reordered)
    names: tuple                  # site names in source order
    lines: dict                   # site name -> line number in the function's file
    source: str                   # the function's source text, dedented
    first_line: int               # its first line in the file


def bind(value):
    return value


def chain(expr: ast.expr) -> tuple:
    """(attribute names along `expr`, whether it starts at a name): `self.a[0].b` -> (['self','a','b'], True)."""
    parts = []
    while True:
        if isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        elif isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Name):
            parts.append(expr.id)
            return parts[::-1], True
        else:
            return parts[::-1], False


class _Sites(ast.NodeTransformer):
    """Rewrites calls and assignments into site calls, numbering names as it goes."""

    def __init__(self):
        self.seen: dict = {}
        self.names: list = []
        self.lines: dict = {}

    def _site(self, base: str, callee: ast.expr, args: list, keywords: list, at: ast.AST) -> ast.Call:
        label = f"{base}_{self.seen.get(base, 0)}"
        self.seen[base] = self.seen.get(base, 0) + 1
        self.names.append(label)
        self.lines[label] = at.lineno
        site = ast.Call(func=ast.Name(id=SITE_CALL, ctx=ast.Load()), args=[ast.Constant(label), callee, *args],
                        keywords=keywords)
        return ast.copy_location(site, at)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id == "super" and not node.args and not node.keywords:
            return node        # zero-argument super() reads its caller's frame: it must stay where it is
        self.generic_visit(node)             # inner calls first: they run first
        parts, _ = chain(node.func)
        return self._site("_".join(parts) or "call", node.func, node.args, node.keywords, node)

    def _bound(self, target: ast.expr, value: ast.expr, at: ast.AST) -> ast.expr:
        """`a, b = x, y` gives each name a site of its own; other unpacking and unnamed targets get none."""
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            starred = any(isinstance(e, ast.Starred) for e in target.elts + value.elts)
            if len(target.elts) == len(value.elts) and not starred:
                value.elts = [self._bound(t, v, at) for t, v in zip(target.elts, value.elts)]
            return value
        parts, named = chain(target)
        if not named:
            return value
        return self._site("_".join(parts), ast.Name(id=BIND, ctx=ast.Load()), [value], [], at)

    def visit_Assign(self, node):
        node.value = self.visit(node.value)
        node.targets = [self.visit(target) for target in node.targets]
        if len(node.targets) == 1:
            node.value = self._bound(node.targets[0], node.value, node)
        return node

    def visit_AnnAssign(self, node):
        if node.value is not None:
            node.value = self._bound(node.target, self.visit(node.value), node)
        return node


_cache: dict = {}      # code object -> SiteCode


def site_code(function) -> SiteCode:
    """The rewritten code of a plain Python function (cached per code object), or NoSourceError."""
    code = getattr(function, "__code__", None)
    if code is None:
        raise NoSourceError(f"{_label(function)} has no Python source (a builtin or C function): "
                            f"nbgrad can only open the source of a function written in Python")
    if code not in _cache:
        _cache[code] = _rewrite(code, function)
    return _cache[code]


def _label(function) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


def _rewrite(code: types.CodeType, function) -> SiteCode:
    try:
        lines, first_line = inspect.getsourcelines(code)
    except (OSError, TypeError) as error:
        raise NoSourceError(f"{_label(function)}: its Python source cannot be read ({error}); nbgrad reads "
                            f"a forward's source to find its sites, so a compiled or generated function has none"
                            ) from error
    source = textwrap.dedent("".join(lines))
    tree = ast.parse(source)
    definition = tree.body[0]
    if not isinstance(definition, ast.FunctionDef):
        raise NoSourceError(f"{_label(function)} is not a plain `def` function: nbgrad cannot open its source")
    definition.decorator_list = []
    sites = _Sites()
    sites.visit(tree)
    # Inside a shell whose parameters are the free variables, so that they compile as free variables again.
    shell_args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in code.co_freevars], vararg=None,
                               kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    shell = ast.FunctionDef(name=_SHELL, args=shell_args, decorator_list=[], returns=None, type_params=[],
                            body=[definition, ast.Return(value=ast.Name(id=definition.name, ctx=ast.Load()))])
    tree.body[0] = ast.copy_location(shell, definition)
    ast.increment_lineno(tree, first_line - 1)          # tracebacks point at the real file's lines
    compiled = compile(ast.fix_missing_locations(tree), code.co_filename, "exec")
    shell_code = next(c for c in compiled.co_consts if isinstance(c, types.CodeType) and c.co_name == _SHELL)
    inner = next(c for c in shell_code.co_consts if isinstance(c, types.CodeType) and c.co_name == code.co_name)
    lines_in_file = {name: line + first_line - 1 for name, line in sites.lines.items()}
    return SiteCode(inner, tuple(sites.names), lines_in_file, source, first_line)


def rewritten(function, dispatch) -> types.FunctionType:
    """`function` with its sites calling `dispatch(name, callee, *args, **kwargs)`: same defaults and
    closure cells (matched by name), globals seen through a copy that adds the two site names."""
    found = site_code(function)
    cells = dict(zip(function.__code__.co_freevars, function.__closure__ or ()))
    closure = tuple(cells[name] for name in found.code.co_freevars) or None
    namespace = {**function.__globals__, SITE_CALL: dispatch, BIND: bind}
    made = types.FunctionType(found.code, namespace, function.__name__, function.__defaults__, closure)
    made.__kwdefaults__ = function.__kwdefaults__
    made.__qualname__ = function.__qualname__
    return made


def innermost(function) -> tuple:
    """(the function a decorator chain wraps, the chain outermost first as (wrapper, cell index)): a wrapper
    is peeled when one of its closure cells holds the function its `__wrapped__` names."""
    peeled = []
    while True:
        wrapped = getattr(function, "__wrapped__", None)
        cells = getattr(function, "__closure__", None) or ()
        index = next((i for i, cell in enumerate(cells) if _holds(cell, wrapped)), None)
        if wrapped is None or index is None or len(peeled) > 16:
            return function, peeled
        peeled.append((function, index))
        function = wrapped


def _holds(cell, value) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:          # an empty cell
        return False


def rewrap(peeled: list, inner) -> types.FunctionType:
    """The decorator chain rebuilt around `inner`, with new closures (the originals belong to the class)."""
    for wrapper, index in reversed(peeled):
        cells = list(wrapper.__closure__)
        cells[index] = types.CellType(inner)
        made = types.FunctionType(wrapper.__code__, wrapper.__globals__, wrapper.__name__, wrapper.__defaults__,
                                  tuple(cells))
        made.__kwdefaults__ = wrapper.__kwdefaults__
        made.__qualname__ = wrapper.__qualname__
        inner = made
    return inner
