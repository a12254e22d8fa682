"""What the engine needs to know of a model's module tree, cached: the module inside a `torch.compile`d
one, and every parameter slot (for the requires_grad snapshot), dropped whenever any module or parameter
is registered anywhere."""
from __future__ import annotations

import weakref

from torch import nn
from torch.nn.modules.module import (register_module_module_registration_hook,
                                     register_module_parameter_registration_hook)


def compiled_inner(model):
    """The module inside a `torch.compile`d one (`OptimizedModule._orig_mod`), or None for any other."""
    if type(model).__name__ == "OptimizedModule":
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            return inner
    return None


# Every cell restores the model's requires_grad flags, so it needs the model's parameters. Walking the
# module tree costs more than the rest of a cell's overhead; the list is cached per model and dropped
# whenever any module or parameter is registered anywhere (torch's public registration hooks).
_structure_version = [0]
_parameter_cache: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _structure_changed(*_):
    _structure_version[0] += 1


register_module_module_registration_hook(_structure_changed)
register_module_parameter_registration_hook(_structure_changed)


def parameter_slots(model: nn.Module) -> tuple:
    """(module, name) of every parameter of the model, shared ones once (cached until the structure of any
    module changes). Slots, not Parameter objects: accelerate's offload swaps the objects in a module's
    `_parameters` at every call without registering them, so a cell reads and restores the current one."""
    cached = _parameter_cache.get(model)
    if cached is not None and cached[0] == _structure_version[0]:
        return cached[1]
    slots, seen, stack = [], set(), [model]
    while stack:
        module = stack.pop()
        for name, param in module._parameters.items():
            if param is not None and id(param) not in seen:
                seen.add(id(param))
                slots.append((module, name))
        stack.extend(child for child in module._modules.values() if child is not None)
    slots = tuple(slots)
    columns = (tuple(module._parameters for module, _ in slots), tuple(name for _, name in slots))
    _parameter_cache[model] = (_structure_version[0], slots, columns)
    return slots


def parameter_columns(model: nn.Module) -> tuple:
    """`parameter_slots` as two columns, (each slot's `_parameters` dict, its name), for C-speed reads:
    `map(dict.get, dicts, names)` gives the parameters in the slots now."""
    parameter_slots(model)
    return _parameter_cache[model][2]
