"""`.grad` of a constant part of a module's event value (`M.output[0].grad`, `M.output[:, -1].grad`), written before,
inside or after the backward pass, as researchers write it.

For a tensor the part is a slice the cell takes after the fact: the loss never used that slice, so no gradient
flows into it, and its `.grad` is the same part of the gradient into what the module returned, `M.output.grad[0]`
(with transformers 5 a block returns a tensor, and `[0]` is its batch row 0, as for `M.output[0]`). For a tuple,
list or dict the part is one of the values the module returned, and its `.grad` is that value's own."""
from __future__ import annotations

import ast

from .cellast import const, is_event_attr, name
from .keeping import basic_index


def part_of_event(expr: ast.expr) -> bool:
    """`M.output[i]`, `M.input[:, -1]`: a constant part of a module's event value."""
    return (isinstance(expr, ast.Subscript) and isinstance(expr.ctx, ast.Load) and is_event_attr(expr.value)
            and expr.value.attr != "grad" and basic_index(expr.slice))


def grad_of_part(rewriter, node: ast.Attribute, request) -> ast.expr:
    """`M.output[i].grad` -> `(WHOLE := M.output, GRAD := (yield GradRead(WHOLE[i] if a container else WHOLE)),
    GRAD if a container else GRAD[i])[2]`: one expression, so it stands wherever the read does. The module's event is
    hooked when its pass starts, as for `M.output.grad`, so the part may be read in any order. `request` makes the
    yielded request (rewrite.request)."""
    builder, part = rewriter.builder, node.value
    use = builder.add_use("grad", part, node.lineno, id(node) in rewriter.written, False)
    builder.grad_target(part.value)
    if isinstance(part.slice, ast.Constant) and part.slice.value == 0:
        rewriter.row_zero.add(id(part.value))        # the hint that `[0]` of a tensor is its batch row 0
    whole, grad = name(builder.temp_name("whole")), name(builder.temp_name("grad"))
    container = ast.Call(func=name("isinstance"), args=[whole, ast.Tuple(
        elts=[name("tuple"), name("list"), name("dict")], ctx=ast.Load())], keywords=[])
    tensor = ast.IfExp(test=container, body=ast.Subscript(value=whole, slice=part.slice, ctx=ast.Load()), orelse=whole)
    read = request("GradRead", tensor, const(use), const(builder.pass_for(node)))
    result = ast.IfExp(test=container, body=grad, orelse=ast.Subscript(value=grad, slice=part.slice, ctx=ast.Load()))
    steps = [ast.NamedExpr(target=name(whole.id, store=True), value=rewriter.visit(part.value)),
             ast.NamedExpr(target=name(grad.id, store=True), value=read), result]
    return ast.Subscript(value=ast.Tuple(elts=steps, ctx=ast.Load()), slice=const(2), ctx=ast.Load())


def part_edit(rewriter, target: ast.expr) -> ast.expr:
    """`M.output[i].grad = g` as `M.output[i].grad[...] = g`: that part of the gradient replaced in place, so the rest
    of it flows on as it came. Any other assignment target as it is."""
    if not (isinstance(target, ast.Attribute) and target.attr == "grad" and part_of_event(target.value)):
        return target
    read = ast.copy_location(ast.Attribute(value=target.value, attr="grad", ctx=ast.Load()), target)
    rewriter.written.add(id(read))                   # an edit of the gradient, not a read of it
    return ast.copy_location(ast.Subscript(value=read, slice=const(...), ctx=ast.Store()), target)
