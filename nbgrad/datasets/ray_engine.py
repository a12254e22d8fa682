"""`--engine ray`: batches run as Ray tasks on actors that each hold a model, on the cluster `ray.init(...)`
connected to (or a local one started here). A worker builds its model the way the notebook did: with the
arguments `nbgrad.load_model` recorded, or with `--model-factory`. The body's free names go with each
batch; a module of the notebook's model among them is sent as its path and found in the worker's model.

Results come back in dataset order. At most two batches per worker are in flight, so memory stays bounded
when a DIR takes the values."""
from __future__ import annotations

import ast
import os
from collections import deque

from torch import nn

from ..engine.compile.dataflow import bound_names, read_names
from ..errors import NbgradError
from ..models import loading

IN_FLIGHT_PER_WORKER = 2


class _ModulePath:
    """A module of the notebook's model, sent as its path in `named_modules()`."""

    def __init__(self, path: str):
        self.path = path


def _worker_class():
    import ray

    @ray.remote
    class DatasetWorker:
        """One model, and the batches given to it."""

        def __init__(self, build):
            from ..models.cell import model_to_trace
            self.model, self.tokenizer = model_to_trace(build(), note=False)
            self.modules = dict(self.model.named_modules())

        def run(self, source, shipped, examples, start, no_grad):
            from .batch import run_batch
            namespace = {name: self.model if value == "__nbgrad_model__" else
                         self.modules[value.path] if isinstance(value, _ModulePath) else value
                         for name, value in shipped.items()}
            per_example, plain = run_batch(self.model, self.tokenizer, source, namespace, examples, start, no_grad)
            return per_example, plain, os.getpid()

    return DatasetWorker


class RayBatches:
    """Batches run on Ray actors, handed out as they come and gathered in order."""

    def __init__(self, model: nn.Module, source: str, namespace: dict, no_grad: bool, workers, model_factory):
        import ray
        build = _builder(model, model_factory)
        self.shipped = shipped_names(source, namespace, model)      # errors here: nothing has run
        self.source, self.no_grad = source, no_grad
        if not ray.is_initialized():
            ray.init(include_dashboard=False, logging_level="ERROR")
        gpus = int(ray.cluster_resources().get("GPU", 0))
        count = workers or gpus or 2
        options = {"num_gpus": 1} if gpus else {"num_cpus": 1}
        worker = _worker_class().options(**options)
        self.actors = [worker.remote(build) for _ in range(count)]
        self.pids: set = set()

    def run(self, batches, store):
        import ray
        pending, free = deque(), deque(self.actors)
        free.extend(self.actors * (IN_FLIGHT_PER_WORKER - 1))
        try:
            for start, examples in batches:
                if store is not None and store.has(start, len(examples)):
                    pending.append((start, len(examples), None, None))
                else:
                    actor = free.popleft() if free else None
                    while actor is None:
                        yield from self._finish_first(pending, free, ray)
                        actor = free.popleft() if free else None
                    task = actor.run.remote(self.source, self.shipped, examples, start, self.no_grad)
                    pending.append((start, len(examples), task, actor))
                while pending and pending[0][2] is None:
                    start, count, _, _ = pending.popleft()
                    yield start, [{}] * count, None
            while pending:
                yield from self._finish_first(pending, free, ray)
        finally:
            for actor in self.actors:
                ray.kill(actor)

    def _finish_first(self, pending: deque, free: deque, ray):
        start, count, task, actor = pending.popleft()
        if task is None:
            yield start, [{}] * count, None
            return
        per_example, plain, pid = ray.get(task)
        self.pids.add(pid)
        free.append(actor)
        yield start, per_example, plain


def _builder(model: nn.Module, model_factory):
    """What a worker calls to get its model."""
    if model_factory is not None:
        if not callable(model_factory):
            raise NbgradError(f"--model-factory must be a function that returns the model, not a "
                              f"{type(model_factory).__name__}")
        _check_picklable("--model-factory", model_factory)
        return model_factory
    recorded = loading.load_arguments(model)
    if recorded is None:
        raise NbgradError(f"--engine ray loads the model on each worker the way nbgrad.load_model loaded it; "
                          f"this {type(model).__name__} was not loaded by nbgrad.load_model: give "
                          f"--model-factory EXPR (a function that returns the model)")
    name, kwargs = recorded
    return _LoadModel(name, kwargs)


class _LoadModel:
    def __init__(self, name, kwargs):
        self.name, self.kwargs = name, kwargs

    def __call__(self):
        return loading.load_model(self.name, **self.kwargs)


def shipped_names(source: str, namespace: dict, model: nn.Module) -> dict:
    """The body's free names with their values from the namespace, ready to send: the model by a marker,
    its modules by path; a value that cannot be pickled is an error that names it."""
    import textwrap
    tree = ast.parse(textwrap.dedent(source))
    bound = set().union(*(bound_names(stmt)[0] for stmt in tree.body)) if tree.body else set()
    free = set().union(*(read_names(stmt) for stmt in tree.body)) - bound if tree.body else set()
    paths = {id(module): path for path, module in model.named_modules()}
    shipped = {}
    for name in sorted(free):
        if name not in namespace:
            continue
        value = namespace[name]
        if value is model:
            shipped[name] = "__nbgrad_model__"
        elif isinstance(value, nn.Module) and id(value) in paths:
            shipped[name] = _ModulePath(paths[id(value)])
        else:
            _check_picklable(f"the name `{name}`", value)
            shipped[name] = value
    return shipped


def _check_picklable(what: str, value) -> None:
    from ray import cloudpickle
    try:
        cloudpickle.dumps(value)
    except Exception as error:
        raise NbgradError(f"--engine ray sends the body's names to the workers, and {what} (a "
                          f"{type(value).__name__}) cannot be pickled: {type(error).__name__}: {error}. Make "
                          f"it in the body, or give the workers what they need another way") from error
