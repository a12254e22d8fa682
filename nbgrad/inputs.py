"""INPUT of `%%trace` -> the arguments of the model call."""
from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch
from torch import nn

from .errors import InputError

INPUT_HELP = ("INPUT may be a string or a list of strings (tokenized; a list is one padded batch), "
              "a tensor (the first argument), a dict or BatchEncoding (keyword arguments) "
              "or a tuple (positional arguments)")


def call_arguments(value, model: nn.Module, tokenizer=None) -> tuple:
    """(args, kwargs) for `model(*args, **kwargs)`, tensors moved to `input_device(model)`."""
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
    device = input_device(model)
    if device is not None:
        args = tuple(_to(a, device) for a in args)
        kwargs = {k: _to(v, device) for k, v in kwargs.items()}
    return args, kwargs


def input_ids_of(args: tuple, kwargs: dict):
    ids = kwargs.get("input_ids", args[0] if args else None)
    return ids if isinstance(ids, torch.Tensor) and not ids.is_floating_point() else None


def input_device(model: nn.Module):
    """Where the model's inputs belong: the device its input embeddings run on, never `meta`.

    With accelerate's placement (`device_map`, CPU / disk offload) a module's weights may sit on `meta`
    or the CPU while it runs elsewhere; its hook's execution device says where. None: leave inputs."""
    embeddings = _input_embeddings(model)
    for module in (embeddings, model):
        device = _execution_device(module)
        if device is not None:
            return device
    for module in (embeddings, model):
        device = _tensor_device(module)
        if device is not None:
            return device
    return None


def _input_embeddings(model: nn.Module):
    try:
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    except (NotImplementedError, AttributeError):
        return None
    return embeddings if isinstance(embeddings, nn.Module) else None


def _execution_device(module):
    """The execution device of accelerate's hook on this module, if it has one (duck-typed)."""
    hook = getattr(module, "_hf_hook", None)
    for one in [hook, *getattr(hook, "hooks", ())]:
        device = getattr(one, "execution_device", None)
        if device is not None:
            device = torch.device(device)
            return None if device.type == "meta" else device
    return None


def _tensor_device(module):
    """The device of the module's first parameter or buffer that is not on `meta`."""
    if module is None:
        return None
    # Not the cached `parameters_of`: accelerate swaps parameters in `_parameters` without registering.
    tensors = itertools.chain(module.parameters(), module.buffers())
    return next((tensor.device for tensor in tensors if tensor.device.type != "meta"), None)


def _to(value, device):
    if isinstance(value, torch.Tensor) and value.device != device:
        return value.to(device)
    return value
