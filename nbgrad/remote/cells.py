"""A cell on a remote model, the notebook's side: compile it here (its errors are said before anything is
sent), send it with the names it reads, wait (an interrupt stops the run there), and bind what comes back as
the same cell run here would."""
from __future__ import annotations

import torch

from ..engine.compile.compiler import compile_cell
from ..engine.run.result import Result
from ..errors import NbgradError, at_cell_line
from .pathcheck import check_paths
from .shipping import picklable, shipped_names

INTERRUPT_WAIT_S = 60


def run_cell(handle, kind: str, input, source: str, namespace, options: dict):
    """`nbgrad.trace` / `generate` of `source` on the handle's model: a `Result` as the local run gives."""
    from ray import cloudpickle
    program = compile_cell(source, "trace")
    if options.pop("graph", False):
        return _result(kind, {}, program.graph)
    options.pop("quiet", None)
    if kind == "trace":
        options = _trace_options(options)
    namespace = namespace if namespace is not None else {"model": handle, "torch": torch}
    check_paths(handle, source, namespace)        # a path not in the model: said here, nothing sent
    shipped = shipped_names(source, namespace, handle)
    picklable("INPUT" if options.get("over") is None else "the dataset", input if options.get("over") is None
              else options["over"])
    request = cloudpickle.dumps((kind, source, shipped, input, options))
    answer = _wait(handle, handle._actor.run.remote(request))
    handle._stats.append({"cell": source.strip().split("\n")[0], "sent": len(request), "received": len(answer)})
    outcome = cloudpickle.loads(answer)
    if outcome[0] == "error":
        raise _as_here(outcome[1], outcome[2], program.filename)
    return _bound(handle, kind, outcome[1], namespace, program)


def _trace_options(options: dict) -> dict:
    """`trace`'s options as the actor's `trace` takes them: `--over` runs its batches there, with no progress bar
    (nobody would see it); a DIR, `--engine` and its workers are the notebook's own business."""
    for option, default in (("out", None), ("engine", "local"), ("workers", None), ("model_factory", None)):
        if options.pop(option, default) != default:
            raise NbgradError(f"a remote model runs --over's batches on its own actor: `{option.replace('_', '-')}` "
                              f"does not apply to it (bind the lists the cell saves, and keep them as you like)")
    options["progress"] = False
    return options


def _wait(handle, task) -> bytes:
    """The run's answer; an interrupt here interrupts the run there and waits for its clean-up to finish, so
    the model is clean when the interrupt reaches the notebook."""
    import ray
    try:
        return handle._ask(task)
    except KeyboardInterrupt:
        handle._actor.interrupt.remote()
        ray.cancel(task)                          # a run still queued behind another is dropped
        try:
            ray.wait([task], timeout=INTERRUPT_WAIT_S)
        finally:
            raise


def _as_here(error: BaseException, line, filename: str) -> BaseException:
    """The actor's error as the local cell raises it: an nbgrad error carries its line; another error is raised
    from the cell's line, whose text this notebook has."""
    if isinstance(error, KeyboardInterrupt):
        return KeyboardInterrupt()
    if isinstance(error, NbgradError) or not line:
        return error
    return at_cell_line(error, filename, line)


def _bound(handle, kind: str, answer: dict, namespace: dict, program):
    """Bind what the cell bound there, and the Result the local run would give."""
    namespace.update(answer["bound"])
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
