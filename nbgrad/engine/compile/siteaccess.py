"""`X.source` in a cell becomes `__nbgrad__.source_of(X)`, and the statement `X.skip(v)` becomes
`__nbgrad__.skip_of(X).output = v`: a module has no `source` or `skip` attribute, and nbgrad adds none
to it (no patching of torch); the runtime answers with the sites of X's forward, or X's skip gate.
A site's own `.grad` (`X.source.SITE.grad`) is the gradient into its value: `X.source.SITE.output.grad`."""
from __future__ import annotations

import ast

from .program import RUNTIME_NAME


def _runtime_call(function: str, argument: ast.expr, at: ast.AST) -> ast.Call:
    opener = ast.Attribute(value=ast.Name(id=RUNTIME_NAME, ctx=ast.Load()), attr=function, ctx=ast.Load())
    call = ast.Call(func=opener, args=[argument], keywords=[])
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


class _OpenSources(ast.NodeTransformer):
    def visit_Attribute(self, node):
        if node.attr == "grad" and _is_site(node.value):
            # spans the text `X.source.SITE`: the graph and errors quote the gradient as the cell wrote it
            node.value = ast.copy_location(ast.Attribute(value=node.value, attr="output", ctx=ast.Load()), node.value)
        self.generic_visit(node)
        if node.attr != "source" or not isinstance(node.ctx, ast.Load):
            return node
        return _runtime_call("source_of", node.value, node)

    def visit_Expr(self, node):
        if not _is_skip(node):
            return self.generic_visit(node)
        call = node.value
        gate = _runtime_call("skip_of", self.visit(call.func.value), call.func)
        target = ast.copy_location(ast.Attribute(value=gate, attr="output", ctx=ast.Store()), call.func)
        return ast.copy_location(ast.Assign(targets=[target], value=self.visit(call.args[0])), node)


def open_sources(module: ast.Module) -> ast.Module:
    """The cell with every `X.source` and `X.skip(v)` routed through the runtime (a cell naming neither is
    unchanged)."""
    if not any(isinstance(n, ast.Attribute) and n.attr in ("source", "skip") for n in ast.walk(module)):
        return module
    return ast.fix_missing_locations(_OpenSources().visit(module))
