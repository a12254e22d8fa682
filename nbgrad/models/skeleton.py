"""What a model held elsewhere (`nbgrad.remote`'s handle, one of its modules) stands for in the notebook: a module
of its skeleton, the same tree on `meta`, which answers what needs only the module tree (a forward's sites, the
sidebar's tree, canonical names) without asking the model's actor."""
from __future__ import annotations


def on_skeleton(value):
    """The skeleton's module that a remote model or one of its modules stands for (its `nbgrad_skeleton`, a
    property of its class); anything else as it is."""
    if isinstance(getattr(type(value), "nbgrad_skeleton", None), property):
        return value.nbgrad_skeleton
    return value
