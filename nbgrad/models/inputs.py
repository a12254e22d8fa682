"""INPUT of `%%trace` -> the arguments of the model call."""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Mapping

import torch
from torch import nn

from ..engine import moduletree
from ..errors import InputError
from ..errors.naming import a_or_an
from .limits import check_token_ids, input_embeddings
from .loading import no_tokenizer_message, processor_for
from .padding import Batch, pad_id, pad_key, remembered, token_rows

# (id(ids), id(model)) -> (ids, their version, model, structure version, input embeddings) of the last few
# id tensors whose check passed, held weakly: a loop of cells on the same ids checks them once.
_checked: dict = {}
_CHECKED_KEPT = 8
_META = torch.device("meta")
_LOOK_UP = object()


def _no_embeddings():
    return None


INPUT_HELP = ("INPUT may be a string or a list of strings (tokenized; a list is one padded batch), "
              "a PIL image or a list of them (through the model's image processor), "
              "a tensor (the first argument), a dict or BatchEncoding (keyword arguments) "
              "or a tuple (positional arguments)")


def call_arguments(value, model: nn.Module, tokenizer=None) -> tuple:
    """(args, kwargs) for `model(*args, **kwargs)`, tensors moved to `input_device(model)`."""
    if type(value) is torch.Tensor:
        if value.dim() == 1 and not value.is_floating_point() and _looks_up_ids(model):
            value = value[None]         # one example's ids, as a tokenizer's `input_ids` row: a batch of one
        # The common case of a loop of cells on the same ids, in as few calls as it takes: the same ids,
        # unchanged, on the same model, unchanged, were checked already (and are integer ids, not empty).
        key = (id(value), id(model))
        checked = _checked.get(key)
        seen = (checked is not None and checked[0]() is value and checked[1] == value._version
                and checked[2]() is model and checked[3] == moduletree._structure_version[0])
        if seen or (value.numel() and not value.is_floating_point()):
            if not seen:
                check_token_ids(value, model)
                if len(_checked) >= _CHECKED_KEPT:
                    _checked.pop(next(iter(_checked)))
                # with the embeddings (weakly), which stay while the structure does (as in input_embeddings)
                embeddings = input_embeddings(model)
                checked = _checked[key] = (weakref.ref(value), value._version, weakref.ref(model),
                                           moduletree._structure_version[0],
                                           _no_embeddings if embeddings is None else weakref.ref(embeddings))
            device = input_device(model, checked[4]())
        elif value.numel():        # features or pixels (a model of one's own): no ids to check, nothing to encode
            device = input_device(model)
        else:
            return _general_arguments(value, model, tokenizer)      # empty: its InputError
        return ((value if device is None or value.device == device else value.to(device)),), {}
    return _general_arguments(value, model, tokenizer)


def _looks_up_ids(model: nn.Module) -> bool:
    """A transformers model, whose forward takes `input_ids` of shape [batch, sequence]."""
    return getattr(model, "config", None) is not None and hasattr(model, "get_input_embeddings")


def _general_arguments(value, model: nn.Module, tokenizer) -> tuple:
    if _is_image(value) or (isinstance(value, list) and value and all(map(_is_image, value))):
        value = _processed(value, model)
    args, kwargs = _arguments(value, tokenizer, model)
    check_token_ids(input_ids_of(args, kwargs), model)
    device = input_device(model)
    if device is not None:
        args = tuple(_to(a, device) for a in args)
        kwargs = {k: _to(v, device) for k, v in kwargs.items()}
    return args, kwargs


def _arguments(value, tokenizer, model: nn.Module) -> tuple:
    """INPUT as (args, kwargs), still where the user made them; an INPUT with nothing in it is refused."""
    if value is None:
        raise InputError(f"missing INPUT: write `%%trace MODEL INPUT`, or put `with invoke(INPUT):` blocks in "
                         f"the cell. {INPUT_HELP}")
    if isinstance(value, list) and not value:
        raise InputError("INPUT is an empty list: give at least one prompt (a list of strings is one batch)")
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return (), _encode(value, tokenizer, model)
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:
            raise InputError(f"INPUT is an empty tensor (shape {tuple(value.shape)}): nothing to run the model on")
        return (value,), {}
    if isinstance(value, Mapping):
        return (), dict(value)
    if isinstance(value, tuple):
        return value, {}
    raise InputError(f"INPUT is {a_or_an(type(value).__name__)}; {INPUT_HELP}")


def _is_image(value) -> bool:
    """A PIL image (by its class's module: PIL need not be installed for the rest)."""
    return type(value).__module__.startswith("PIL.") and hasattr(value, "getpixel")


def _processed(images, model: nn.Module) -> dict:
    processor = processor_for(model)
    if processor is None:
        raise InputError("an image INPUT needs the model's image processor: load the model with "
                         "nbgrad.load_model from a checkpoint that has one, or give INPUT as the processor's "
                         "output (a dict with pixel_values)")
    return dict(processor(images=images, return_tensors="pt"))


