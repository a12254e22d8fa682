"""INPUT of `%%trace` -> the arguments of the model call."""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from .errors import InputError
from .models import parameters_of

INPUT_HELP = ("INPUT may be a string or a list of strings (tokenized; a list is one padded batch), "
              "a tensor (the first argument), a dict or BatchEncoding (keyword arguments) "
              "or a tuple (positional arguments)")


def call_arguments(value, model: nn.Module, tokenizer=None) -> tuple:
    """(args, kwargs) for `model(*args, **kwargs)`, tensors moved to the model's device."""
    if value is None:
        raise InputError(f"missing INPUT: write `%%trace MODEL INPUT`, or put `with invoke(INPUT):` blocks in the cell. "
                         f"{INPUT_HELP}")
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        if tokenizer is None:
            raise InputError("a text INPUT needs a tokenizer: load the model with nbgrad.load_model, pass "
                             "--tokenizer EXPR, or give the model a `tokenizer` attribute")
        if getattr(tokenizer, "pad_token", "") is None and getattr(tokenizer, "eos_token", None) is not None:
            tokenizer.pad_token = tokenizer.eos_token
        encoded = tokenizer(value, return_tensors="pt", padding=True)
        args, kwargs = (), dict(encoded)
    elif isinstance(value, torch.Tensor):
        args, kwargs = (value,), {}
    elif isinstance(value, Mapping):
        args, kwargs = (), dict(value)
    elif isinstance(value, tuple):
        args, kwargs = value, {}
    else:
        raise InputError(f"INPUT is a {type(value).__name__}; {INPUT_HELP}")
    device = _device_of(model)
    if device is not None:
        args = tuple(_to(a, device) for a in args)
        kwargs = {k: _to(v, device) for k, v in kwargs.items()}
    return args, kwargs


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
