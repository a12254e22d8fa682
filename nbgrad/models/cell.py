"""What every driver of the engine (`trace`, `generate`, dataset runs) does before a run: the namespace a
body runs in, the model to hook (the module inside a `torch.compile`d one) and its tokenizer, and each
invoke block's INPUT evaluated."""
from __future__ import annotations

import sys

import torch

from ..engine.moduletree import compiled_inner
from ..errors import InputError
from . import loading


def call_options(arguments: dict) -> dict:
    """A cell call's keyword options, from its `locals()`: what a model elsewhere (`nbgrad.remote`'s handle) is
    given to run the cell itself."""
    return {name: value for name, value in arguments.items() if name not in ("model", "input", "source", "namespace")}


def default_namespace(namespace, model):
    """The namespace a body runs in: the caller's, or one with `model`, `torch` and `nbgrad`."""
    if namespace is None:
        import nbgrad
        return {"model": model, "torch": torch, "nbgrad": nbgrad}
    return namespace


def model_to_trace(model, tokenizer=None, note: bool = True, wanted: bool = True) -> tuple:
    """(module to hook, its tokenizer): the eager module inside a `torch.compile`d one, with a one-line note.
    Not `wanted`: the tokenizer given, None if none (a tensor INPUT is not tokenized)."""
    inner = compiled_inner(model) if type(model).__name__ == "OptimizedModule" else None
    if inner is not None:
        if note:
            print("nbgrad: tracing the module inside torch.compile (eagerly, with hooks); the compiled "
                  "version is left as it was", file=sys.stderr)
        tokenizer = tokenizer or loading.tokenizer_for(model)
        model = inner
    loading.remember(model)
    return model, tokenizer if tokenizer is not None or not wanted else loading.tokenizer_for(model)


def invoke_inputs(program, input, namespace: dict, magic: str = "%%trace") -> list:
    """Each invoke block's INPUT, evaluated in the namespace."""
    first = program.invokes[0]
    if input is not None:
        raise InputError(f"INPUT on the {magic} line and `with invoke(...)` blocks together: give the inputs in "
                         f"the invoke blocks only (`{magic} MODEL` with no INPUT)", first.line)
    values = []
    for invoke in program.invokes:
        try:          # a plain name bound in the namespace: what evaluating it gives, without a frame made for it
            values.append(namespace[invoke.name] if invoke.name in namespace else eval(invoke.code, namespace))
        except Exception as error:
            raise InputError(f"invoke INPUT `{invoke.text}` could not be evaluated: {type(error).__name__}: "
                             f"{error}", invoke.line) from error
        if values[-1] is None:      # not "missing INPUT": the block gives one, and it holds nothing
            raise InputError(f"invoke INPUT `{invoke.text}` is None: give the block a string, a list of strings, a "
                             f"tensor, a dict or a tuple", invoke.line)
    return values
