"""Values with autograd history that a remote cell bound. Their graph cannot travel: the actor keeps the tensor
(and so its graph) while the notebook holds the copy that came back, and the copy says where its original is
(`copy.nbgrad_kept`). So `%%backward LOSS` of such a copy runs the pass on the actor, and a later cell that reads
the copy is given the original there, as a local cell would be. When the copy is gone, the actor drops the
original with the next request."""
from __future__ import annotations

import weakref

import torch

from .paths import Kept


class KeptOn:
    """What a copy carries: the handle, the actor it came from (the handle's generation), its number there."""

    def __init__(self, handle, generation: int, number: int):
        self.handle, self.generation, self.number = handle, generation, number

    def live(self) -> bool:
        return self.generation == self.handle._generation

    def __reduce__(self):     # pickled (torch.save, another cluster): an empty set there, which says nothing is kept
        return set, ()

    def __deepcopy__(self, memo):         # a deep copy is another tensor: the actor keeps nothing for it
        return set()

    def nbgrad_backward(self, loss, source: str, namespace, **options):
        """`nbgrad.backward(copy, ...)`: the pass runs on the actor, from the original (backward.py)."""
        return self.handle.nbgrad_backward(self, source, namespace, **options)


def mark(handle, kept: dict) -> None:
    """The copies that came back for tensors the actor kept: each says where its original is, and its end is
    told to the actor."""
    for number, copy in kept.items():
        copy.nbgrad_kept = KeptOn(handle, handle._generation, number)
        weakref.finalize(copy, handle._forget, handle._generation, number)


def kept_on(value, handle):
    """The Kept marker for a copy of a tensor `handle`'s live actor kept, else None."""
    where = getattr(value, "nbgrad_kept", None) if isinstance(value, torch.Tensor) else None
    return Kept(where.number) if isinstance(where, KeptOn) and where.handle is handle and where.live() else None


def markers(value, handle):
    """`value` with each copy of a kept tensor (also inside lists, tuples and dicts) replaced by its marker; the
    value itself when it holds none."""
    marker = kept_on(value, handle)
    if marker is not None:
        return marker
    if type(value) in (list, tuple):
        parts = [markers(part, handle) for part in value]
        return type(value)(parts) if any(a is not b for a, b in zip(parts, value)) else value
    if type(value) is dict:
        parts = {key: markers(part, handle) for key, part in value.items()}
        return parts if any(parts[key] is not value[key] for key in value) else value
    return value


def tensors_in(value):
    """The tensors in a value (a tensor, or lists, tuples and dicts of them, at any depth)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif type(value) in (list, tuple):
        for part in value:
            yield from tensors_in(part)
    elif type(value) is dict:
        for part in value.values():
            yield from tensors_in(part)


def originals(value, holder):
    """On the actor: `value` with each marker replaced by the tensor it names."""
    if isinstance(value, Kept):
        return holder.kept_value(value)
    if type(value) in (list, tuple):
        return type(value)(originals(part, holder) for part in value)
    if type(value) is dict:
        return {key: originals(part, holder) for key, part in value.items()}
    return value
