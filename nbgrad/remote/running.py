"""A cell on the actor: the notebook's names put back together around the actor's model, nbgrad's own
`trace` / `generate` run on it, and what the cell bound sent back on CPU."""
from __future__ import annotations

from ..errors import CELL_FILENAME_PREFIX
from .paths import MODEL, ModulePath
from .skeleton import on_cpu

_MISSING = object()


def run_request(holder, kind: str, source: str, shipped: dict, input, options: dict) -> tuple:
    """("done", what the cell left) after running it as `nbgrad.trace` (or `generate`) would here."""
    from .. import api, generation
    namespace = {name: holder.model if value == MODEL else
                 holder.modules[value.path] if isinstance(value, ModulePath) else value
                 for name, value in shipped.items()}
    before = dict(namespace)
    if kind == "generate":
        result = generation.generate(holder.model, input, source, namespace, **options)
    else:
        result = api.trace(holder.model, input, source, namespace, **options)
    bound = {name: value for name, value in namespace.items()
             if before.get(name, _MISSING) is not value and not name.startswith("__")}     # not exec's __builtins__
    paths = {id(module): path for path, module in holder.modules.items()}
    shapes = {(paths[key[0]], *key[1:]): shape for key, shape in getattr(result, "shapes", {}).items()
              if isinstance(key, tuple) and key and key[0] in paths}
    copies: dict = {}
    answer = {"saved": on_cpu(result.saved, copies), "bound": on_cpu(bound, copies), "shapes": shapes,
              "input_ids": on_cpu(result.input_ids), "invokes": result.invokes,
              "saved_invokes": result.saved_invokes, "grad_pairs": result.grad_pairs,
              "output": on_cpu(getattr(result, "output", None)), "top_next": on_cpu(getattr(result, "top_next", None))}
    return "done", answer


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
