"""Which module events the runtime may hook before the model runs (Target): the paths a cell names, every
element of a loop's container, and what the cell's own functions read of what a call passes them
(`def attn_of(b): return b.attn.output[0]` called as `[attn_of(b) for b in reversed(model.transformer.h)]`),
so that statements may read them in any order."""
from __future__ import annotations

import ast
import copy
import dataclasses

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
    targets, seen, same, names = [], set(), {}, free | alias_at.keys()
    for index, use in enumerate(builder.uses):
        same[use.kind, use.target] = same.get((use.kind, use.target), frozenset()) | {index}
    entries = [(use.kind, use.target, target, loop, same[use.kind, use.target])
               for use, target, loop in zip(builder.uses, builder.use_ast, builder.use_loop)]
    for kind, text, target, loop, uses in entries + _through_calls(builder):
        keep, each = loop or (None, None)
        if kind == "grad" or (kind, text, keep) in seen:
            continue
        if loop and is_module_iterable(target, names):  # `[b.attn.output for b in reversed(model.transformer.h)]`
            found = Target(kind, builder._text(target), builder._eval_code(target), every_element=True, keep=keep,
                           each=each, base=(base := innermost_path(target)) and builder._eval_code(base))
        elif is_path(target, names):
            found = Target(kind, text, builder._eval_code(target), uses=uses)
        elif (indexed := indexed_container(target, names, builder.filename)) is not None:  # `P[i]`, `P[i].attn`
            found = Target(kind, builder._text(indexed[0]), builder._eval_code(indexed[0]), every_element=True,
                           each=indexed[1])
        else:
            continue
        seen.add((kind, text, keep))   # once it names a target: text read inside a function may name one through a call
        needs = frozenset().union(*(alias_at[name] for name in read_names(target) if name in alias_at))
        targets.append(dataclasses.replace(found, needs=needs) if needs else found)
    return targets


def _through_calls(builder) -> list:
    """Target entries for the reads inside the cell's functions, one per call: the read with the function's
    parameter replaced by what the call passes it (`b.attn` for `attn_of(b)`), seen from the calling
    statement's loops. A read through a loop of the function's own is left as it is."""
    entries = []
    for call in builder.calls:
        if any(isinstance(argument, ast.Starred) for argument in call.args):
            continue          # `f(*blocks)`: which parameter gets what is not known here
        for use, target, loop, context in zip(builder.uses, builder.use_ast, builder.use_loop, builder.use_function):
            if loop or context is None or context[0] != call.function:
                continue
            for position, parameter in enumerate(context[1]):
                argument = call.args[position] if position < len(call.args) else call.keywords.get(parameter)
                read = substituted(target, parameter, argument) if argument is not None else None
                if read is None:
                    continue
                through = loop_variable(read, call.loop_sources)
                text = ast.unparse(read)
                if through is None:
                    entries.append((use.kind, text, read, None, frozenset()))
                else:
                    each = element_code(through, read, builder.filename)
                    entries.append((use.kind, text, call.loop_sources[through], (None, each), frozenset()))
    return entries


def substituted(target: ast.expr, parameter: str, argument: ast.expr) -> ast.expr | None:
    """`target` (`b.attn`, `b.attn.source.SITE`) with its root name `parameter` replaced by `argument`;
    None when its root is another name (or it has none)."""
    read = copy.deepcopy(target)
    parent, field, node = None, None, read
    while isinstance(node, (ast.Attribute, ast.Subscript)) or opens_source(node):
        if opens_source(node):
            parent, field, node = node, "args", node.args[0]
        else:
            parent, field, node = node, "value", node.value
    if not isinstance(node, ast.Name) or node.id != parameter:
        return None
    if parent is None:
        return copy.deepcopy(argument)
    if field == "args":
        parent.args[0] = copy.deepcopy(argument)
    else:
        parent.value = copy.deepcopy(argument)
    return read