def _encode(text, tokenizer, model: nn.Module) -> dict:
    if tokenizer is None:
        raise InputError(no_tokenizer_message(model))
    if all(not part for part in ([text] if isinstance(text, str) else text)):
        what = "an empty string" if isinstance(text, str) else "a list of empty strings"
        raise InputError(f"INPUT is {what}: there is no text to run the model on")
    if isinstance(text, list):
        return _padded_prompts(text, tokenizer, model)
    encoded = dict(tokenizer(text, return_tensors="pt"))
    ids = encoded.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.shape[-1] == 0:
        raise InputError(f"INPUT {text!r:.60} gives no tokens: there is nothing to run the model on")
    return encoded


def _padded_prompts(prompts: list, tokenizer, model: nn.Module) -> dict:
    """A list of prompts as one batch, padded as invokes are (padding.py): each row equals its prompt alone."""
    batch = remembered(tokenizer, ("one batch", tuple(prompts), pad_key(tokenizer)),
                       lambda: Batch([token_rows(tokenizer, prompts)], pad_id(tokenizer)))
    return batch.call_kwargs(model, None)


def input_ids_of(args: tuple, kwargs: dict):
    ids = kwargs.get("input_ids", args[0] if args else None)
    return ids if isinstance(ids, torch.Tensor) and not ids.is_floating_point() else None


def input_device(model: nn.Module, embeddings=_LOOK_UP):
    """Where the model's inputs belong: the device its input `embeddings` run on (looked up unless given),
    never `meta`.

    With accelerate's placement (`device_map`, CPU / disk offload) a module's weights may sit on `meta`
    or the CPU while it runs elsewhere; its hook's execution device says where. None: leave inputs."""
    if embeddings is _LOOK_UP:
        embeddings = input_embeddings(model)
    if embeddings is not None and "_hf_hook" not in vars(embeddings) and "_hf_hook" not in vars(model):
        weight = embeddings._parameters.get("weight")      # the common case, first: this runs before every cell
        if weight is not None:
            device = weight.device
            if device != _META:        # compared as devices: `device.type` makes a string, slow when cold
                return device
    elif embeddings is None and "_hf_hook" not in vars(model):
        return _model_tensor_device(model)      # a model of one's own, placed by no one: where its tensors are
    for module in (embeddings, model):
        device = _execution_device(module)
        if device is not None:
            return device
    device = _tensor_device(embeddings)
    return device if device is not None else _model_tensor_device(model)


def _execution_device(module):
    """The execution device of accelerate's hook on this module, if it has one (duck-typed)."""
    hook = vars(module).get("_hf_hook") if module is not None else None    # accelerate sets a plain attribute
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
    # The module's own tensors first (an embedding's weight): this runs before every cell.
    tensors = itertools.chain(module._parameters.values(), module._buffers.values(), module.parameters(),
                              module.buffers())
    return next((tensor.device for tensor in tensors if tensor is not None and tensor.device.type != "meta"), None)


# id(model) -> (the model, weakly; structure version; the dict that holds its first tensor; that tensor's name;
# the tensor, weakly) for the last few models whose first tensor `_tensor_device` finds is on a device: a loop of
# cells on a model without input embeddings (a model of one's own) walks its modules once, not before every cell.
_first_tensors: dict = {}
_FIRST_TENSORS_KEPT = 8


def _model_tensor_device(model: nn.Module):
    """`_tensor_device(model)`, from the parameter found last time while it is still the one its module holds
    there (accelerate swaps tensors in `_parameters` without registering them), no module or parameter has been
    registered anywhere since, and no buffer of the model itself, which would come before a block's parameter."""
    kept = _first_tensors.get(id(model))
    if (kept is not None and kept[0]() is model and kept[1] == moduletree._structure_version[0]
            and (kept[2] is model._parameters or not model._buffers)):
        tensor = kept[2].get(kept[3])
        if tensor is not None and tensor is kept[4]():
            device = tensor.device
            if device != _META:
                return device
    found = _first_tensor(model)
    if found is None:
        return None
    store, name, tensor = found
    if tensor.device == _META or not isinstance(tensor, nn.Parameter):
        return _tensor_device(model)        # offloaded, or a model with buffers only: looked up every time
    if len(_first_tensors) >= _FIRST_TENSORS_KEPT:
        _first_tensors.pop(next(iter(_first_tensors)))
    _first_tensors[id(model)] = (weakref.ref(model), moduletree._structure_version[0], store, name,
                                 weakref.ref(tensor))
    return tensor.device


def _first_tensor(model: nn.Module):
    """(the dict that holds it, its name, the tensor) of the first tensor `_tensor_device(model)` looks at: the
    model's own parameters, its own buffers, then every module's parameters, then buffers, in torch's order."""
    for stores in ((model._parameters, model._buffers), (module._parameters for module in model.modules()),
                   (module._buffers for module in model.modules())):
        for store in stores:
            for name, tensor in store.items():
                if tensor is not None:
                    return store, name, tensor
    return None


def _to(value, device):
    if isinstance(value, torch.Tensor) and value.device != device:
        return value.to(device)
    return value
