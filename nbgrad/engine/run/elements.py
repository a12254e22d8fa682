"""`PATH[i]` found by `i` alone (compile/program.py, Read.at): a run does not evaluate `model.transformer.h[i]` at
every event of a loop, nor `model.transformer.h[-1]` for the one read of the common cell: torch's Python code (two
`Module.__getattr__`, `ModuleList.__getitem__`), run cold, about as much as the rest of an event ((b) against (b')).
`find`: where no class on the path has an attribute of the path's names, nor a `__getattr__` or `__getattribute__` of
its own, evaluating the path is looking each name up in `_modules`, and indexing the ModuleList is reading its
`_modules` by the key its `__getitem__` would use (a Sequential's, by place); else the path is evaluated as written.
`walk` does the same for any path of names and constant indices (the one-read cell's, an on-event statement's).
`hold` and `element`, for a loop: on a large model even that lookup, inside the forward, costs more than the rest of an
event (its dicts are out of the machine's caches: 8 us more per event on the GPT-2-small shape, `bench/phases.py
--small`). So a run looks PATH up once, keeps its blocks by index and answers from them while no module anywhere is
registered or replaced (`moduletree._structure_version`), the name is bound to the same object and PATH keeps as many
blocks (deleting one renumbers the rest, and registers nothing). Anything else is left to the expression."""
from __future__ import annotations

from itertools import islice

from torch import nn

from .. import moduletree

_GETATTR, _GETATTRIBUTE = nn.Module.__getattr__, nn.Module.__getattribute__
_PLAIN_KEPT = 512
_plain: dict = {}           # (class, attribute name) -> whether an instance looks it up as Module.__getattr__ does


def find(namespace: dict, spec: tuple, at: int | None = None):
    """`PATH[at]` of `Program.containers[use]` (PATH itself for `at` None, when it is a ModuleList), looked up in
    `_modules` as evaluating it does (`walk`); else None (evaluate it)."""
    if at is not None:
        return walk(namespace, spec[0], spec[1] + (at,))
    node = walk(namespace, spec[0], spec[1])
    return node if type(node) is nn.ModuleList else None     # a subclass may index its own way


def walk(namespace: dict, root: str, steps: tuple):
    """`ROOT.A[i].B` (steps `("A", i, "B")`) looked up in `_modules` as evaluating it does: each attribute where the
    class on the path is plain (`plain_attribute`), each index of a ModuleList or Sequential (`indexed`); else None
    (evaluate it). With no steps, whatever the namespace binds ROOT to."""
    node = namespace.get(root)
    for step in steps:
        if type(step) is int:
            node = indexed(node, step)
            if node is None:
                return None
            continue
        plain = _plain.get((type(node), step))
        if plain is None:
            plain = plain_attribute(type(node), step)
        if not plain:
            return None
        found = node.__dict__
        node = found["_modules"].get(step)
        if node is None or step in found:
            return None
    return node


def indexed(node, at: int):
    """`node[at]` as the `__getitem__` of ModuleList or Sequential finds it (not a subclass's, which may index its own
    way); None for any other node, or for `at` out of range (the expression raises the IndexError, with its message)."""
    kind = type(node)
    if kind is not nn.ModuleList and kind is not nn.Sequential:
        return None
    modules = node._modules
    size = len(modules)
    if not -size <= at < size:
        return None
    if kind is nn.ModuleList:
        return modules.get(str(at + size if at < 0 else at))      # by its key
    return next(islice(modules.values(), at % size, None))        # by its place


def plain_attribute(cls: type, attribute: str) -> bool:
    """Whether `obj.attribute`, for an instance of `cls` without that key in its `__dict__`, is Module.__getattr__'s
    lookup: a Module class that looks names up no way of its own, none of whose classes has an attribute of that
    name (a property, a method). Kept per class and name."""
    plain = (issubclass(cls, nn.Module) and cls.__getattr__ is _GETATTR and cls.__getattribute__ is _GETATTRIBUTE
             and not any(attribute in vars(base) for base in cls.__mro__))
    if len(_plain) >= _PLAIN_KEPT:                # classes made again and again (a cell that defines one)
        _plain.clear()
    _plain[(cls, attribute)] = plain
    return plain


def hold(namespace: dict, spec: tuple):
    """(root name, root, the structure version's list, its value, PATH's `_modules`, its blocks by index) for a
    loop's `Program.containers[use]`, when `find` finds PATH and none of its blocks is compiled; else None."""
    container = find(namespace, spec)
    if container is None:
        return None
    modules = container._modules
    blocks = []
    for index in range(len(modules)):
        block = modules.get(str(index))           # as ModuleList.__getitem__ finds it
        if block is None or type(block).__name__ == "OptimizedModule":
            return None                           # a compiled block: the expression's, unwrapped (DirectEvents._read)
        blocks.append(block)
    versions = moduletree._structure_version      # the list itself: one object to read at every event
    return spec[0], namespace.get(spec[0]), versions, versions[0], modules, blocks


def element(held: tuple, namespace: dict, at: int):
    """`PATH[at]` from what `hold` kept, while it is still right; else None (evaluate the expression)."""
    root_name, root, versions, version, modules, blocks = held
    size = len(blocks)
    if (versions[0] != version or namespace.get(root_name) is not root
            or len(modules) != size or not -size <= at < size):
        return None                               # out of range: the expression raises the IndexError, with its message
    return blocks[at]
