"""The notebook's copy of a remote model: the same module tree, every parameter and buffer on `meta` (no
weights, no memory). Made on the actor from the model it holds, so a factory's model has one too."""
from __future__ import annotations

import copy

import torch
from torch import nn


def skeleton_of(model: nn.Module) -> nn.Module:
    """A copy of `model` whose tensors are on `meta`: deepcopy with every parameter and buffer given in the memo
    as its meta twin, so no weight is copied (a meta tensor made from a real one allocates nothing)."""
    memo: dict = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) in memo:
            continue
        meta = tensor.detach().to("meta")
        memo[id(tensor)] = nn.Parameter(meta, requires_grad=tensor.requires_grad) \
            if isinstance(tensor, nn.Parameter) else meta
    skeleton = copy.deepcopy(model, memo)
    skeleton.eval() if not model.training else skeleton.train()
    return skeleton


def on_cpu(value, copies: dict | None = None):
    """What a cell bound, as values that can cross to a machine without the actor's devices: tensors detached
    and copied to CPU (one copy of a tensor held twice), containers and a Cache part by part."""
    from ..engine.results.cache import Cache
    copies = {} if copies is None else copies
    if isinstance(value, torch.Tensor):
        copy_ = copies.get(id(value))
        if copy_ is None:
            copy_ = copies[id(value)] = value.detach().to("cpu", copy=True)
        return copy_
    if isinstance(value, Cache):
        moved = Cache(value.options)
        for part in ("_outputs", "_inputs", "_grads"):
            setattr(moved, part, {path: on_cpu(v, copies) for path, v in getattr(value, part).items()})
        return moved
    if type(value) in (list, tuple):
        return type(value)(on_cpu(v, copies) for v in value)
    if isinstance(value, list):
        return type(value)(on_cpu(v, copies) for v in value)
    if isinstance(value, dict):
        moved = copy.copy(value)
        for key in list(value.keys()):
            moved[key] = on_cpu(value[key], copies)
        return moved
    return value
