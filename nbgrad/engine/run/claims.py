"""Which runs are going on: per thread, the runs now running (innermost last), and per model, the thread
whose runs trace it. Every run (runtime.py) takes and gives back its place here."""
from __future__ import annotations

import threading
from threading import get_ident

from ...errors import NbgradError


class _PerThread(threading.local):
    """Made anew in each thread that reads it, so that `_local.runtimes` always exists there."""

    def __init__(self):
        self.runtimes: list = []         # the runtimes now running in this thread, innermost last


_local = _PerThread()
_tracing: dict = {}                 # id(model) -> id of the thread whose runs trace it


def active_runtime():
    runtimes = _local.runtimes
    return runtimes[-1] if runtimes else None


def claim(model) -> None:
    """One model, one trace at a time: two threads tracing it would mix their edits and values. No lock:
    `setdefault` is atomic, and a lock's `with` can be cut by an interrupt before it releases."""
    if model is not None and _tracing.setdefault(id(model), me := get_ident()) != me:
        raise NbgradError(f"{type(model).__name__} is being traced by another thread right now: nbgrad runs "
                          f"one trace of a model at a time. Wait for it, or trace a copy")


def release(run, runtimes: list) -> None:
    """Take `run` off its thread's list, and give its model back unless a run of this thread that this one is
    nested in still traces it. Idempotent."""
    model = run.model
    if len(runtimes) == 1 and runtimes[0] is run and _tracing.get(id(model)) == get_ident():
        runtimes.pop()                   # the common case, first: no run of this thread around this one
        _tracing.pop(id(model), None)
        return
    if run in runtimes:
        runtimes.remove(run)
    if (model is not None and (not runtimes or not any_traces(runtimes, model))
            and _tracing.get(id(model)) == get_ident()):
        _tracing.pop(id(model), None)


def any_traces(runtimes: list, model) -> bool:
    """Does one of these runs trace `model`? (A loop, not any(...): no generator's call.)"""
    for run in runtimes:
        if run.model is model:
            return True
    return False
