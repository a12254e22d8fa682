"""`Cache`: what `cache(...)` kept of a run, by module path (as `named_modules()` writes it).

A mapping path -> what that module returned, in call order; a module called several times maps to the
list of its outputs. `.inputs` and `.grads` hold the first positional argument and the gradient into
the output (when asked for with `inputs=True` / `grads=True`)."""
from __future__ import annotations

import fnmatch
from collections.abc import Mapping

import torch

from ...errors import NbgradError
from ...errors.naming import path_spellings
from ..run.claims import active_runtime


def main_tensor(value):
    """The tensor a module's output stands for: itself, or the first tensor of a tuple, list or ModelOutput."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


def same_elements(tensor: torch.Tensor) -> tuple:
    """What tells apart the elements a tensor shows: two views of the same rows of one tensor (a module's output and
    the next one's input, each an invoke's view) give the same key; the storage's address comes first."""
    return (tensor.untyped_storage().data_ptr() or id(tensor), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype, tensor.device)


def _tensors(value, depth: int = 0):
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 4 and isinstance(value, Mapping):
        for element in value.values():
            yield from _tensors(element, depth + 1)
    elif depth < 4 and isinstance(value, (tuple, list)):
        for element in value:
            yield from _tensors(element, depth + 1)


class Calls(list):
    """The values of a module called several times, in call order (told apart from an output that is a list)."""


