"""What a cell may change and must give back: grad mode, the model's requires_grad flags, the names
it binds, and the namespace slot where compiled code finds the running runtime."""
from __future__ import annotations

import torch
from torch import nn

from .models import parameters_of
from .program import RUNTIME_NAME

UNSAVED_KEY = "__nbgrad_unsaved__"      # names a trace bound to values it did not save (for the NameError hint)
_MISSING = object()


class CellState:
    """A snapshot taken before the cell runs, given back by `restore_*` after it."""

    def __init__(self, program, namespace: dict, model: nn.Module | None):
        self.namespace = namespace
        self.grad_mode = torch.is_grad_enabled()
        self.flags = [(param, param.requires_grad) for param in parameters_of(model)] if model is not None else []
        self.before = {name: namespace.get(name, _MISSING) for name in program.bound_names}
        self.outer_runtime = namespace.get(RUNTIME_NAME, _MISSING)

    def install(self, runtime) -> None:
        self.namespace[RUNTIME_NAME] = runtime
        self.namespace.setdefault("__builtins__", __builtins__)

    def restore_grad_state(self) -> None:
        torch.set_grad_enabled(self.grad_mode)
        for param, flag in self.flags:
            if param.requires_grad != flag:
                param.requires_grad_(flag)

    def restore_namespace(self, saved_ids) -> None:
        """Unbind the traced values the body bound but did not save (remembering their names), and give
        the runtime slot back to whoever held it."""
        unsaved = self.namespace.setdefault(UNSAVED_KEY, set())
        for name, before in self.before.items():
            value = self.namespace.get(name, _MISSING)
            if value is _MISSING or value is before or not _holds_unsaved(value, saved_ids):
                unsaved.discard(name)
            else:
                del self.namespace[name]
                unsaved.add(name)
        if self.outer_runtime is _MISSING:
            self.namespace.pop(RUNTIME_NAME, None)
        else:
            self.namespace[RUNTIME_NAME] = self.outer_runtime
        self.before.clear()


def _holds_unsaved(value, saved_ids, depth: int = 0) -> bool:
    """Is this a tensor (or a container of tensors) from the trace that was not saved?"""
    if id(value) in saved_ids or isinstance(value, nn.Parameter):
        return False
    if isinstance(value, torch.Tensor):
        return True
    if depth > 2 or isinstance(value, (str, bytes, nn.Module)):
        return False
    if isinstance(value, dict):
        return any(_holds_unsaved(v, saved_ids, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return any(_holds_unsaved(v, saved_ids, depth + 1) for v in value)
    return False
