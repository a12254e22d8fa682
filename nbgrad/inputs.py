"""INPUT of `%%trace` -> the arguments of the model call."""
from __future__ import annotations

import weakref
from collections.abc import Mapping

import torch
from torch import nn

from . import models, naming
from .errors import InputError
from .models import parameters_of

INPUT_HELP = ("INPUT may be a string or a list of strings (tokenized; a list is one padded batch), "
              "a tensor (the first argument), a dict or BatchEncoding (keyword arguments) "
              "or a tuple (positional arguments)")


def call_arguments(value, model: nn.Module, tokenizer=None) -> tuple:
    """(args, kwargs) for `model(*args, **kwargs)`, tensors moved to the model's device."""
    args, kwargs = _arguments(value, tokenizer)
    check_token_ids(input_ids_of(args, kwargs), model)

    device = _device_of(model)
    if device is not None:
        args = tuple(_to(a, device) for a in args)
        kwargs = {k: _to(v, device) for k, v in kwargs.items()}
    return args, kwargs


def _arguments(value, tokenizer) -> tuple:
    """INPUT as (args, kwargs), still where the user made them; an INPUT with nothing in it is refused."""
    if value is None:
        raise InputError(f"missing INPUT: write `%%trace MODEL INPUT`. {INPUT_HELP}")
    if isinstance(value, list) and not value:
        raise InputError("INPUT is an empty list: give at least one prompt (a list of strings is one batch)")
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return (), _encode(value, tokenizer)
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:
            raise InputError(f"INPUT is an empty tensor (shape {tuple(value.shape)}): nothing to run the model on")
        return (value,), {}
    if isinstance(value, Mapping):
        return (), dict(value)
    if isinstance(value, tuple):
        return value, {}
    raise InputError(f"INPUT is a {type(value).__name__}; {INPUT_HELP}")


def _encode(text, tokenizer) -> dict:
    if tokenizer is None:
        raise InputError("a text INPUT needs a tokenizer: load the model with nbgrad.load_model, pass "
                         "--tokenizer EXPR, or give the model a `tokenizer` attribute")
    if all(not part for part in ([text] if isinstance(text, str) else text)):
        what = "an empty string" if isinstance(text, str) else "a list of empty strings"
        raise InputError(f"INPUT is {what}: there is no text to run the model on")
    if getattr(tokenizer, "pad_token", "") is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    encoded = dict(tokenizer(text, return_tensors="pt", padding=True))
    ids = encoded.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.shape[-1] == 0:
        raise InputError(f"INPUT {text!r:.60} gives no tokens: there is nothing to run the model on")
    return encoded


def check_token_ids(ids, model: nn.Module) -> None:
    """Token ids past the vocabulary or more positions than the model has: say which limit."""
    if ids is None or ids.numel() == 0 or ids.is_floating_point() or ids.device.type == "meta":
        return
    (vocabulary, vocabulary_source), (positions, positions_source) = limits(model)
    if vocabulary is not None:
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocabulary:
            raise InputError(f"INPUT has token id {high if high >= vocabulary else low}, outside the model's "
                             f"vocabulary: {vocabulary_source} = {vocabulary}, so ids are 0–{vocabulary - 1}")
    if positions is not None and ids.shape[-1] > positions:
        raise InputError(f"INPUT has {ids.shape[-1]} positions, more than the model takes: "
                         f"{positions_source} = {positions}. Shorten the input")


_limits: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def limits(model: nn.Module) -> tuple:
    """((vocabulary size, where it comes from), (position limit, where it comes from)); None where unknown.
    Cached per model until any module is registered anywhere."""
    cached = _limits.get(model)
    if cached is not None and cached[0] == models._structure_version[0]:
        return cached[1]
    embeddings = _input_embeddings(model)
    vocabulary = (None, "")
    if embeddings is not None:
        vocabulary = (embeddings.num_embeddings, f"{_path_of(model, embeddings)}.num_embeddings")
    found = (vocabulary, _position_limit(model, embeddings))
    _limits[model] = (models._structure_version[0], found)
    return found


def _input_embeddings(model: nn.Module):
    get = getattr(model, "get_input_embeddings", None)
    try:
        embeddings = get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        embeddings = None
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


def input_ids_of(args: tuple, kwargs: dict):
    ids = kwargs.get("input_ids", args[0] if args else None)
    return ids if isinstance(ids, torch.Tensor) and not ids.is_floating_point() else None


def _device_of(model: nn.Module):
    params = parameters_of(model)
    return params[0].device if params else None


def _to(value, device):
    if isinstance(value, torch.Tensor) and value.device != device:
        return value.to(device)
    return value
