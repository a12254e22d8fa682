"""Reads `PATH[i].output` in a loop, and `PATH[-1].output`, that a run may answer from the ModuleList PATH names
without evaluating `PATH[i]` (Program.containers, Read.at, run/elements.py)."""
from __future__ import annotations

import ast

from .astcopy import copied
from .cellast import EVENT_ATTRS, const


def element_index(builder, use: int, target: ast.expr) -> ast.expr:
    """The index `i` of a read `PATH[i].output` at the cell's level, a name (a loop's), an integer (`PATH[-1]`) or
    a negated name (`PATH[-i]`: found as an integer is, from its value at each event), with PATH a chain of
    attributes of a name that is the namespace's wherever the cell reads it (no statement binds it, no function
    takes it), recorded in `builder.containers`; else `None`. Reading the name again is harmless."""
    if builder.function is not None or not isinstance(target, ast.Subscript) or not _is_index(target.slice):
        return const(None)
    attributes, root = [], target.value
    while isinstance(root, ast.Attribute) and root.attr not in EVENT_ATTRS and root.attr != "source":
        attributes.append(root.attr)
        root = root.value
    if not attributes or not isinstance(root, ast.Name) or root.id not in builder.globals_only:
        return const(None)
    builder.containers[use] = (root.id, tuple(reversed(attributes)), isinstance(target.slice, ast.Name))
    return copied(target.slice)


def _is_index(node: ast.expr) -> bool:
    """A name or an integer constant, or either negated (`i`, `3`, `-1`, `-i`)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Name) or isinstance(node, ast.Constant) and type(node.value) is int


def argument_names(statements) -> set:
    """Every name a function or lambda of these statements takes as an argument: such a name may not be the
    namespace's where it is read."""
    return {node.arg for stmt in statements for node in ast.walk(stmt) if isinstance(node, ast.arg)}
