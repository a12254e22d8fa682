"""`%%trace MODEL --over DATASET`: the driver. Batches are read from the dataset as the run goes, each runs
on this machine (`engine="local"`) or on Ray actors (`engine="ray"`, ray_engine.py), and each finished
batch's values are kept in memory or written to `--out DIR`. After the run every saved name is bound to a
list with one value per example, in dataset order."""
from __future__ import annotations

import contextlib
import sys

from ..engine.compile.compiler import compile_cell
from ..engine.compile.helpers import called_helpers
from ..engine import checks
from ..engine.results.result import Result
from ..errors import ArgumentError
from ..models.cell import default_namespace, model_to_trace
from . import examples as reading
from .batch import run_batch
from .store import Store

ENGINES = ("local", "ray")


def trace_over(model, source: str, namespace: dict | None, over, *, batch_size: int = 8, out=None,
               engine: str = "local", workers: int | None = None, column: str | None = None,
               model_factory=None, no_grad: bool = False, tokenizer=None, progress: bool = True,
               batches_of=None) -> Result:
    """Run `source` once per example of `over` (see the module's docstring); returns a Result whose saved
    values are lists over the examples. `batches_of(source, namespace, no_grad, helpers)` gives the batches of a model
    that runs them itself (nbgrad.remote's handle): an object whose `run(batches, store)` is as _LocalBatches'."""
    __tracebackhide__ = True
    if batches_of is None:
        checks.trace_arguments(model, namespace)
        _check_engine(engine, workers, model_factory)
    compile_cell(source, "trace")                   # the cell's own errors first, before any example runs
    namespace = default_namespace(namespace, model)
    helpers = called_helpers(source, "trace", namespace)     # read here: a worker has no earlier cells
    graph = compile_cell(source, "trace", helpers).graph
    traced, tokenizer = model_to_trace(model, tokenizer) if batches_of is None else (None, None)
    store = Store(out, source, batch_size) if out is not None else None
    if batches_of is not None:
        batches = batches_of(source, namespace, no_grad, helpers)
    elif engine == "ray":
        from .ray_engine import RayBatches
        batches = RayBatches(model, source, namespace, no_grad, workers, model_factory, helpers)
    else:
        batches = _LocalBatches(traced, tokenizer, source, namespace, no_grad, helpers)
    with _progress(reading.total(over), progress) as bar:
        done, gathered, plain = _run(batches.run(reading.batches(over, batch_size, column), store), store, bar)
    saved = store.lists(done) if store is not None else {n: v + [None] * (done - len(v)) for n, v in gathered.items()}
    namespace.update({name: value for name, value in plain.items() if name not in saved})
    namespace.update(saved)
    return Result(saved=saved, graph=graph)


def _run(batches, store, bar) -> tuple:
    """(examples done, {name: values} when no DIR takes them, the plain names) of the batches as they finish. An
    interrupt says what it leaves: the finished batches in DIR, or nothing bound."""
    gathered, plain, done = {}, {}, 0
    try:
        for start, per_example, last_plain in batches:
            if store is not None:
                if last_plain is not None:          # computed now, not found in DIR
                    store.write(start, per_example)
            else:
                _gather(gathered, start, per_example)
            done = start + len(per_example)         # after the write: an interrupt inside it counts what DIR holds
            plain.update(last_plain or {})
            bar.update(len(per_example))
    except KeyboardInterrupt as interrupt:
        interrupt.add_note(f"nbgrad: interrupted after {done} examples; " + (
            "every batch finished is in DIR: run the cell again to compute only the rest" if store is not None
            else "no name was bound (with --out DIR, a run keeps every batch it finished)"))
        raise
    return done, gathered, plain


def _check_engine(engine: str, workers, model_factory) -> None:
    if engine not in ENGINES:
        raise ArgumentError(f"--engine is 'local' or 'ray', not {engine!r}")
    if workers is not None and (type(workers) is not int or workers < 1):
        raise ArgumentError(f"--workers must be a positive integer, not {workers!r}")
    if engine == "local" and (workers is not None or model_factory is not None):
        option = "--workers" if workers is not None else "--model-factory"
        raise ArgumentError(f"{option} is for --engine ray (workers that each load a model); this run is local: "
                            f"add --engine ray, or drop {option}")


class _LocalBatches:
    """Batches run here, one after the other."""

    def __init__(self, model, tokenizer, source: str, namespace: dict, no_grad: bool, helpers: tuple = ()):
        self.model, self.tokenizer, self.source, self.ns, self.no_grad = model, tokenizer, source, namespace, no_grad
        self.helpers = helpers

    def run(self, batches, store):
        """(start, [{name: value} per example], plain names or None when the batch was found in DIR)."""
        for start, examples in batches:
            if store is not None and store.has(start, examples):
                yield start, [{}] * len(examples), None
                continue
            per_example, plain = run_batch(self.model, self.tokenizer, self.source, self.ns, examples, start,
                                           self.no_grad, self.helpers)
            yield start, per_example, plain


def _gather(gathered: dict, start: int, per_example: list) -> None:
    """Append each example's values to its names' lists (None where an example saved nothing by that name)."""
    for k, values in enumerate(per_example):
        for name, value in values.items():
            values_of_name = gathered.setdefault(name, [])
            values_of_name.extend([None] * (start + k - len(values_of_name)))
            values_of_name.append(value)


@contextlib.contextmanager
def _progress(total, shown: bool):
    """A text bar counting examples (after a second, so a short run shows none). tqdm's text form, not its
    notebook widget: a notebook keeps the bar's last line as plain output, which a saved or exported notebook
    shows with no kernel and no network (the widget's script comes from a CDN, and offline it is an empty box)."""
    from tqdm.std import tqdm
    bar = tqdm(total=total, desc="examples", unit="example", delay=1.0, disable=not shown, file=sys.stderr)
    try:
        yield bar
    finally:
        bar.close()
