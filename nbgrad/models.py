"""Loading models, the tokenizer registry, and the embedded default model."""
from __future__ import annotations

import weakref
from pathlib import Path

from torch import nn
from torch.nn.modules.module import (register_module_module_registration_hook,
                                     register_module_parameter_registration_hook)

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "data" / "default"

_tokenizers: "weakref.WeakKeyDictionary[nn.Module, object]" = weakref.WeakKeyDictionary()
_seen: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()


def load_model(name_or_path: str | None = None, **kwargs) -> nn.Module:
    """A `transformers` causal LM in eval mode, its tokenizer remembered; the embedded default with no name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    path = str(DEFAULT_MODEL_DIR) if name_or_path is None else name_or_path
    quiet = name_or_path is None and transformers_logging.is_progress_bar_enabled()
    if quiet:       # the embedded model loads in milliseconds: no progress widget left in the notebook
        transformers_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    finally:
        if quiet:
            transformers_logging.enable_progress_bar()
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    register_tokenizer(model, tokenizer)
    return model


def compiled_inner(model):
    """The module inside a `torch.compile`d one (`OptimizedModule._orig_mod`), or None for any other."""
    if type(model).__name__ == "OptimizedModule":
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            return inner
    return None


def register_tokenizer(model: nn.Module, tokenizer) -> None:
    _tokenizers[model] = tokenizer
    remember(model)


def tokenizer_for(model: nn.Module):
    """The tokenizer nbgrad knows for this model (registered, or its `tokenizer` attribute), or None."""
    return _tokenizers.get(model) or getattr(model, "tokenizer", None)


def remember(model: nn.Module) -> None:
    _seen.add(model)


def models_seen() -> list:
    return list(_seen)


# Every cell restores the model's requires_grad flags, so it needs the model's parameters. Walking the
# module tree costs more than the rest of a cell's overhead; the list is cached per model and dropped
# whenever any module or parameter is registered anywhere (torch's public registration hooks).
_structure_version = [0]
_parameter_cache: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _structure_changed(*_):
    _structure_version[0] += 1


register_module_module_registration_hook(_structure_changed)
register_module_parameter_registration_hook(_structure_changed)


def parameters_of(model: nn.Module) -> tuple:
    """Every parameter of the model, shared ones once (cached until the structure of any module changes)."""
    cached = _parameter_cache.get(model)
    if cached is not None and cached[0] == _structure_version[0]:
        return cached[1]
    params, seen, stack = [], set(), [model]
    while stack:
        module = stack.pop()
        for param in module._parameters.values():
            if param is not None and id(param) not in seen:
                seen.add(id(param))
                params.append(param)
        stack.extend(child for child in module._modules.values() if child is not None)
    params = tuple(params)
    _parameter_cache[model] = (_structure_version[0], params)
    return params
