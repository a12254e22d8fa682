"""What a model takes: its vocabulary and its position table. Token ids past either are one clear
error before the model runs, naming the limit and where it comes from."""
from __future__ import annotations

import weakref

import torch
from torch import nn

from ..engine import moduletree
from ..errors import naming
from ..errors import InputError
from .byid import weakly


# id(model) -> (weak reference to the model, structure version, its input embeddings): read before every cell,
# so a plain dict by id (see byid.py).
_embeddings: dict = {}


def input_embeddings(model: nn.Module):
    """The model's input embedding module (`get_input_embeddings()`), or None. Cached per model until any
    module is registered anywhere (`set_input_embeddings` assigns a module, which counts)."""
    cached = _embeddings.get(id(model))
    if cached is not None and cached[0]() is model and cached[1] == moduletree._structure_version[0]:
        return cached[2]
    try:
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    except (NotImplementedError, AttributeError):
        embeddings = None
    embeddings = embeddings if isinstance(embeddings, nn.Module) else None
    _embeddings[id(model)] = (weakly(model, _embeddings), moduletree._structure_version[0], embeddings)
    return embeddings


def check_token_ids(ids, model: nn.Module) -> None:
    """Token ids past the vocabulary or more positions than the model has: say which limit."""
    if ids is None or ids.numel() == 0 or ids.is_floating_point() or ids.device.type == "meta":
        return
    if ids.dim() == 0:      # not torch's "tuple index out of range" from inside the model
        raise InputError(f"INPUT is a tensor of no dimensions (the one number {ids.item()}): token ids have the "
                         f"shape [batch, positions], e.g. torch.tensor([[{ids.item()}]]) or ids[None, None]")
    low, high = _id_range(ids)
    check_token_range(low, high, ids.shape[-1], model)


# The smallest and largest id of the last few id tensors, while each is unchanged (same version): a cell
# run again on the same `ids` reads them without a tensor operation, which costs more, cold, after the
# model's forward pass, than the rest of a one-read cell's checks together.
_ranges: dict = {}
_RANGES_KEPT = 8


def _id_range(ids: torch.Tensor) -> tuple:
    kept = _ranges.get(id(ids))
    if kept is not None and kept[0]() is ids and kept[1] == ids._version:
        return kept[2]
    low, high = torch.aminmax(ids)
    found = (int(low), int(high))
    if len(_ranges) >= _RANGES_KEPT:
        _ranges.pop(next(iter(_ranges)))
    _ranges[id(ids)] = (weakref.ref(ids), ids._version, found)
    return found


def check_token_range(low: int, high: int, length: int, model: nn.Module) -> None:
    """`check_token_ids` for ids known as numbers: the smallest and largest id, and the row length."""
    (vocabulary, vocabulary_source), (positions, positions_source) = limits(model)
    if vocabulary is not None and (low < 0 or high >= vocabulary):
        raise InputError(f"INPUT has token id {high if high >= vocabulary else low}, outside the model's "
                         f"vocabulary: {vocabulary_source} = {vocabulary}, so ids are 0–{vocabulary - 1}")
    if positions is not None and length > positions:
        raise InputError(f"INPUT has {length} positions, more than the model takes: "
                         f"{positions_source} = {positions}. Shorten the input")


# id(model) -> (weak reference to the model, structure version, its limits): read before every cell on text
_limits: dict = {}


def limits(model: nn.Module) -> tuple:
    """((vocabulary size, where it comes from), (position limit, where it comes from)); None where unknown.
    Cached per model until any module is registered anywhere."""
    cached = _limits.get(id(model))
    if cached is not None and cached[0]() is model and cached[1] == moduletree._structure_version[0]:
        return cached[2]
    embeddings = _token_table(model)
    vocabulary = (None, "")
    if embeddings is not None:
        vocabulary = (embeddings.num_embeddings, f"{_path_of(model, embeddings)}.num_embeddings")
    found = (vocabulary, _position_limit(model, embeddings))
    _limits[id(model)] = (weakly(model, _limits), moduletree._structure_version[0], found)
    return found


def _token_table(model: nn.Module):
    """The embedding that token ids index: the input embeddings, or the first module of a Sequential."""
    embeddings = input_embeddings(model)
    if embeddings is None and isinstance(model, nn.Sequential) and len(model):
        embeddings = model[0]
    if embeddings is None:
        embeddings = model
    return embeddings if isinstance(embeddings, nn.Embedding) else None


def _position_limit(model: nn.Module, embeddings) -> tuple:
    """The config's position limit, where the model has a learned position table of that size (a rotary
    or relative model takes longer inputs, so its configured limit is no hard limit)."""
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings"):
        limit = getattr(config, name, None)
        if isinstance(limit, int) and limit > 0 and any(
                isinstance(module, nn.Embedding) and module is not embeddings
                and limit <= module.num_embeddings <= limit + 2 for module in model.modules()):
            return limit, f"model.config.{name}"
    return None, ""


def _path_of(model: nn.Module, module: nn.Module) -> str:
    if module is model:
        return "model"
    name = next((name for name, candidate in model.named_modules() if candidate is module), "")
    return naming.module_path("model", name) if name else "the input embeddings"
