"""Datasets: `%%trace MODEL --over DATASET` runs a cell once per example, batched as invokes, on this
machine or on a Ray cluster, with results in memory or in a folder (`--out DIR`). On top of the engine,
which does not import it."""
from __future__ import annotations

import contextlib

from torch import nn

from .. import api
from ..names import rewrite_of
from ..names.rewrite import eager_attention, wrap_caches
from .folder import verify
from .run import trace_over


def trace(model, input, source: str, namespace: dict | None = None, *, over=None, batch_size: int = 8,
          out=None, engine: str = "local", workers: int | None = None, column: str | None = None,
          model_factory=None, **options):
    """`nbgrad.trace(..., over=DATASET)` (api.trace calls it): the source runs once per example
    (`trace_over`); without `over`, one run on `input` (`api.trace`)."""
    __tracebackhide__ = True
    if over is None:
        return api.trace(model, input, source, namespace, **options)
    if input is not None:
        from ..errors import InputError
        raise InputError("INPUT and --over together: with --over every example is an INPUT; give no INPUT")
    if not isinstance(model, nn.Module) and hasattr(model, "nbgrad_trace"):   # a model elsewhere runs the batches
        return api.trace(model, None, source, namespace, over=over, batch_size=batch_size, out=out, engine=engine,
                         workers=workers, column=column, model_factory=model_factory, **options)
    options.pop("quiet", None)
    if options.pop("graph", False):
        return api.trace(model, None, source, namespace, graph=True)
    rewrite = rewrite_of(source, model, namespace)        # canonical names: the model's own paths (nbgrad/names)
    with eager_attention(model) if rewrite.eager else contextlib.nullcontext():
        result = trace_over(model, rewrite.text, namespace, over, batch_size=batch_size, out=out, engine=engine,
                            workers=workers, column=column, model_factory=model_factory, **options)
    if namespace is not None:        # the --over magic comes here directly: its canonical caches are wrapped here
        wrap_caches(rewrite, namespace, result)
    return result


api.dataset_runner[:] = [trace]

__all__ = ["trace", "trace_over", "verify"]
