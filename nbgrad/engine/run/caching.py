"""`cache(...)` in a cell: hooks on every matching module through the run's HookSet, each output (and
input) delivered into a `Cache` as it arrives, and with `grads=True` a gradient hook on each output's
tensor when a backward pass of the cell starts."""
from __future__ import annotations

import weakref
from collections.abc import Mapping
from functools import partial

import torch
from torch import nn

from ...errors import NbgradError
from ..checks import cache_placement, matching_modules
from ..results.cache import Cache, Calls, main_tensor
from .gradients import register_grad_hook
from .rows import rebuilt


def start_cache(runtime, line: int, modules="*", *, inputs: bool = False, grads: bool = False, device=None,
                dtype=None) -> Cache:
    """What `cache(...)` in a cell returns: a Cache filled as the run goes."""
    _check_when(runtime, line, grads)
    cache_placement(device, dtype, line)
    chosen = matching_modules(runtime.model, modules, line)
    cache = Cache({"modules": modules, "inputs": inputs, "grads": grads, "device": device, "dtype": dtype})
    recorder = CacheRecorder(runtime, cache, device, dtype)
    for path, module in chosen:
        recorder.watch(path, module, "output")
        if inputs:
            recorder.watch(path, module, "input")
    if grads:
        runtime.recorders.append(recorder)
    return runtime.save(cache, line, "cache(...)")


def _check_when(runtime, line: int, grads: bool) -> None:
    if runtime.model is None:
        raise NbgradError("cache(...) records a model run: use it in a %%trace or %%generate cell", line)
    if runtime.forward.model_running or runtime.forward.done:
        raise NbgradError("cache(...) must run before the model does, and here the model had already started: "
                          "call it with names bound before the run (not values read from the run)", line)
    if grads and not runtime.program.graph.passes:
        raise NbgradError("cache(..., grads=True): the cell runs no backward pass; add `loss.backward()` (or "
                          "`with loss.backward():`), or drop grads=True", line)
    if grads and (runtime.no_grad or not torch.is_grad_enabled()):
        raise NbgradError("cache(..., grads=True) needs autograd, and this cell runs under torch.no_grad() "
                          "(--no-grad, or %%generate): drop one of them", line)


class CacheRecorder:
    """Fills one Cache: values as their hooks fire, gradients when a backward pass of the cell runs."""

    def __init__(self, runtime, cache: Cache, device, dtype):
        self.runtime, self.cache = runtime, cache
        self.device, self.dtype = device, dtype
        self.copies = device is not None or dtype is not None
        self.live: list = []             # (path, call index, tensor) of each output, for its gradient
        self.copied: dict = {}           # id(tensor) -> (weak reference to it, its copy)
        current = runtime.current
        # inside `with invoke(...)`: that invoke's rows of every value, as its other statements see them
        self.invoke = current.node.spec.invoke if current is not None and runtime.rows is not None else None

    def watch(self, path: str, module: nn.Module, kind: str) -> None:
        store = self.cache._outputs if kind == "output" else self.cache._inputs
        keep_live = kind == "output" and self.cache.options["grads"]

        def seen(value):        # before the statements on this event: one of them may start the backward pass
            tensor = main_tensor(value)
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                self.live.append((path, _calls(store, path), tensor))

        def arrived(value):
            if keep_live and self.live and self.live[-1][:2] == (path, _calls(store, path)):
                tensor = main_tensor(value)        # a statement may have put another tensor in its place
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    self.live[-1] = (path, self.live[-1][1], tensor)
            if self.invoke is not None:
                value = self.runtime.rows.view(value, self.invoke)
            _put(store, path, self.copy(value))
        watch(self.runtime.forward, module, kind, arrived, drop_values=self.copies,
              prepend=module is self.runtime.model, early=seen if keep_live else None)

    def copy(self, value):
        """The value as the cache keeps it: itself, or a detached copy moved / cast as asked."""
        if not self.copies:
            return value
        return _map_tensors(value, self._copy_tensor)

    def _copy_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """One copy per tensor: a tensor cached under two paths (a dropout in eval mode returns its input,
        `lm_head`'s output is the model's logits) is copied once."""
        known = self.copied.get(id(tensor))
        if known is not None and known[0]() is tensor:
            return known[1]
        copied = self._fresh_copy(tensor)
        self.copied[id(tensor)] = (weakref.ref(tensor), copied)
        return copied

    def _fresh_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        dtype = self.dtype if tensor.is_floating_point() else None
        return tensor.detach().to(device=self.device, dtype=dtype, copy=True)

    def hook_grads(self) -> None:
        """As a backward pass starts: a gradient hook on each output (again, so that an output edited in place
        since it arrived gets the gradient of the value it holds now)."""
        gradients, hooks = self.runtime.gradients, self.runtime.hooks
        for path, index, tensor in self.live:
            def on_grad(grad, path=path, index=index):
                if gradients.running and not self.runtime.in_statement:
                    self._put_grad(path, index, grad)
            hooks.replace(("cache grad", id(self), path, index), partial(register_grad_hook, tensor, on_grad))

    def _put_grad(self, path: str, index: int, grad: torch.Tensor) -> None:
        if self.invoke is not None:
            grad = self.runtime.rows.view(grad, self.invoke)
        # always a fresh copy: autograd may hand the next hook the same buffer, added to in place
        value = self._fresh_copy(grad) if self.copies else grad
        outputs, grads = self.cache._outputs, self.cache._grads
        if isinstance(outputs.get(path), Calls):
            slots = grads.setdefault(path, [None] * len(outputs[path]))
            slots[index] = value
        else:
            grads[path] = value


def _calls(store: dict, path: str) -> int:
    """How many calls of the module `store` has seen."""
    current = store.get(path, _NONE)
    return 0 if current is _NONE else len(current) if isinstance(current, Calls) else 1


_NONE = object()


def _put(store: dict, path: str, value) -> None:
    """The first call's value, or the list of every call's value once a module is called again."""
    current = store.get(path, _NONE)
    if current is _NONE:
        store[path] = value
    elif isinstance(current, Calls):
        current.append(value)
    else:
        store[path] = Calls([current, value])


def _map_tensors(value, function):
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, Mapping):          # a ModelOutput keeps its type
        return rebuilt(value, {k: _map_tensors(v, function) for k, v in value.items()})
    if isinstance(value, (tuple, list)):
        mapped = [_map_tensors(v, function) for v in value]
        return type(value)(mapped) if type(value) in (tuple, list) else mapped
    return value


def watch(events, module: nn.Module, kind: str, callback, drop_values: bool = False, prepend: bool = False,
          early=None) -> None:
    """Call `callback(value)` at every firing of a module's event (the run's ForwardEvents `events`), once the
    statements waiting on it have run (with their edits), and `early(value)` before they run (one of them may start a
    backward pass); with `drop_values`, the run keeps no value of its own for it unless a statement asks for it."""
    key = (id(module), kind)
    if events.hook(module, kind, prepend=prepend, for_statement=False) and drop_values:
        events.cache_only.add(key)
    events.sinks.setdefault(key, []).append(callback)
    if early is not None:
        events.early_sinks.setdefault(key, []).append(early)
