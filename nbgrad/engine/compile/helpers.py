"""Helpers from earlier cells: a function defined in an earlier cell (its source is in IPython's line cache)
that reads or edits events pauses at them when a cell calls it directly, like a function the cell defines.
The cell is compiled again with the helper's source (cached like any cell)."""
from __future__ import annotations

import ast
import inspect
import textwrap
import types
from functools import lru_cache

from .cellast import can_pause_in, makes_invokes
from .compiler import compile_cell
from .dataflow import called_names
from .inline import inlined
from .methods import method_of, plain_method
from .unroll import NeedsElements, elements_of


def compile_with_helpers(source: str, mode: str, namespace: dict | None):
    """The cell's Program, with the helpers it calls directly (if any) compiled into it (a helper that makes
    invokes inlined: inline.py), and its loops that make invokes or rebind a name whose `.grad` it reads unrolled
    over their elements in `namespace` (unroll.py)."""
    try:
        program = compile_cell(source, mode)
        if namespace is None or not program.called_names:      # the common cell: one cached compile, no lookup
            return program
        called = program.called_names
    except NeedsElements:
        program, called = None, called_names(ast.parse(textwrap.dedent(source)).body)
    helpers = _helpers_of(called, namespace if namespace is not None else {})
    if program is not None and not helpers:
        return program
    try:
        return compile_cell(source, mode, helpers)
    except NeedsElements:
        body = inlined(ast.parse(textwrap.dedent(source)).body, helpers)
        elements = elements_of(body, namespace if namespace is not None else {})
        return compile_cell(source, mode, helpers, elements)


def called_helpers(source: str, mode: str, namespace: dict | None) -> tuple:
    """(name, source) of each helper from an earlier cell that the cell calls directly, by name."""
    try:
        called = compile_cell(source, mode).called_names
    except NeedsElements:
        called = called_names(ast.parse(textwrap.dedent(source)).body)
    return _helpers_of(called, namespace) if namespace is not None and called else ()


def _helpers_of(called: frozenset, namespace: dict) -> tuple:
    """(key, source) of each helper: a function by its name, a notebook object's method by its key (methods.py)."""
    found = []
    for key in sorted(called):
        text = None if "." in key or key.endswith("()") else helper_source(namespace.get(key), namespace)
        if text is None and "." not in key and not key.endswith("()"):
            key = f"{key}()"         # `lora(...)`: calling an object of a notebook class runs its method
        if text is None and (method := method_of(key, namespace)) is not None:
            text = _event_source(method.__code__, method.__name__, True)
        if text is not None:
            found.append((key, text))
    return tuple(found)


def helper_source(function, namespace: dict) -> str | None:
    """The source of a plain function defined at the top level of a cell run in `namespace` (its globals)
    whose body uses module events; None for anything else (library functions, closures, decorated ones)."""
    if not isinstance(function, types.FunctionType) or function.__globals__ is not namespace:
        return None
    if function.__code__.co_freevars or function.__qualname__ != function.__name__:
        return None
    return _event_source(function.__code__, function.__name__)


@lru_cache(maxsize=256)
def _event_source(code: types.CodeType, name: str, method: bool = False) -> str | None:
    try:
        text = textwrap.dedent(inspect.getsource(code))
        tree = ast.parse(text)
    except (OSError, TypeError, SyntaxError):
        return None
    definition = tree.body[0] if len(tree.body) == 1 else None
    if not (isinstance(definition, ast.FunctionDef) and definition.name == name
            and (plain_method(definition) if method else can_pause_in(definition) or makes_invokes(definition))):
        return None
    return text
