"""Loading models, the tokenizer registry, and the embedded default model."""
from __future__ import annotations

import weakref
from pathlib import Path

from torch import nn

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
