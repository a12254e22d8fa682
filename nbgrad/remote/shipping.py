"""What a cell sends: the values of the free names its body reads, the handle and its modules as markers
(the actor puts its own model and modules in their place). A value that cannot be pickled is an error before
anything runs."""
from __future__ import annotations

import ast
import textwrap

from ..engine.compile.dataflow import bound_names, read_names
from ..datasets.ray_engine import check_picklable
from .kept import markers
from .paths import MODEL, ModulePath, RemotePath


def free_names(source: str) -> set:
    tree = ast.parse(textwrap.dedent(source))
    if not tree.body:
        return set()
    bound = set().union(*(bound_names(stmt)[0] for stmt in tree.body))
    return set().union(*(read_names(stmt) for stmt in tree.body)) - bound


def shipped_names(source: str, namespace: dict, handle) -> dict:
    """The body's free names with their values, ready to send."""
    shipped = {}
    for name in sorted(free_names(source)):
        if name not in namespace:
            continue
        value = namespace[name]
        if value is handle:
            shipped[name] = MODEL
        elif isinstance(value, RemotePath) and value._handle is handle:
            shipped[name] = ModulePath(value._path)
        else:
            value = markers(value, handle)       # a tensor the actor kept goes as its marker: the original is there
            picklable(f"the name `{name}`", value)
            shipped[name] = value
    return shipped


def picklable(what: str, value) -> None:
    check_picklable(what, value, "a remote model's cell sends the names it reads to the model's actor",
                     "Make it in the cell, or give the actor what it needs with `.call(fn, ...)`")
