"""A cell that names `model.embedd` or `model.layer[0]`, near a canonical root name but not one, is not taken as
canonical (nothing in it is), so the real model refuses it; on a model of a known family that error says which
canonical name was probably meant."""
from __future__ import annotations

import ast
import difflib
import functools
import inspect

from torch import nn

from ..errors import NbgradError
from .detect import family_name, family_of
from .vocabulary import ROOT_NAMES


def root_misspelling_hinted(function):
    """Decorate a public call that takes `model`, `source` and `namespace`: its AttributeError over a name near a
    canonical root name says `did you mean model.embed?` (in the message of nbgrad's own error, else as a note)."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except AttributeError as error:
            arguments = signature.bind_partial(*args, **kwargs).arguments
            hint_root_misspelling(error, arguments.get("model"), arguments.get("source"), arguments.get("namespace"))
            raise
    return call


def hint_root_misspelling(error: BaseException, model, source, namespace) -> BaseException:
    """An AttributeError over a name near a canonical root name says which was meant; returns `error`."""
    if not isinstance(error, AttributeError) or getattr(error, "_nbgrad_root_hinted", False) or \
            not isinstance(model, nn.Module) or not isinstance(source, str) or family_of(model) is None:
        return error
    found = _misspelt_root(error, model, source, namespace)
    if found is None:
        return error
    line, hint = found
    if isinstance(error, NbgradError):
        error.detail = f"{error.detail}. {hint}"
        error.args = (f"line {error.line}: {error.detail}" if error.line else error.detail,) + error.args[1:]
    else:
        error.add_note(f"nbgrad: line {line}: {hint}")
    error._nbgrad_root_hinted = True
    return error


def _misspelt_root(error, model: nn.Module, source: str, namespace) -> tuple | None:
    """(line, what to say) for the first `ROOT.attr` of the cell, ROOT a name of `model`, that the model has not got
    and `error` names, near a canonical root name."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    roots = {name for name, value in namespace.items() if value is model} if isinstance(namespace, dict) else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in (roots or {"model"}) and node.attr not in ROOT_NAMES and \
                f"'{node.attr}'" in str(error) and not hasattr(model, node.attr):
            near = difflib.get_close_matches(node.attr, ROOT_NAMES, n=1, cutoff=0.6)
            if near:
                root = node.value.id
                return node.lineno, (f"{root}.{node.attr} is not a canonical name of the {family_name(model)} "
                                     f"family either; did you mean {root}.{near[0]}?")
    return None
