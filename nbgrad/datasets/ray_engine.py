"""`--engine ray`: batches run as Ray tasks on actors that each hold a model, on the cluster `ray.init(...)`
connected to (or a local one started here). A worker builds its model the way the notebook did: with the
arguments `nbgrad.load_model` recorded, or with `--model-factory`. The body's free names go with each
batch; a module of the notebook's model among them is sent as its path and found in the worker's model.

Results come back in dataset order. At most two batches per worker are in flight, so memory stays bounded
when a DIR takes the values. Workers load the model's weights themselves: edits made to the notebook's
model after loading it are not on the workers."""
from __future__ import annotations

import ast
import os
from collections import deque

from torch import nn

from ..engine.compile.compiler import compile_cell
from ..engine.compile.dataflow import bound_names, read_names
from .cluster import connected
from .waiting import Sending, kill, off_main, send
from ..errors import NbgradError, at_cell_line
from ..errors.naming import a_or_an
from ..models import loading
from ..names.rewrite import implementation_of

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

        def run(self, source, shipped, examples, start, no_grad, helpers, attention):
            from ..names.rewrite import attention_as
            from .batch import run_batch
            namespace = {name: self.model if value == "__nbgrad_model__" else
                         self.modules[value.path] if isinstance(value, _ModulePath) else value
                         for name, value in shipped.items()}
            with attention_as(self.model, attention):      # as the notebook's model runs the cell (patterns: eager)
                per_example, plain = run_batch(self.model, self.tokenizer, source, namespace, examples, start,
                                               no_grad, helpers)
            return per_example, plain, os.getpid()

        def ready(self):
            return True

    return DatasetWorker


class RayBatches:
    """Batches run on Ray actors, handed out as they come and gathered in order. The actors are made when
    the first batch needs one (a run whose batches are all in DIR starts none) and kept for the next run of
    the same model on the same cluster (loading a model is most of a short run's time)."""

    def __init__(self, model: nn.Module, source: str, namespace: dict, no_grad: bool, workers, model_factory,
                 helpers: tuple = ()):
        self.build, self.key = _builder(model, model_factory)
        self.shipped = shipped_names(source, namespace, model, helpers)      # errors here: nothing has run
        self.source, self.no_grad, self.workers, self.helpers = source, no_grad, workers, helpers
        self.attention = implementation_of(model)         # the notebook's model's, for this cell
        self.actors: list = []

    def run(self, batches, store):
        import ray
        pending, free = deque(), deque()
        kept = store is not None             # a DIR keeps the finished batches
        sending = None                       # the batch being sent: its task, for `_settle`, once it is sent
        try:
            for start, examples in batches:
                if store is not None and store.has(start, examples):
                    pending.append((start, len(examples), None, None))
                else:
                    if not self.actors:
                        self.actors = _actors(self.build, self.key, self.workers)
                        free.extend(self.actors * IN_FLIGHT_PER_WORKER)
                    while not free:
                        yield from self._finish_first(pending, free, ray, kept)
                    actor, sending = free.popleft(), Sending()
                    task = off_main(send, actor.run.remote, (self.source, self.shipped, examples, start, self.no_grad,
                                                             self.helpers, self.attention), sending)
                    pending.append((start, len(examples), task, actor))
                    sending = None
                while pending and pending[0][2] is None:
                    start, count, _, _ = pending.popleft()
                    yield start, [{}] * count, None
            while pending:
                yield from self._finish_first(pending, free, ray, kept)
        finally:
            off_main(_settle, ray, [task for _, _, task, _ in pending if task is not None], sending,
                     limit_s=2 * SETTLE_S)

    def _finish_first(self, pending: deque, free: deque, ray, kept: bool):
        start, count, task, actor = pending.popleft()
        if task is None:
            yield start, [{}] * count, None
            return
        try:
            per_example, plain, _ = off_main(ray.get, task)
        except ray.exceptions.RayTaskError as error:      # the cell's own error, raised on the worker
            raised = self._from_worker(error)
            raised.__suppress_context__ = True             # Ray's wrapping is not shown; a cause of its own is
            raise raised
        except ray.exceptions.RayActorError as error:
            _drop_pools()                                   # the next run starts a fresh set
            raise NbgradError(f"--engine ray: the worker running examples {start}-{start + count - 1} was lost (its "
                              f"process ended), and the run stopped there. "
                              + (LOST_WITH_DIR if kept else LOST)) from error
        free.append(actor)
        yield start, per_example, plain

    def _from_worker(self, error) -> BaseException:
        """What a worker raised, as the same run here raises it: the error itself (Ray's wrapping gone), at the
        cell's line it came from."""
        cause = getattr(error, "cause", None)
        if not isinstance(cause, BaseException):
            return NbgradError(f"--engine ray: a worker failed: {error}")
        line = getattr(cause, "nbgrad_cell_line", None)
        if isinstance(cause, NbgradError) or not line:
            return cause
        return at_cell_line(cause, compile_cell(self.source, "trace").filename, line)


