"""One request to the remote model's actor and its answer: the bytes counted, an interrupt here carried there,
the actor's error raised as the local cell raises it."""
from __future__ import annotations

from ..engine.compile.compiler import compile_cell
from ..errors import NbgradError, at_cell_line
from ..datasets.waiting import Sending, off_main

INTERRUPT_WAIT_S = 60


def exchange(handle, kind: str, source: str, shipped: dict, input, options: dict, stats: dict | None = None):
    """Send one request to the actor and wait for it: what the actor's run gave, or its error raised as the
    local cell raises it. The bytes each way are counted in `stats` (a new `stats()` entry when None)."""
    from ray import cloudpickle
    handle._send_forgotten()
    request = cloudpickle.dumps((kind, source, shipped, input, options))
    answer = _wait(handle, handle._actor.run.remote, request)
    if stats is None:
        handle._stats.append(stats := {"cell": source.strip().split("\n")[0], "sent": 0, "received": 0})
    stats["sent"] += len(request)
    stats["received"] += len(answer)
    outcome = cloudpickle.loads(answer)
    if outcome[0] == "error":
        raise _as_here(outcome[1], outcome[2], compile_cell(source, kind if kind == "backward" else "trace").filename)
    return outcome[1]


def _wait(handle, submit, request: bytes) -> bytes:
    """The run's answer; an interrupt here interrupts the run there and waits for its clean-up to finish, so
    the model is clean when the interrupt reaches the notebook. The request is sent, and both waits are, off the
    main thread (waiting.py): an interrupt as it is sent stops the run once it is sent."""
    sending = Sending()
    try:
        return handle._ask(submit, request, sending=sending)
    except KeyboardInterrupt:
        try:
            off_main(_stop_there, handle._actor, sending, limit_s=INTERRUPT_WAIT_S)
        finally:
            raise


def _stop_there(actor, sending: Sending) -> None:
    """The run there is interrupted (its clean-up runs), and is over when this returns; where its request was never
    sent, there is nothing to stop."""
    import ray
    task = sending.sent(INTERRUPT_WAIT_S)        # the request may still be on its way: here once sent
    if task is None:
        return
    actor.interrupt.remote()
    ray.cancel(task)                              # a run still queued behind another is dropped
    ray.wait([task], timeout=INTERRUPT_WAIT_S)


def _as_here(error: BaseException, line, filename: str) -> BaseException:
    """The actor's error as the local cell raises it: an nbgrad error carries its line; another error is raised
    from the cell's line, whose text this notebook has."""
    if isinstance(error, KeyboardInterrupt):
        return KeyboardInterrupt()
    if isinstance(error, NbgradError) or not line:
        return error
    return at_cell_line(error, filename, line)
