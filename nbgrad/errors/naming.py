"""How the namespace names a tensor: `x`, or `model.transformer.h[0].mlp.c_fc.weight` for a parameter."""
from __future__ import annotations

import re

import torch
from torch import nn

# An unrolled loop's own binding of a name in one iteration (engine/compile/unroll.py): `_nbgrad_loop_3_1_attn_out`
# is the third such binding in the cell, made by the loop's iteration 1 (from 0), of the cell's `attn_out`
LOOP_PREFIX = "_nbgrad_loop_"
_LOOP_NAME = re.compile(rf"\b{LOOP_PREFIX}\d+_(\d+)_(\w+)")


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


def loop_name(serial: int, iteration: int, name: str) -> str:
    """The name of iteration `iteration`'s own binding of `name` in an unrolled loop (the `serial`th in the cell)."""
    return f"{LOOP_PREFIX}{serial}_{iteration}_{name}"


def as_written(text: str, note: str = "message") -> str:
    """`text` with each unrolled loop's name of one iteration (`loop_name`) as the cell wrote it, `attn_out`, and
    which iteration bound it: said at the end of a message (`note="message"`), of a label (`"label"`), or not."""
    iterations: dict = {}

    def written(found) -> str:
        iterations.setdefault(found[2], int(found[1]) + 1)
        return found[2]
    text = _LOOP_NAME.sub(written, text)
    if note == "label":
        return text + "".join(f" (iteration {k})" for k in dict.fromkeys(iterations.values()))
    if note == "message":
        return text + "".join(f" (`{name}` of the loop's iteration {k})" for name, k in iterations.items())
    return text
