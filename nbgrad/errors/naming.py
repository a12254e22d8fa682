"""How the namespace names a tensor: `x`, or `model.transformer.h[0].mlp.c_fc.weight` for a parameter."""
from __future__ import annotations

import torch
from torch import nn


def a_or_an(word: str) -> str:
    """`int` -> `an int`, `list` -> `a list`: a type's name as a message says it."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def path_spellings(path: str) -> tuple:
    """How a written module path may name a module of `named_modules()`, in the order to try: as written
    with brackets as dots (`model.layers.0` in a Llama, whose top module is named `model`), then without
    the notebook's `model.` in front (`model.transformer.h[3]` -> `transformer.h.3`; `model` -> the root)."""
    written = path.strip().replace("[", ".").replace("]", "")
    if written == "model":
        return written, ""
    return (written, written[len("model."):]) if written.startswith("model.") else (written,)


def module_path(root: str, dotted: str) -> str:
    """`transformer.h.0.attn` under `model` -> `model.transformer.h[0].attn`."""
    return root + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in dotted.split(".") if part)


def tensor_names(namespace: dict) -> dict:
    """id(tensor) -> its name in the namespace; parameters of modules by their path."""
    names = {}
    for name, value in namespace.items():
        if not isinstance(name, str) or name.startswith("_"):
            continue
        if isinstance(value, torch.Tensor):
            names.setdefault(id(value), name)
        elif isinstance(value, nn.Module):
            for param_name, param in value.named_parameters():
                names.setdefault(id(param), module_path(name, param_name))
    return names
