"""What produced a cell's picture, for the footer every view of a magic carries (views/footer.py)."""
from __future__ import annotations

import importlib.metadata
import os

import torch

from ..views.footer import Footed


def provenance(model, line: str) -> dict:
    from .. import __version__
    try:
        transformers = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        transformers = None
    return {"nbgrad": __version__, "torch": torch.__version__, "transformers": transformers,
            "model": model_name(model), "line": line}


def model_name(model) -> str | None:
    """The checkpoint's hub name and the model's class (`openai-community/gpt2 (GPT2LMHeadModel)`); a model
    loaded from a folder by its class and the folder's name; the embedded default says so."""
    if model is None:
        return None
    from ..models.loading import DEFAULT_MODEL_DIR
    kind = type(model).__name__
    name = str(getattr(getattr(model, "config", None), "name_or_path", "") or "")
    if not name:
        return kind
    if os.path.abspath(name) == os.path.abspath(DEFAULT_MODEL_DIR):
        return f"nbgrad's embedded default ({kind})"
    return f"{os.path.basename(name.rstrip(os.sep)) if os.path.isabs(name) else name} ({kind})"


def footed(view, model, line: str):
    """`view` with the footer that names what produced it."""
    return Footed(view, provenance(model, line))
