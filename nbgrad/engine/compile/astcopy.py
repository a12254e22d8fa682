"""Copies of a cell's syntax tree. Python's parser shares one node per context and operator (`Load`, `Store`, `Add`,
...) among every tree it makes, and a library that walks a tree setting attributes on each node sets them on those
shared ones too: IPython's tracebacks (through `executing`) give every node a `parent`, so after the first traceback
in a notebook the shared `Load` points into some earlier tree, that one into another, and `copy.deepcopy` of any cell
copied them all (a cell that unrolls a loop of invokes, copied before every run, went from milliseconds to seconds in
a long session). A copy here shares those nodes, as the parser does, and copies the rest."""
from __future__ import annotations

import ast
import copy

SHARED = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)


def copied(tree):
    """A deep copy of `tree` (a node, or a list of nodes) whose context and operator nodes are the originals."""
    memo = {id(node): node for root in (tree if isinstance(tree, list) else [tree])
            for node in ast.walk(root) if isinstance(node, SHARED)}
    return copy.deepcopy(tree, memo)
