"""A cell on a remote model, the notebook's side: compile it here (its errors are said before anything is
sent), send it with the names it reads, wait (an interrupt stops the run there), and bind what comes back as
the same cell run here would."""
from __future__ import annotations

import torch

from ..engine.compile.compiler import compile_cell
from ..engine.results.result import Result
from .exchange import exchange
from .kept import mark
from .pathcheck import check_paths
from .shipping import picklable, shipped_names


def run_cell(handle, kind: str, input, source: str, namespace, options: dict):
    """`nbgrad.trace` / `generate` of `source` on the handle's model: a `Result` as the local run gives."""
    program = compile_cell(source, "trace")
    if options.pop("graph", False):
        return _result(kind, {}, program.graph)
    options.pop("quiet", None)
    namespace = namespace if namespace is not None else {"model": handle, "torch": torch}
    check_paths(handle, source, namespace,        # a path not in the model: said here, nothing sent
                autograd=kind == "trace" and not options.get("no_grad"))
    if kind == "trace" and options.get("over") is not None:
        from .batches import trace_over_remote
        return trace_over_remote(handle, source, namespace, options)
    shipped = shipped_names(source, namespace, handle)
    picklable("INPUT", input)
    answer = exchange(handle, kind, source, shipped, input, options)
    return _bound(handle, kind, answer, namespace, program)


def _bound(handle, kind: str, answer: dict, namespace: dict, program):
    """Bind what the cell bound there, and the Result the local run would give."""
    namespace.update(answer["bound"])
    mark(handle, answer["kept"])
    skeleton = dict(handle.skeleton.named_modules())
    shapes = {(id(skeleton[key[0]]), *key[1:]): shape for key, shape in answer["shapes"].items()
              if key[0] in skeleton}
    result = _result(kind, answer["saved"], program.graph, shapes=shapes, input_ids=answer["input_ids"],
                     invokes=answer["invokes"], saved_invokes=answer["saved_invokes"],
                     grad_pairs=answer["grad_pairs"])
    if kind == "generate":
        result.output, result.top_next = answer["output"], answer["top_next"] or []
    return result


def _result(kind: str, saved: dict, graph, **fields):
    if kind == "generate":
        from ..generation import GenerationResult
        return GenerationResult(saved=saved, graph=graph, **fields)
    return Result(saved=saved, graph=graph, **fields)
