"""`PATH[i]` found by `i` alone (compile/program.py, Read.at): a run holds the ModuleList that PATH names, so that
a loop's `model.transformer.h[i].output` does not evaluate `model.transformer.h[i]` at every event. That is
torch's Python code (two `Module.__getattr__` and `ModuleList.__getitem__`), run cold between two operations of
the forward: about as much as the rest of what nbgrad does at the event (bench/overhead.py, (b) against (b')).

What is held stays right while the name is bound to the same object and no module anywhere is registered or
replaced (torch's registration hooks bump `moduletree._structure_version`); the element is then read from the
ModuleList's own `_modules` by the key `ModuleList.__getitem__` would use. Anything else is left to the thunk."""
from __future__ import annotations

from torch import nn

from . import moduletree


def hold(namespace: dict, spec: tuple):
    """(root name, root object, structure version, ModuleList) for `Program.containers[use]`, when PATH names a
    ModuleList through registered submodules only (no property or plain attribute on the way), else None."""
    root_name, attributes, code = spec
    container = root = namespace.get(root_name)
    for attribute in attributes:
        modules = container.__dict__.get("_modules") if isinstance(container, nn.Module) else None
        container = modules.get(attribute) if modules is not None else None
        if container is None:
            return None
    if type(container) is not nn.ModuleList:      # a subclass may index its own way
        return None
    try:
        named = eval(code, namespace)             # what the cell's own expression names: the same, or nothing held
    except Exception:
        return None
    return (root_name, root, moduletree._structure_version[0], container) if named is container else None


def element(held: tuple, namespace: dict, at: int):
    """`container[at]` as ModuleList indexes it, while `held` is still right; else None (evaluate the thunk)."""
    root_name, root, version, container = held
    if version != moduletree._structure_version[0] or namespace.get(root_name) is not root:
        return None
    modules = container._modules
    size = len(modules)
    if not -size <= at < size:
        return None                               # the thunk raises the IndexError, with its message
    return modules.get(str(at + size if at < 0 else at))
