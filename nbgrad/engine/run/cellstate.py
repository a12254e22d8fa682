"""What a cell may change and must give back: grad mode, the model's requires_grad flags, the names
it binds, and the namespace slot where compiled code finds the running runtime."""
from __future__ import annotations

import operator

import torch
from torch import nn

from ..moduletree import parameter_columns
from ..compile.program import RUNTIME_NAME
from ..results.result import holds_unsaved

_MISSING = object()
# Per namespace (by id): names a trace bound to values it did not save, for the NameError hint. Kept
# here, not in the namespace, so that a cell leaves nothing of nbgrad's behind; for the namespaces used last (a loop
# of `nbgrad.trace` without one makes a namespace per call, each with an id of its own: kept, they would add up)
_unsaved: dict = {}
_UNSAVED_KEPT = 64


def unsaved_names(namespace: dict) -> dict:
    """Names the last traces in this namespace bound to traced values that they did not save -> the type
    name of the value (a tensor, or a container holding one)."""
    return _unsaved.get(id(namespace), {})


class CellState:
    """A snapshot taken before the cell runs (reading only), given back by `restore_*` after it. Every
    restore is idempotent: clean-up may run it again after an interrupt cut it short."""
    __slots__ = ("namespace", "grad_mode", "columns", "flags", "before", "outer_runtime", "loop_names")

    def __init__(self, program, namespace: dict, model: nn.Module | None, active: list):
        self.namespace = namespace
        self.grad_mode = torch.is_grad_enabled()
        # A cell that calls nothing cannot change a flag: reading them (twice) is most of a small cell's cost.
        self.columns = parameter_columns(model) if model is not None and not program.calls_nothing else None
        self.flags = _flags(self.columns) if self.columns is not None else None
        self.loop_names = program.loop_names
        self.before = before = {}        # a loop, not a comprehension: one call less, before every cell
        for name in program.bound_names:
            before[name] = namespace.get(name, _MISSING)
        outer = namespace.get(RUNTIME_NAME, _MISSING)
        # A runtime slot left by a run that is no longer active (a process killed mid-cell) is not restored.
        self.outer_runtime = outer if outer is not _MISSING and any(outer is run for run in active) else _MISSING

    def restore_grad_state(self) -> None:
        if torch.is_grad_enabled() != self.grad_mode:
            torch.set_grad_enabled(self.grad_mode)
        if self.columns is None or _flags(self.columns) == self.flags:     # the common case, read at C speed
            return
        for params, name, flag in zip(*self.columns, self.flags):
            param = params.get(name)
            if param is not None and flag is not None and param.requires_grad != flag:
                param.requires_grad_(flag)

    def unbind(self) -> None:
        """A failed cell binds no name (saved or not): each name the body binds gets back its value from before."""
        namespace = self.namespace
        for name, value in self.before.items():
            if value is _MISSING:
                namespace.pop(name, None)
            else:
                namespace[name] = value

    def restore_namespace(self, saved_ids) -> None:
        """Unbind the traced values the body bound but did not save (remembering their names), and give
        the runtime slot back to whoever held it."""
        # made (or made the most recent of those kept) for the first name to remember, not for every cell
        unsaved, fresh = _unsaved.get(id(self.namespace)), False
        for name in self.loop_names:     # an unrolled loop's own bindings: its names hold the last ones
            self.namespace.pop(name, None)
        for name in list(self.before):
            value = self.namespace.get(name, _MISSING)
            if (value is _MISSING or value is self.before[name] or id(value) in saved_ids
                    or not holds_unsaved(value, saved_ids)):
                if unsaved:
                    unsaved.pop(name, None)
            else:
                if not fresh:
                    unsaved, fresh = _remembered(id(self.namespace)), True
                unsaved[name] = type(value).__name__
                del self.namespace[name]
            del self.before[name]
        if self.outer_runtime is _MISSING:
            self.namespace.pop(RUNTIME_NAME, None)
        else:
            self.namespace[RUNTIME_NAME] = self.outer_runtime


def _remembered(namespace_id: int) -> dict:
    """The unsaved names of a namespace, made the most recent of those kept (the oldest given up past the limit)."""
    names = _unsaved.pop(namespace_id, None)
    if names is None:
        names = {}
        if len(_unsaved) >= _UNSAVED_KEPT:
            _unsaved.pop(next(iter(_unsaved)))
    _unsaved[namespace_id] = names
    return names


_requires_grad = operator.attrgetter("requires_grad")


def _flags(columns: tuple) -> list:
    """requires_grad of the parameter in each slot now (None for a slot emptied since)."""
    params = list(map(dict.get, *columns))
    try:
        return list(map(_requires_grad, params))
    except AttributeError:             # a slot set to None: read one by one
        return [None if param is None else param.requires_grad for param in params]
