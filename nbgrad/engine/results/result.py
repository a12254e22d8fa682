"""What a cell leaves behind (Result), and the names its saved values go by."""
from __future__ import annotations

import copy

import torch
from torch import nn

_MISSING = object()


class Later(tuple):
    """A value built on first read: `Result.saved` (or `.graph`) given as `Later((build, *args))` is `build(*args)`;
    `.grad_pairs` is `build(result.saved, *args)`. A tuple, so that making one runs no Python code."""
    __slots__ = ()


class Result:
    """What a cell leaves behind: saved values by name, the hook graph, shapes of what was traced. `saved`, `graph`,
    `grad_pairs` and `saved_invokes` may be given as a `Later`: built when first read, then kept."""
    FIELDS = ("saved", "graph", "shapes", "leaf_grads", "accumulated", "grad_pairs", "input_ids", "invokes",
              "saved_invokes")       # what `repr` shows, in this order

    def __init__(self, saved: dict, graph, shapes=None, leaf_grads=None, accumulated=None, grad_pairs=None,
                 input_ids=None, invokes=None, saved_invokes=None):
        self._saved, self._graph, self._grad_pairs = saved, graph, grad_pairs
        self.shapes = {} if shapes is None else shapes       # (id(module), "output" | "grad") -> shape, for the sidebar
        self.leaf_grads = {} if leaf_grads is None else leaf_grads           # %%backward: leaf name -> its .grad
        self.accumulated = set() if accumulated is None else accumulated     # leaf names whose .grad held a value
        self.input_ids = input_ids
        self.invokes = [] if invokes is None else invokes                    # the INPUT of each `with invoke(...)`
        self._saved_invokes = saved_invokes       # saved name -> index of its invoke

    @property
    def saved(self) -> dict:
        """Saved values by every name the cell bound them to, in the order saved."""
        if type(self._saved) is Later:
            self._saved = self._saved[0](*self._saved[1:])
        return self._saved

    @saved.setter
    def saved(self, value: dict) -> None:
        self._saved = value

    @property
    def graph(self):
        """The hook graph of the cell (with what ran, after a run)."""
        if type(self._graph) is Later:
            self._graph = self._graph[0](*self._graph[1:])
        return self._graph

    @graph.setter
    def graph(self, value) -> None:
        self._graph = value

    def _by_saved_name(self, slot: str) -> dict:
        """The dict in `slot`, keyed by saved names: {} for None, and a `Later` built from `saved` now, then kept."""
        value = getattr(self, slot)
        if value is None or type(value) is Later:
            value = {} if value is None else value[0](self.saved, *value[1:])
            setattr(self, slot, value)
        return value

    @property
    def grad_pairs(self) -> dict:
        """Saved gradient name -> name of the tensor it flowed into."""
        return self._by_saved_name("_grad_pairs")

    @grad_pairs.setter
    def grad_pairs(self, value: dict) -> None:
        self._grad_pairs = value

    @property
    def saved_invokes(self) -> dict:
        """Saved name -> the index of the invoke whose statement saved it."""
        return self._by_saved_name("_saved_invokes")

    @saved_invokes.setter
    def saved_invokes(self, value: dict) -> None:
        self._saved_invokes = value

    def without(self, names) -> Result:
        """A copy less the saved values `names` (each Cache, which has a panel of its own). Its dicts, lists and sets
        are its own; it shares what they hold (the tensors), the hook graph and the input ids."""
        rest = copy.copy(self)       # a subclass's own fields come along
        rest._saved = {name: value for name, value in self.saved.items() if name not in names}
        rest._graph, rest._grad_pairs = self.graph, {n: t for n, t in self.grad_pairs.items() if n not in names}
        rest.shapes, rest.leaf_grads, rest.accumulated = dict(self.shapes), dict(self.leaf_grads), set(self.accumulated)
        rest.invokes = list(self.invokes)
        rest.saved_invokes = {name: k for name, k in self.saved_invokes.items() if name not in names}
        return rest

    def __getitem__(self, name):
        return self.saved[name]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{name}={getattr(self, name)!r}' for name in self.FIELDS)})"


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


def run_result(by_id: dict, bound_names: frozenset, namespace: dict, graph, shapes: dict, grad_sources=None,
               invoke_of=None) -> Result:
    """A run's Result, with what is named built when first read: `Result.saved` is `saved_by_name(...)` (a loop of
    traces that reads its values from the namespace never builds it), with gradients `Result.grad_pairs` is
    `pairs_of(...)`, with invokes `Result.saved_invokes` is `invokes_of(...)`. Keeps what naming needs: the bound names
    of saved values and of containers that hold nothing unsaved (a container that does is unbound from the namespace:
    its elements are named now), and with gradients the ids of every bound value (a traced value the cell did not save
    is unbound as the run ends) and a copy of the sources (the run clears its own). It runs cold, after the model's
    forward: one call does all of it."""
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
                  grad_pairs=None if bound_ids is None else Later((pairs_of, dict(grad_sources), bound_ids)),
                  saved_invokes=Later((invokes_of, invoke_of)) if invoke_of else None)


def invokes_of(saved: dict, invoke_of: dict) -> dict:
    """`saved_invokes`: each saved name whose value a statement inside an invoke saved -> that invoke's index."""
    return {name: invoke_of[id(value)] for name, value in saved.items() if id(value) in invoke_of}


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
