"""`X.source` in a cell becomes `__nbgrad__.source_of(X)`, the statement `X.skip(v)` becomes
`__nbgrad__.skip_of(X).output = v`, and `X.calls[k].output` (or `.input`, `.inputs`) becomes
`__nbgrad__.call_of(X, k).output`: a module has no `source`, `skip` or `calls` attribute, and nbgrad adds none
to it (no patching of torch); the runtime answers with the sites of X's forward, X's skip gate, or the events of
X's k-th call (run/calls.py).
A site's own `.grad` (`X.source.SITE.grad`) is the gradient into its value: `X.source.SITE.output.grad`."""
from __future__ import annotations

import ast

from ...errors import NbgradError
from .cellast import MODULE_EVENTS
from .program import RUNTIME_NAME


def _runtime_call(function: str, argument: ast.expr, at: ast.AST, *more: ast.expr) -> ast.Call:
    opener = ast.Attribute(value=ast.Name(id=RUNTIME_NAME, ctx=ast.Load()), attr=function, ctx=ast.Load())
    call = ast.Call(func=opener, args=[argument, *more], keywords=[])
    # The call spans the text `X.source` (`X.skip`), so errors and the graph quote what the cell wrote.
    for part in (call, opener, opener.value):
        ast.copy_location(part, at)
    return call


def _is_skip(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and len(node.value.args) == 1
            and not node.value.keywords and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "skip")


def _is_site(node: ast.expr) -> bool:
    """`X.source.SITE`, as the cell writes it."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "source"


def _is_call(node: ast.expr) -> bool:
    """`X.calls[k]`, as the cell writes it."""
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "calls"
            and isinstance(node.ctx, ast.Load))


def _call_index(node: ast.Subscript) -> ast.expr:
    """k of `X.calls[k]`: one index, never negative (a negative k would count from the last call)."""
    index, text = node.slice, ast.unparse(node)
    if isinstance(index, (ast.Slice, ast.Tuple)):
        raise NbgradError(f"`{text}`: .calls[k] takes one call's index k (an int from 0), not a slice or a tuple; "
                          f"a loop over k reads several calls", node.lineno)
    negative = isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and isinstance(
        index.operand, ast.Constant) or isinstance(index, ast.Constant) and isinstance(index.value, int) and index.value < 0
    if negative:
        raise NbgradError(f"`{text}`: .calls[k] counts a module's calls from 0, and k may not be negative: the number "
                          f"of times it runs is not known before the forward ends. Write the call's index from 0",
                          node.lineno)
    return index


class _OpenSources(ast.NodeTransformer):
    def visit_Attribute(self, node):
        if node.attr in MODULE_EVENTS and _is_call(node.value):      # `X.calls[k].output`
            call = node.value
            node.value = _runtime_call("call_of", self.visit(call.value.value), call, self.visit(_call_index(call)))
            return node
        if node.attr == "grad" and _is_site(node.value):
            # spans the text `X.source.SITE`: the graph and errors quote the gradient as the cell wrote it
            node.value = ast.copy_location(ast.Attribute(value=node.value, attr="output", ctx=ast.Load()), node.value)
        self.generic_visit(node)
        if node.attr != "source" or not isinstance(node.ctx, ast.Load):
            return node
        return _runtime_call("source_of", node.value, node)

    def visit_Assign(self, node):
        """`c = X.calls[k]`: c is the k-th call, whose events the cell reads as `c.output` (as `b = X` binds a
        module whose events it reads as `b.output`)."""
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and _is_call(node.value):
            call = node.value
            node.value = _runtime_call("call_of", self.visit(call.value.value), call, self.visit(_call_index(call)))
            return node
        return self.generic_visit(node)

    def visit_Expr(self, node):
        if not _is_skip(node):
            return self.generic_visit(node)
        call = node.value
        gate = _runtime_call("skip_of", self.visit(call.func.value), call.func)
        target = ast.copy_location(ast.Attribute(value=gate, attr="output", ctx=ast.Store()), call.func)
        return ast.copy_location(ast.Assign(targets=[target], value=self.visit(call.args[0])), node)


def open_sources(module: ast.Module) -> ast.Module:
    """The cell with every `X.source`, `X.skip(v)` and `X.calls[k].EVENT` routed through the runtime (a cell naming
    none of them is unchanged)."""
    if not any(isinstance(n, ast.Attribute) and n.attr in ("source", "skip", "calls") for n in ast.walk(module)):
        return module
    return ast.fix_missing_locations(_OpenSources().visit(module))
