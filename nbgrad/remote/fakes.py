"""A model's fake twin, for `nbgrad.scan`: the same module tree, every parameter and buffer a FakeTensor (a shape,
a dtype, no data, no memory), made from a local model or from a remote model's skeleton alike.

No fake mode is active while the twin runs: only the twin's tensors are fake, and every operation that touches
one is computed by torch's fake kernels (its `FakeTensorMode`, with `allow_non_fake_inputs`). What the model
computes from the INPUT alone (the attention mask, position ids, cache positions) stays real, so the
data-dependent checks that model code makes on them (`padding_mask.all()`, a vocabulary range check) get their
true answers. A fake mode around the whole run (every tensor fake) fails on exactly those checks (a ShapeEnv only
turns their answers into unbacked symbols that the same `if` cannot decide).

The mode has a ShapeEnv all the same, for what the cell itself asks of a fake: `.item()` is an unbacked symbol (a
cell may keep `norm().item()` in a list), and a size that depends on the data (`h[h > 0]`, `nonzero`) is one
too (`u0` in a scan's table). Only a Python branch on such a value cannot be decided (scan.py says so)."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .paths import RemotePath

# The hook dictionaries of a module: a twin starts with none (a persistent edit's hooks belong to the model)
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")


def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


def fake_twin(model: nn.Module, mode) -> nn.Module:
    """A copy of `model` (a local model, or a skeleton on `meta`) whose tensors are fakes on the CPU: deepcopy with
    every parameter and buffer given in the memo as its fake, so no weight is copied."""
    memo: dict = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) not in memo:
            fake = _fake(tensor, mode)
            memo[id(tensor)] = nn.Parameter(fake, requires_grad=tensor.requires_grad) \
                if isinstance(tensor, nn.Parameter) else fake
    placed = _placement_hooks(model, memo)
    twin = copy.deepcopy(model, memo)
    _without_hooks(twin, placed)
    return twin


def _fake(tensor: torch.Tensor, mode) -> torch.Tensor:
    """An empty fake of `tensor`'s shape and strides on the CPU, made under `mode`, which is off again after it, an
    interrupt included: one that lands as the `with` block ends, before its `__exit__` runs, is caught up with here."""
    try:
        with mode:
            return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
    finally:
        if mode in _get_current_dispatch_mode_stack():
            mode.__exit__(None, None, None)


def _placement_hooks(model: nn.Module, memo: dict) -> bool:
    """Whether accelerate placed the model; if so each of its hooks goes in the memo as a bare one, so that the
    weights an offloading hook holds (its `weights_map`) are not copied with the module."""
    hooks = [module._hf_hook for module in model.modules() if "_hf_hook" in module.__dict__]
    if hooks:
        from accelerate.hooks import ModelHook
        memo.update((id(hook), ModelHook()) for hook in hooks)
    return bool(hooks)


def _without_hooks(twin: nn.Module, placed: bool) -> None:
    """No hook of the model's (an edit's) and no placement hook of accelerate's (its devices are the model's, not
    the twin's, which lives on the CPU) stays on the twin."""
    if placed:
        from accelerate.hooks import remove_hook_from_module
        remove_hook_from_module(twin, recurse=True)
    for module in twin.modules():
        for name in _HOOK_DICTS:
            hooks = getattr(module, name, None)
            if hooks:
                hooks.clear()


def twin_names(namespace: dict, read: set, model, twin: nn.Module) -> dict:
    """The namespace for the cell's run on the twin: the model (a local one or a remote handle) and its modules
    as the twin's; of the names the cell reads, tensors as copies (a cell's in-place edit of one stays in the
    scan) and lists, tuples and dicts part by part; anything else as it is."""
    twins = dict(zip((id(module) for module in _modules_of(model)), twin.modules()))
    names = {}
    for name, value in namespace.items():
        if name in read:
            names[name] = _twin_value(value, model, twin, twins)
        elif value is model or isinstance(value, (nn.Module, RemotePath)):
            names[name] = _twin_value(value, model, twin, twins)
        else:
            names[name] = value
    return names


def _modules_of(model):
    return model.skeleton.modules() if hasattr(model, "skeleton") and not isinstance(model, nn.Module) \
        else model.modules()


def _twin_value(value, model, twin, twins: dict):
    if value is model:
        return twin
    if isinstance(value, RemotePath) and value._handle is model:
        return twin.get_submodule(value._path)
    if isinstance(value, nn.Module):
        return twins.get(id(value), value)
    if isinstance(value, torch.Tensor):
        return value.clone()
    if type(value) in (list, tuple):
        return type(value)(_twin_value(v, model, twin, twins) for v in value)
    if type(value) is dict:
        return {key: _twin_value(v, model, twin, twins) for key, v in value.items()}
    return value
