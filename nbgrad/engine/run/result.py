"""What a cell leaves behind (Result), and the names its saved values go by."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

_MISSING = object()
_EMPTY_FIELDS = {"shapes": dict, "leaf_grads": dict, "accumulated": set, "invokes": list, "saved_invokes": dict}


@dataclass(init=False)
class Result:
    """What a cell leaves behind: saved values by name, the hook graph, shapes of what was traced."""
    saved: dict
    graph: object
    shapes: dict = field(default_factory=dict)       # (id(module), "output" | "grad") -> shape, for the sidebar
    leaf_grads: dict = field(default_factory=dict)   # %%backward: leaf name -> its .grad
    accumulated: set = field(default_factory=set)    # leaf names whose .grad held a value before
    grad_pairs: dict = field(default_factory=dict)   # saved gradient name -> name of its tensor
    input_ids: object = None
    invokes: list = field(default_factory=list)      # the INPUT of each `with invoke(...)` block
    saved_invokes: dict = field(default_factory=dict)  # saved name -> index of the invoke that saved it

    def __init__(self, saved: dict, graph, shapes=None, leaf_grads=None, accumulated=None, grad_pairs=None,
                 input_ids=None, invokes=None, saved_invokes=None):
        # Written out rather than generated: the graph goes in without the property's call, and a field left
        # out is made empty when first read (`__getattr__`), not with every cell's result
        fields = self.__dict__
        fields["_saved"], fields["_graph"], fields["input_ids"] = saved, graph, input_ids
        if shapes is not None:
            fields["shapes"] = shapes
        if grad_pairs is not None:
            fields["_grad_pairs"] = grad_pairs
        if saved_invokes is not None:
            fields["saved_invokes"] = saved_invokes
        if leaf_grads is not None:
            fields["leaf_grads"] = leaf_grads
        if accumulated is not None:
            fields["accumulated"] = accumulated
        if invokes is not None:
            fields["invokes"] = invokes

    def __getattr__(self, name):         # only for a name not set: an empty field, made on first read
        make = _EMPTY_FIELDS.get(name)
        if make is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = self.__dict__[name] = make()
        return value

    def __getitem__(self, name):
        return self.saved[name]


class Later(tuple):
    """A value built on first read: `Result.graph` (or `.saved`) given as `Later((build, *args))` is
    `build(*args)`. A tuple, so that making one runs no Python code."""
    __slots__ = ()


def _built_when_read(name: str, doc: str) -> property:
    """A field of Result that may be given as `Later((build, *args))`: built on first read, then kept."""
    slot = "_" + name

    def read(result: Result):
        value = result.__dict__[slot]
        if type(value) is Later:
            value = result.__dict__[slot] = value[0](*value[1:])
        return value

    def write(result: Result, value) -> None:
        result.__dict__[slot] = value
    return property(read, write, doc=doc)


def _read_grad_pairs(result: Result) -> dict:
    """`Result.grad_pairs`: empty unless given; given as a `Later` (run_result), paired with the saved values when
    read."""
    value = result.__dict__.get("_grad_pairs")
    if value is None:
        value = result.__dict__["_grad_pairs"] = {}
    elif type(value) is Later:
        value = result.__dict__["_grad_pairs"] = value[0](result.saved, *value[1:])
    return value


def _write_grad_pairs(result: Result, value) -> None:
    result.__dict__["_grad_pairs"] = value


# Set after the dataclass is made: a property in the class body would be taken for the field's default.
Result.graph = _built_when_read("graph", "The hook graph of the cell (with what ran, after a run).")
Result.saved = _built_when_read("saved", "Saved values by every name the cell bound them to, in the order saved.")
Result.grad_pairs = property(_read_grad_pairs, _write_grad_pairs,
                             doc="Saved gradient name -> name of the tensor it flowed into.")


class SavedValues:
    """Every value the cell saved, by id, with the label and line it was saved at."""

    def __init__(self, scheduler):
        self.scheduler = scheduler       # whose current statement says which invoke a value belongs to
        self.by_id: dict = {}            # id -> (label, value, line)
        self.invoke_of: dict = {}        # id -> index of the invoke whose statement saved it

    def save(self, value, line=None, label=None):
        """`x.save()` in the cell (the runtime's `save`): keep x after it."""
        self.by_id[id(value)] = (label or f"line {line}", value, line or 0)
        current = self.scheduler.current
        if current is not None and current.node.spec.invoke is not None:
            self.invoke_of[id(value)] = current.node.spec.invoke
        return value


def saved_by_name(by_id: dict, bound_names: frozenset, namespace: dict) -> dict:
    """Saved values in the order they were saved, under every name the cell bound them to."""
    names: dict = {}                 # id(value) -> every name the cell bound it to, alphabetically
    containers = []
    for name in sorted(bound_names):
        value = namespace.get(name, _MISSING)
        if value is not _MISSING:
            names.setdefault(id(value), []).append(name)
            if isinstance(value, (list, tuple, dict)):
                containers.append((name, value))
    for name, value in containers:      # then elements: `hidden = [... .save() for ...]`
        if isinstance(value, dict):
            for key, element in value.items():
                names.setdefault(id(element), [f"{name}[{key!r}]"])
        else:
            for index, element in enumerate(value):
                names.setdefault(id(element), [f"{name}[{index}]"])
    in_source_order = list(by_id.items())
    previous = 0
    for _, (_, _, line) in in_source_order:     # saved in source order already, the common case: no sort
        if line < previous:
            in_source_order.sort(key=lambda item: item[1][2])
            break
        previous = line
    named = {}
    for value_id, (label, value, _) in in_source_order:
        for name in names.get(value_id, [label]):
            if name in named:         # one line saved several values (a loop): number them
                name = f"{name} #{sum(1 for k in named if k.split(' #')[0] == name) + 1}"
            named[name] = value
    return named


def run_result(by_id: dict, bound_names: frozenset, namespace: dict, graph, shapes: dict, grad_sources=None) -> Result:
    """A direct run's Result, with what is named built when first read: `Result.saved` is `saved_by_name(...)` (a
    loop of traces that reads its values from the namespace never builds it), and with gradients `Result.grad_pairs`
    is `grad_pairs(...)`. Keeps what naming needs: the bound names of saved values and of containers that hold nothing
    unsaved (a container that does is unbound from the namespace: its elements are named now), and with gradients
    the ids of every bound value (a traced value the cell did not save is unbound as the run ends) and a copy of the
    sources (the run clears its own). It runs cold, after the model's forward: one call does all of it."""
    kept, saved, bound_ids = {}, None, {} if grad_sources else None
    for name in bound_names:
        value = namespace.get(name, _MISSING)
        if value is _MISSING:
            continue
        if bound_ids is not None:
            bound_ids.setdefault(id(value), []).append(name)
        if id(value) in by_id:
            kept[name] = value
        elif saved is None and isinstance(value, (list, tuple, dict)):
            if holds_unsaved(value, by_id):
                saved = saved_by_name(by_id, bound_names, namespace)
            kept[name] = value
    return Result(saved if saved is not None else Later((saved_by_name, by_id, tuple(kept), kept)), graph, shapes,
                  grad_pairs=None if bound_ids is None else Later((pairs_of, dict(grad_sources), bound_ids)))


def names_by_id(bound_names: frozenset, namespace: dict) -> dict:
    """id(value) -> every name the cell bound it to, alphabetically."""
    names: dict = {}
    for name in sorted(bound_names):
        value = namespace.get(name, _MISSING)
        if value is not _MISSING:
            names.setdefault(id(value), []).append(name)
    return names


def grad_pairs(saved: dict, grad_sources: dict, bound_names: frozenset, namespace: dict) -> dict:
    """Which saved values are gradients, and the name of the tensor each flowed into."""
    if not grad_sources:
        return {}
    return pairs_of(saved, grad_sources, names_by_id(bound_names, namespace))


def pairs_of(saved: dict, grad_sources: dict, bound_ids: dict) -> dict:
    """`grad_pairs` from the names bound to each id: a saved value goes by its saved name, any other by the first
    of its names in alphabetical order."""
    names = {}
    for name, value in saved.items():
        names[id(value)] = name
    for value_id, bound in bound_ids.items():
        names.setdefault(value_id, min(bound))
    pairs = {}
    for name, value in saved.items():
        source = grad_sources.get(id(value))
        if source is not None and source in names:
            pairs[name] = names[source]
    return pairs


def holds_saved(value, saved_ids: set) -> bool:
    """Is this a value a run saved (by id), or a list / tuple / dict holding one?"""
    if id(value) in saved_ids:
        return True
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, (list, tuple)) and any(id(element) in saved_ids for element in value)


def holds_unsaved(value, saved_ids, depth: int = 0) -> bool:
    """Is this a tensor (or a container of tensors) from the trace that was not saved?"""
    if id(value) in saved_ids:
        return False
    if isinstance(value, torch.Tensor):
        # A plain tensor is never a Parameter: ask Parameter's isinstance hook (Python, slow cold) of others only
        return type(value) is torch.Tensor or not isinstance(value, nn.Parameter)
    if depth > 2 or isinstance(value, (str, bytes, nn.Module)):
        return False
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple, set)):
        return False
    for element in value:       # a loop, not any(...): a list of saved values costs no call per element
        if id(element) not in saved_ids and holds_unsaved(element, saved_ids, depth + 1):
            return True
    return False