SETTLE_S = 10        # how long a stopped run waits for the batches it cancelled, at most


def _settle(ray, tasks: list, sending=None) -> None:
    """Cancel the batches still running when a run stops, and take their outcome (an error too): a result that no
    one takes is printed by Ray as an "Unhandled error", beside the error the run raised. `sending`: a batch that an
    interrupt came upon as it was being sent (waiting.Sending), whose task is there once it is sent."""
    late = sending.sent(SETTLE_S) if sending is not None else None
    if late is not None and late not in tasks:
        tasks.append(late)
    for task in tasks:
        ray.cancel(task)
    done, _ = ray.wait(tasks, num_returns=len(tasks), timeout=SETTLE_S) if tasks else ([], [])
    for task in done:
        try:
            ray.get(task)
        except Exception:            # their errors are not the run's: it raised the first one
            pass


LOST = "Nothing was bound: run the cell again (with --out DIR, a run keeps every batch it finished)"
LOST_WITH_DIR = "Every batch finished before it is in DIR: run the cell again to compute only the rest"


# (what builds the model, worker count, GPUs) -> (cluster's job id, actors, the builder kept alive); one entry
# at most
_pools: dict = {}


def _drop_pools() -> None:
    """End the kept actors (one set at a time: they hold the cluster's CPUs / GPUs)."""
    import ray
    for key in list(_pools):
        for actor in _pools.pop(key)[1]:
            kill(ray, actor)


def _actors(build, key, workers) -> list:
    """The actors for this model on the cluster now: kept from an earlier run, or made."""
    import ray
    connected()        # the notebook's cluster, or a local one started with a bounded retry
    gpus = int(off_main(ray.cluster_resources).get("GPU", 0))
    count = workers or gpus or 2
    job = ray.get_runtime_context().get_job_id()
    pool_key = (key, count, gpus)
    kept = _pools.get(pool_key)
    if kept is not None and kept[0] == job and _all_alive(ray, kept[1]):
        return kept[1]
    _drop_pools()
    options = {"num_gpus": 1} if gpus else {"num_cpus": 1}
    worker = _worker_class().options(**options)
    actors = off_main(lambda: [worker.remote(build) for _ in range(count)])
    _pools[pool_key] = (job, actors, build)
    return actors


def _all_alive(ray, actors: list) -> bool:
    """Whether every kept actor still answers (one that died while idle would fail the next run's batches)."""
    try:
        off_main(lambda: ray.get([actor.ready.remote() for actor in actors], timeout=60))
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False
    return True


def _builder(model: nn.Module, model_factory) -> tuple:
    """(what a worker calls to get its model, a key that says which model that is)."""
    if model_factory is not None:
        if not callable(model_factory):
            raise NbgradError(f"--model-factory must be a function that returns the model, not "
                              f"{a_or_an(type(model_factory).__name__)}")
        check_picklable("--model-factory", model_factory)
        return model_factory, ("factory", id(model_factory))
    recorded = loading.load_arguments(model)
    if recorded is None:
        raise NbgradError(f"--engine ray loads the model on each worker the way nbgrad.load_model loaded it; "
                          f"this {type(model).__name__} was not loaded by nbgrad.load_model: give "
                          f"--model-factory EXPR (a function that returns the model)")
    name, kwargs = recorded
    return _LoadModel(name, kwargs), ("load_model", name, repr(sorted(kwargs.items())))


class _LoadModel:
    def __init__(self, name, kwargs):
        self.name, self.kwargs = name, kwargs

    def __call__(self):
        return loading.load_model(self.name, **self.kwargs)


def shipped_names(source: str, namespace: dict, model: nn.Module, helpers: tuple = ()) -> dict:
    """The body's free names with their values from the namespace, ready to send: the model by a marker,
    its modules by path; a value that cannot be pickled is an error that names it. The names a helper from
    an earlier cell reads go too (its globals are the notebook's, which a worker does not have)."""
    import textwrap
    tree = ast.parse(textwrap.dedent(source))
    bound = set().union(*(bound_names(stmt)[0] for stmt in tree.body)) if tree.body else set()
    free = set().union(*(read_names(stmt) for stmt in tree.body)) - bound if tree.body else set()
    if helpers:
        free |= compile_cell(source, "trace", helpers).helper_globals
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
            check_picklable(f"the name `{name}`", value)
            shipped[name] = value
    return shipped


def check_picklable(what: str, value, sends: str = "--engine ray sends the body's names to the workers",
                     instead: str = "Make it in the body, or give the workers what they need another way") -> None:
    """Refuse, before anything runs, a value that cannot travel to Ray (`sends` says where it would go)."""
    from ray import cloudpickle
    try:
        cloudpickle.dumps(value)
    except Exception as error:
        raise NbgradError(f"{sends}, and {what} (a {type(value).__name__}) cannot be pickled: "
                          f"{type(error).__name__}: {error}. {instead}") from error
