"""Which module events the runtime may hook before the model runs (Target): the paths a cell names, every
element of a loop's container, and what the cell's own functions read of what a call passes them
(`def attn_of(b): return b.attn.output[0]` called as `[attn_of(b) for b in reversed(model.transformer.h)]`),
so that statements may read them in any order."""
from __future__ import annotations

import ast
import dataclasses

from .astcopy import copied
from .cellast import is_path, opens_source
from .dataflow import read_names
from .loops import element_code, indexed_container, innermost_path, is_module_iterable, loop_variable
from .program import Target


@dataclasses.dataclass
class Call:
    """A call the cell makes, at its own level, of a function whose reads can pause (its own or a helper's)."""
    function: str
    args: list                    # the argument expressions, as written
    keywords: dict                # keyword -> expression
    loop_sources: dict            # the loops of the calling statement: variable -> container


def parameters(function: ast.FunctionDef) -> list:
    """The names a function's positional parameters bind, in order."""
    return [arg.arg for arg in function.args.posonlyargs + function.args.args]


def forward_targets(builder, free: frozenset, alias_at: dict) -> list:
    """Module events whose module the runtime can find before the run: hooked before the model starts (or,
    for an expression that reads a name the cell binds, once the statements binding it have run)."""
    targets, seen, same, names = [], {}, {}, free | alias_at.keys()
    for index, use in enumerate(builder.uses):
        same[use.kind, use.target] = same.get((use.kind, use.target), frozenset()) | {index}
    entries = [(use.kind, use.target, target, loop, same[use.kind, use.target])
               for use, target, loop in zip(builder.uses, builder.use_ast, builder.use_loop)]
    # The cell's own uses (the first entries) whose module a target names, hooked before the model starts
    builder.hooked_ahead = ahead = set()
    for index, (kind, text, target, loop, uses) in enumerate(entries + _through_calls(builder)):
        keep, each = loop or (None, None)
        if kind == "grad":
            continue
        if (kind, text, keep) in seen:
            if seen[kind, text, keep] and index < len(entries):
                ahead.add(index)
            continue
        if loop and is_module_iterable(target, names):  # `[b.attn.output for b in reversed(model.transformer.h)]`
            found = Target(kind, builder._text(target), builder._eval_code(target), every_element=True, keep=keep,
                           each=each, base=(base := innermost_path(target)) and builder._eval_code(base))
        elif is_path(target, names):
            found = Target(kind, text, builder._eval_code(target), uses=uses)
        elif (calls := _calls_of(target, names)) is not None:    # `M.calls[k]`, k a loop's: every call of M
            found = Target(kind, text, builder._eval_code(calls), every_call=True)
        elif (indexed := indexed_container(target, names, builder.filename)) is not None:  # `P[i]`, `P[i].attn`
            found = Target(kind, builder._text(indexed[0]), builder._eval_code(indexed[0]), every_element=True,
                           each=indexed[1])
        else:
            continue
        needs = frozenset().union(*(alias_at[name] for name in read_names(target) if name in alias_at))
        # once it names a target: text read inside a function may name one through a call
        seen[kind, text, keep] = not needs
        if not needs and index < len(entries):
            ahead.add(index)
        targets.append(dataclasses.replace(found, needs=needs) if needs else found)
    return targets


def _calls_of(target: ast.expr, names: frozenset):
    """M of `M.calls[k]` (`__nbgrad__.call_of(M, k)`, compile/siteaccess.py) whose k is not known before the run (a
    loop's), M a path: the run hooks every call of M ahead, so that the loop may read them in any order."""
    if opens_source(target) and target.func.attr == "call_of" and is_path(target.args[0], names):
        return target.args[0]
    return None


def _through_calls(builder) -> list:
    """Target entries for the reads inside the cell's functions, one per call: the read with the function's
    parameter replaced by what the call passes it (`b.attn` for `attn_of(b)`), seen from the calling
    statement's loops; for a read through a loop of the function's own over its parameter
    (`[b.output for b in blocks]`), that loop's container with the call's argument in it."""
    entries = []
    for call in builder.calls:
        if any(isinstance(argument, ast.Starred) for argument in call.args):
            continue          # `f(*blocks)`: which parameter gets what is not known here
        for use, target, loop, context in zip(builder.uses, builder.use_ast, builder.use_loop, builder.use_function):
            if context is None or context[0] != call.function:
                continue
            for position, parameter in enumerate(context[1]):
                argument = call.args[position] if position < len(call.args) else call.keywords.get(parameter)
                read = substituted(target, parameter, argument) if argument is not None else None
                if read is not None:
                    entries.append(_entry(builder, use, read, loop, call.loop_sources))
    return entries


def _entry(builder, use, read: ast.expr, loop, loop_sources: dict) -> tuple:
    """(kind, text, target expression, loop, uses) for a read a call makes (`read`: what it names, or the
    container of the function's own loop when `loop` is that loop's (keep, each))."""
    text = ast.unparse(read)
    if loop:
        return use.kind, f"{use.target} in {text}", read, loop, frozenset()
    through = loop_variable(read, loop_sources)
    if through is None:
        return use.kind, text, read, None, frozenset()
    return use.kind, text, loop_sources[through], (None, element_code(through, read, builder.filename)), frozenset()


def substituted(target: ast.expr, parameter: str, argument: ast.expr) -> ast.expr | None:
    """`target` (`b.attn`, `reversed(blocks)`, `model.transformer.h[i]`) with the name `parameter` replaced by
    `argument` wherever it stands; None when it does not read that name."""
    replacer = _Replace(parameter, argument)
    read = replacer.visit(copied(target))
    if not replacer.replaced:
        return None
    for node in ast.walk(read):      # no place in the cell's text: it is named by `ast.unparse`, not a span
        for attribute in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if hasattr(node, attribute):
                delattr(node, attribute)
    return read


class _Replace(ast.NodeTransformer):
    def __init__(self, parameter: str, argument: ast.expr):
        self.parameter, self.argument, self.replaced = parameter, argument, False

    def visit_Name(self, node):
        if node.id != self.parameter or not isinstance(node.ctx, ast.Load):
            return node
        self.replaced = True
        return copied(self.argument)
