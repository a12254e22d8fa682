"""A cell run over a batch of examples: the body once per example, each copy a `with invoke(...)` block of
its own, so every event, edit, `.grad` and `backward()` in a copy concerns that example's rows.

Copies share the run's namespace, so each copy binds its names under a prefix of its own (`_nbgrad3_last`
for example 3's `last`), and stands on lines of its own: copy k's line n is `n + k * L` in a text that
repeats the cell (L lines) once per example. Tracebacks and the engine's ordering (which backward pass a
`.grad` belongs to goes by position) see every copy apart; `cell_line` maps a line back.
"""
from __future__ import annotations

import ast
import copy
import re
import textwrap
from functools import lru_cache

from ..engine.compile.cellast import is_backward_call
from ..engine.compile.compiler import compile_statements
from ..engine.compile.dataflow import bound_names
from ..errors import NbgradError

_PREFIX = re.compile(r"_nbgrad\d+_")


def prefixed(name: str, example: int) -> str:
    return f"_nbgrad{example}_{name}"


def unprefixed(text: str) -> str:
    """A message about copies' names in the user's names (`_nbgrad3_last` -> `last`)."""
    return _PREFIX.sub("", text)


class Replicated:
    """The program for `count` examples of one cell, the names each copy binds, the cell's line count."""

    def __init__(self, source: str, count: int, helpers: tuple = ()):
        self.source = textwrap.dedent(source)
        self.lines = max(1, len(self.source.splitlines()))
        tree = ast.parse(self.source)
        if any(_is_invoke(stmt) for stmt in tree.body):
            raise NbgradError("--over runs the body once per example, each as its own invoke: write the body "
                              "for one example, without `with invoke(...)` blocks")
        # in the order the cell binds them (what the saved names, their lists and the panel follow)
        self.names = list(dict.fromkeys(name for stmt in tree.body for name in sorted(bound_names(stmt)[0])))
        one_pass = _single_backward(tree)
        body = [_copy_block(tree.body, example, self.lines, set(self.names), one_pass) for example in range(count)]
        if one_pass is not None:
            body.append(_summed_backward(tree.body[one_pass], count, (count - 1) * self.lines))
        text = "\n".join([self.source.rstrip("\n")] * count) + "\n"
        # The compiler's own checks first (a syntax error is the cell's, at its own line)
        compile(tree, "<cell>", "exec")
        self.program = compile_statements(text, body, "trace", helpers)

    def cell_line(self, line: int | None) -> tuple:
        """(cell line, example in the batch) of a line of the repeated text."""
        if not line:
            return line, None
        return (line - 1) % self.lines + 1, (line - 1) // self.lines


@lru_cache(maxsize=16)
def replicated(source: str, count: int, helpers: tuple = ()) -> Replicated:
    """Compiled once per cell and batch size (the last batch of a dataset may be smaller). `helpers`: the
    functions from earlier cells that the cell calls (compile/helpers.py), found where the run began."""
    return Replicated(source, count, helpers)


def _is_invoke(stmt) -> bool:
    call = stmt.items[0].context_expr if isinstance(stmt, ast.With) and len(stmt.items) == 1 else None
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "invoke"


def _copy_block(body: list, example: int, lines: int, names: set, one_pass: int | None) -> ast.With:
    """`with invoke(example):` holding the body with its names prefixed, every line moved by example * L.
    The block itself has no position: the compiler names its INPUT by the expression's text."""
    statements = [_Renamer(names, example).visit(copy.deepcopy(stmt)) for stmt in body]
    for stmt in statements:
        ast.increment_lineno(stmt, example * lines)
    if one_pass is None:
        _retain_graphs(statements)
    else:            # `L.backward()` -> `_nbgrad{k}__loss = L`: the pass after the blocks takes every loss
        backward = statements[one_pass]
        statements[one_pass] = ast.copy_location(ast.Assign(
            targets=[ast.Name(id=prefixed(_LOSS, example), ctx=ast.Store())], value=backward.value.func.value),
            backward)
    call = ast.Call(func=ast.Name(id="invoke", ctx=ast.Load()), args=[ast.Constant(example)], keywords=[])
    return ast.With(items=[ast.withitem(context_expr=call)], body=statements)


_LOSS = "_loss"
_PASS_OPTIONS = {"retain_graph", "create_graph"}


def _single_backward(tree: ast.Module) -> int | None:
    """The index of the body's one backward pass when it is a plain `L.backward()` statement of its own
    (options: retain_graph, create_graph). Then one pass of the sum of the examples' losses gives each
    example's rows the gradient of its own loss (the rows of a batch do not mix), in one pass, not one
    pass through the whole batch per example."""
    calls = [n for n in ast.walk(tree) if is_backward_call(n)]
    if len(calls) != 1:
        return None
    call = calls[0]
    if call.args or any(keyword.arg not in _PASS_OPTIONS for keyword in call.keywords):
        return None
    return next((index for index, stmt in enumerate(tree.body)
                 if isinstance(stmt, ast.Expr) and stmt.value is call), None)


def _summed_backward(stmt: ast.Expr, count: int, shift: int) -> ast.Expr:
    """`(_nbgrad0__loss + ... ).backward(options)` at the line of the last example's backward statement."""
    total = ast.Name(id=prefixed(_LOSS, 0), ctx=ast.Load())
    for example in range(1, count):
        total = ast.BinOp(left=total, op=ast.Add(), right=ast.Name(id=prefixed(_LOSS, example), ctx=ast.Load()))
    call = ast.Call(func=ast.Attribute(value=total, attr="backward", ctx=ast.Load()), args=[],
                    keywords=copy.deepcopy(stmt.value.keywords))
    summed = ast.Expr(value=call)
    for node in ast.walk(summed):
        ast.copy_location(node, stmt.value)
    ast.increment_lineno(summed, shift)
    return summed


def _retain_graphs(statements: list) -> None:
    """Each copy's backward pass goes through the graph of the whole batch, which the next copy's pass
    needs again: every pass keeps it (it is freed with the batch)."""
    for node in (n for stmt in statements for n in ast.walk(stmt)):
        if is_backward_call(node) and not any(keyword.arg == "retain_graph" for keyword in node.keywords):
            node.keywords.append(ast.keyword(arg="retain_graph", value=ast.Constant(True)))


class _Renamer(ast.NodeTransformer):
    """Every occurrence of the names the body binds, under the copy's prefix (consistently, inner scopes
    included, so the meaning of the code is the same)."""

    def __init__(self, names: set, example: int):
        self.names, self.example = names, example

    def _name(self, name):
        return prefixed(name, self.example) if name in self.names else name

    def visit_Name(self, node):
        node.id = self._name(node.id)
        return node

    def visit_arg(self, node):
        node.arg = self._name(node.arg)
        return self.generic_visit(node)

    def _named(self, node):
        if getattr(node, "name", None):
            node.name = self._name(node.name)
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_ExceptHandler = _named

    def visit_alias(self, node):
        bound = node.asname or node.name.split(".")[0]
        if bound in self.names and (node.asname or "." not in node.name):
            node.asname = self._name(bound)
        return node

    def visit_Global(self, node):
        node.names = [self._name(name) for name in node.names]
        return node

    visit_Nonlocal = visit_Global
