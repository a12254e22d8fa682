"""A cell on the actor: the notebook's names put back together around the actor's model, nbgrad's own
`trace` / `generate` / `backward` (or one batch of a `--over` run) run on it, and what the cell bound sent back
on CPU."""
from __future__ import annotations

import contextlib

from ..errors import CELL_FILENAME_PREFIX
from .paths import MODEL, ModulePath
from .skeleton import on_cpu

_MISSING = object()


def run_request(holder, kind: str, source: str, shipped: dict, input, options: dict) -> tuple:
    """("done", what the cell left) after running it as `nbgrad.trace` (or `generate`, a `--over` batch, a
    `%%backward`) would here."""
    from .. import api, generation
    namespace = holder_names(holder, shipped)
    if kind == "batch":
        return "done", _batch(holder, source, namespace, *input, **options)
    before = dict(namespace)
    if kind == "backward":
        result = api.backward(holder.kept_value(input), source, namespace, **options)
    elif kind == "generate":
        result = generation.generate(holder.model, input, source, namespace, **options)
    else:
        result = api.trace(holder.model, input, source, namespace, **options)
    bound = {name: value for name, value in namespace.items()
             if before.get(name, _MISSING) is not value and not name.startswith("__")}     # not exec's __builtins__
    return "done", _answer(holder, result, bound)


def holder_names(holder, shipped: dict) -> dict:
    """The cell's namespace on the actor: the model and its modules, and the values the actor kept, in place of
    the notebook's markers."""
    from .kept import originals
    return {name: holder.model if value == MODEL else holder.modules[value.path] if isinstance(value, ModulePath)
            else originals(value, holder) for name, value in shipped.items()}


def _answer(holder, result, bound: dict) -> dict:
    paths = {id(module): path for path, module in holder.modules.items()}
    shapes = {(paths[key[0]], *key[1:]): shape for key, shape in getattr(result, "shapes", {}).items()
              if isinstance(key, tuple) and key and key[0] in paths}
    copies: dict = {}
    answer = {"saved": on_cpu(result.saved, copies), "bound": on_cpu(bound, copies), "shapes": shapes,
              "input_ids": on_cpu(result.input_ids), "invokes": result.invokes,
              "saved_invokes": result.saved_invokes, "grad_pairs": result.grad_pairs,
              "output": on_cpu(getattr(result, "output", None)), "top_next": on_cpu(getattr(result, "top_next", None)),
              "leaf_grads": leaf_grads(holder, result), "accumulated": result.accumulated}
    answer["kept"] = holder.keep(bound, copies)
    return answer


def leaf_grads(holder, result) -> dict:
    """A `%%backward`'s leaf gradients, but the model's parameters' (their size is the weights': they stay on the
    actor, where a read of `handle.<path>.grad` finds them)."""
    parameters = {id(p.grad) for p in holder.model.parameters() if p.grad is not None}
    return {name: on_cpu(grad) for name, grad in result.leaf_grads.items() if id(grad) not in parameters}


def _batch(holder, source: str, namespace: dict, examples: list, start: int, *, no_grad: bool, helpers: tuple,
           tokenizer) -> tuple:
    """One batch of a `--over` run, as datasets' local driver runs it (canonical names rewritten here, where the
    model is): ([{name: value} per example], plain names), on CPU."""
    from ..datasets.batch import run_batch
    from ..names import rewrite_of
    from ..names.rewrite import eager_attention
    rewrite = rewrite_of(source, holder.model, namespace)
    with eager_attention(holder.model) if rewrite.eager else contextlib.nullcontext():
        return on_cpu(run_batch(holder.model, tokenizer or holder.tokenizer, rewrite.text, namespace, examples, start,
                                no_grad, helpers))


def failure(error: BaseException) -> tuple:
    """("error", the error, the cell line it came from or None): a Python error keeps the line of the cell's
    own frame (its traceback stays here); an nbgrad error carries its line in itself."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(CELL_FILENAME_PREFIX):
            line = tb.tb_lineno
        tb = tb.tb_next
    error.__cause__ = error.__context__ = None      # not sent: the frames and objects they hold stay here
    return "error", error.with_traceback(None), line