class Cache(Mapping):
    """path -> output (a list of outputs for a module called several times), in call order."""

    def __init__(self, options: dict | None = None):
        self.options = dict(options or {})    # what cache(...) was called with: modules, inputs, grads, ...
        self._outputs: dict = {}
        self._inputs: dict = {}
        self._grads: dict = {}

    # --- the mapping ----------------------------------------------------------------------------

    def __getitem__(self, path):
        try:
            return self._outputs[path]
        except KeyError:
            for spelling in path_spellings(path) if isinstance(path, str) else ():   # `model.transformer.h[3]`
                if spelling in self._outputs:
                    return self._outputs[spelling]
            if self._filling():
                raise KeyError(f"{path!r} is not in the cache yet: this statement ran before the model called that "
                               f"module. A cache fills as the model runs: read the module's own `.output` here, or "
                               f"read the cache in a statement of its own, which runs after the forward pass") from None
            raise KeyError(f"{path!r} is not in the cache: the run called no cached module of that path "
                           f"(cached: {_few(self._outputs)})") from None

    def _filling(self) -> bool:
        """Is this cache's run going on, its forward pass not finished? (Only asked for a path it lacks.)"""
        runtime = active_runtime()
        return (runtime is not None and id(self) in runtime.by_id and not runtime.forward.done
                and not runtime.stepping)

    def __iter__(self):
        return iter(self._outputs)

    def __len__(self):
        return len(self._outputs)

    # --- what else it holds ---------------------------------------------------------------------

    @property
    def inputs(self) -> dict:
        """path -> the first positional argument of each call (`cache(..., inputs=True)`)."""
        if not self.options.get("inputs"):
            raise NbgradError("this cache holds no inputs: call cache(..., inputs=True)")
        return self._inputs

    @property
    def grads(self) -> dict:
        """path -> the gradient that flowed into the output in the cell's backward pass (`grads=True`)."""
        if not self.options.get("grads"):
            raise NbgradError("this cache holds no gradients: call cache(..., grads=True) in a cell that runs "
                              "a backward pass")
        order = {path: index for index, path in enumerate(self._outputs)}     # forward order, not backward's
        return dict(sorted(self._grads.items(), key=lambda item: order.get(item[0], len(order))))

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor the cache holds (outputs, inputs and gradients), each once: two views of the same
        elements (a module's output and the next one's input, as an invoke's rows) count once."""
        seen, total = set(), 0
        for store in (self._outputs, self._inputs, self._grads):
            for tensor in _tensors(list(store.values())):
                same = same_elements(tensor)
                if same not in seen:
                    seen.add(same)
                    total += tensor.nelement() * tensor.element_size()
        return total

    def stack(self, paths="*", *, grads: bool = False) -> torch.Tensor:
        """The values of `paths` (a list of paths, or a glob) stacked along a new first dimension, in
        forward order; the tensor of each output (the first tensor of a tuple). `grads=True` stacks
        their gradients instead."""
        store = self.grads if grads else self._outputs
        chosen = self.paths(paths)
        values = []
        for path in chosen:
            value = store.get(path)
            if isinstance(value, Calls):
                raise NbgradError(f"Cache.stack: {path!r} was called {len(value)} times; stack its list "
                                  f"(torch.stack(cache[{path!r}])) or choose other paths")
            tensor = main_tensor(value)
            if tensor is None:
                raise NbgradError(f"Cache.stack: {path!r} holds no tensor"
                                  + (" gradient" if grads else ""))
            values.append(tensor)
        if len({tuple(v.shape) for v in values}) > 1:
            raise NbgradError(_mixed_shapes(chosen, values))
        return torch.stack(values)

    def paths(self, paths="*") -> list:
        """The cached paths a glob (or a list of paths / globs) names, in forward order."""
        chosen = matching_any(list(self._outputs), [paths] if isinstance(paths, str) else list(paths))
        chosen = [p for p in self._outputs if p in chosen]
        if not chosen:
            raise NbgradError(f"Cache: no cached path matches {paths!r} (cached: {_few(self._outputs)})")
        return chosen

    def summary(self, max_positions: int = 64) -> dict:
        """Plain data for the Cache panel: per cached module the norm of its output at each position (batch
        row 0), and where gradients were cached, gradient × activation summed at each position (signed)."""
        rows = []
        grads = self._grads if self.options.get("grads") else {}
        for path, value in self._outputs.items():
            for call, output in enumerate(value if isinstance(value, Calls) else [value]):
                label = path or "(model)"
                label += f" #{call}" if isinstance(value, Calls) else ""
                tensor = main_tensor(output)
                if tensor is None:
                    continue
                rows.append({"path": label, "shape": list(tensor.shape), "signed": False,
                             "values": _per_position(tensor, None, max_positions)})
                grad = grads.get(path)
                grad = grad[call] if isinstance(grad, list) else grad
                if isinstance(grad, torch.Tensor) and grad.shape == tensor.shape:
                    rows.append({"path": f"{label} grad×act", "shape": list(grad.shape), "signed": True,
                                 "values": _per_position(tensor, grad, max_positions)})
        return {"rows": rows, "nbytes": self.nbytes, "memory": _human(self.nbytes), "modules": len(self)}

    panel = None         # what draws a summary (views/cache.py's CachePanel): set by the api, the engine draws nothing

    def _repr_mimebundle_(self, include=None, exclude=None):
        """A cache shown on its own (`c` as a cell's last line): its panel, with the short repr as text."""
        if self.panel is None:
            return {"text/plain": repr(self)}
        return {"text/html": self.panel(self.summary()).html(), "text/plain": repr(self)}

    def __repr__(self):
        extra = [name for name in ("inputs", "grads") if self.options.get(name)]
        return (f"Cache({len(self)} modules{' with ' + ' and '.join(extra) if extra else ''}, "
                f"{_human(self.nbytes)}: {_few(self._outputs)})")


def _per_position(tensor: torch.Tensor, grad, max_positions: int) -> list:
    """Batch row 0 with the axis after the batch as positions (the last `max_positions`): the norm over the
    other axes, or with `grad` the sum of gradient × activation."""
    with torch.no_grad():
        value = tensor.detach().float().cpu()
        if grad is not None:
            value = value * grad.detach().float().cpu()
        value = value[0] if value.dim() >= 2 else value.reshape(1, -1)
        value = value.reshape(value.shape[0], -1) if value.dim() >= 2 else value.reshape(1, -1)
        value = value[-max_positions:]
        reduced = value.sum(dim=1) if grad is not None else value.norm(dim=1)
    return [float(v) for v in reduced]


def matching_names(names: list, pattern: str) -> list:
    """The names a path or glob matches, as written first, else without the notebook's `model.` in front
    (see `path_spellings`)."""
    for spelling in path_spellings(pattern):
        found = [name for name in names if name == spelling or fnmatch.fnmatchcase(name, spelling)]
        if found:
            return found
    return []


def matching_any(names: list, patterns: list) -> set:
    """The names that any of the paths or globs matches (each as in `matching_names`)."""
    chosen = set()
    for pattern in patterns:
        chosen.update(matching_names(names, pattern))
    return chosen


def _mixed_shapes(paths: list, values: list) -> str:
    """Cache.stack's error for values of several shapes: the paths of each shape, and the paths a glob over a whole
    subtree most likely meant, those nearest the root (the blocks of `transformer.h.*`) when they agree."""
    by_shape: dict = {}
    for path, value in zip(paths, values):
        by_shape.setdefault(tuple(value.shape), []).append(path)
    said = "; ".join(f"{shape} at {_few(named, 2)}" for shape, named in by_shape.items())
    depth = min(path.count(".") for path in paths)
    top = {path: tuple(value.shape) for path, value in zip(paths, values) if path.count(".") == depth}
    same = len(top) > 1 and len(set(top.values())) == 1
    return (f"Cache.stack: the values have different shapes ({said}). Stack paths whose outputs have one shape: a list "
            f"of paths" + (f" (those nearest the root agree: [{_few(list(top))}])" if same else "") + ", or a narrower glob")


def _few(paths, count: int = 4) -> str:
    names = [repr(p) for p in list(paths)[:count]]
    return ", ".join(names) + (", ..." if len(paths) > count else "") if names else "nothing"


def _human(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"
