"""`model.transformer.h[0].output.grd`: an attribute near `grad` of an event's value, which no tensor has. Said when
the cell is compiled, with its line, before anything runs (a remote model's cell is then never sent)."""
from __future__ import annotations

import ast
import difflib

import torch

from ...errors import NbgradError
from .cellast import MODULE_EVENTS


class EventNameError(NbgradError, AttributeError):
    """A misspelled `.grad` of an event's value."""


def check_grad_names(tree: ast.AST) -> None:
    """Raise EventNameError for the first `EVENT ... .NAME` of the cell where NAME is close to `grad` and is no
    attribute of a tensor, tuple or dict (what an event's value is)."""
    for node in sorted(_misspelled(tree), key=lambda found: (found.lineno, found.col_offset)):
        value = ast.unparse(node.value)
        raise EventNameError(f"{value} has no attribute `.{node.attr}`: did you mean `.grad`? (the gradient of "
                             f"an event's value is `{value}.grad`)", node.lineno)


def _misspelled(tree: ast.AST) -> list:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr != "grad"
            and difflib.get_close_matches(node.attr, ("grad",), n=1, cutoff=0.6)
            and not any(hasattr(kind, node.attr) for kind in (torch.Tensor, tuple, dict)) and _of_an_event(node.value)]


def _of_an_event(expr: ast.AST) -> bool:
    """Whether a chain (`M.output[0].logits`) hangs from a module's event."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        if isinstance(expr, ast.Attribute) and expr.attr in MODULE_EVENTS:
            return True
        expr = expr.value
    return False
