"""A batch's saved values as the tensors of one safetensors file and a layout (which keys, which plain values)
in its metadata, and back: `flatten` / `unflatten`, `unshared` (each tensor once, as its own bytes)."""
from __future__ import annotations

import torch

from ..engine.results.cache import Cache, Calls, same_elements
from ..errors import NbgradError
from ..errors.naming import a_or_an

CACHE_PARTS = ("outputs", "inputs", "grads")      # what a Cache holds, each a dict by module path


def unshared(tensors: dict) -> tuple:
    """(tensors, {key: the key of the same tensor}) as a file holds them: one tensor kept once (a cache holds a
    module's output again as the next one's input), and views into one another's memory copied out (safetensors
    writes each tensor's own bytes)."""
    kept, aliases, first, storages = {}, {}, {}, {}
    for key, tensor in tensors.items():
        same = same_elements(tensor)
        if same in first:
            aliases[key] = first[same]
            continue
        first[same] = key
        kept[key] = tensor
        storages.setdefault(same[0], []).append(key)
    for keys in storages.values():
        for key in keys:
            kept[key] = kept[key].clone() if len(keys) > 1 else kept[key].contiguous()
    return kept, aliases


def flatten(value, key: str, tensors: dict, in_cache: bool = False):
    """The value's shape for the metadata, its tensors put in `tensors` under paths from `key`. Inside a Cache or a
    model's output (a ModelOutput, kept with its class), what is no tensor, container or plain value (the model's
    key-value cache object) is left out."""
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach().cpu()
        return {"tensor": key}
    if isinstance(value, Cache):
        parts = {part: flatten(dict(getattr(value, "_" + part)), f"{key}/{part}", tensors, True)
                 for part in CACHE_PARTS}
        return {"cache": {"options": {name: bool(value.options.get(name)) for name in ("inputs", "grads")}, **parts}}
    if isinstance(value, (list, tuple)):
        kind = "calls" if isinstance(value, Calls) else "list" if isinstance(value, list) else "tuple"   # a named one too
        return {kind: [flatten(v, f"{key}/{i}", tensors, in_cache) for i, v in enumerate(value)]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        output = _model_output_class(type(value))
        items = {k: flatten(v, f"{key}/{k}", tensors, in_cache or output is not None) for k, v in value.items()}
        return {"dict": items, "class": output} if output else {"dict": items}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"plain": value}
    if in_cache:
        return {"omitted": type(value).__name__}
    raise NbgradError(f"--out writes tensors (and lists / dicts of them, numbers, strings, caches); "
                      f"{key.split('/')[0]} holds {a_or_an(type(value).__name__)}")


def unflatten(shape: dict, tensors: dict):
    kind, content = next(iter(shape.items()))
    if kind == "tensor":
        return tensors[content]
    if kind in ("list", "tuple", "calls"):
        values = [unflatten(v, tensors) for v in content]
        return values if kind == "list" else tuple(values) if kind == "tuple" else Calls(values)
    if kind == "dict":
        items = {k: unflatten(v, tensors) for k, v in content.items()}
        return _model_output(shape["class"], items) if "class" in shape else items
    if kind == "cache":
        cache = Cache(content["options"])
        for part in CACHE_PARTS:
            setattr(cache, "_" + part, unflatten(content[part], tensors))
        return cache
    return None if kind == "omitted" else content


def _model_output_class(cls: type) -> str | None:
    """`module:name` of a transformers ModelOutput class (what `_model_output` makes again); None for any other."""
    from transformers.utils import ModelOutput
    return f"{cls.__module__}:{cls.__qualname__}" if issubclass(cls, ModelOutput) else None


def _model_output(name: str, items: dict):
    """The ModelOutput `name` (`_model_output_class`) with `items`, read from a file: only a ModelOutput class of
    transformers is made, never whatever a file names; the items as a dict where that class is gone."""
    import importlib
    from transformers.utils import ModelOutput
    module, _, qualname = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), qualname) if module.startswith("transformers.") else None
        return cls(**items) if isinstance(cls, type) and issubclass(cls, ModelOutput) else items
    except (ImportError, AttributeError, TypeError):
        return items
