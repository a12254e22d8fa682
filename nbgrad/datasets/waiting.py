"""Waiting on Ray from the notebook's main thread, where an interrupt lands: a remote model's requests (each sent
and waited for), its actor made and killed; `--engine ray`'s batches waited for, its workers made, asked and killed.
A thread of its own does it and the main thread waits on that thread: an interrupt then lands in that wait, never
inside Ray's client code. Landing there at the wrong line (an interrupt comes at any line) can leave one of the
connection's locks held, and every later request on that connection, the one that stops the run included, hangs for
good."""
from __future__ import annotations

import threading
import time

POLL_S = 0.1           # `_thread.interrupt_main` raises only when the waiting thread wakes: at most this late


def off_main(fn, *args, limit_s: float | None = None):
    """`fn(*args)`, waited for by this thread while another runs it: its value, or its error raised here. On the
    main thread an interrupt stops the wait, not `fn` (which ends on its own: Ray is told to stop the run). After
    `limit_s` seconds (when given) the wait ends with None."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    done, box = threading.Event(), {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as error:        # raised in the waiting thread, as if fn had run there
            box["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, name="nbgrad-ray-wait", daemon=True).start()
    deadline = None if limit_s is None else time.monotonic() + limit_s
    while not done.wait(POLL_S):
        if deadline is not None and time.monotonic() >= deadline:
            return None
    if "error" in box:
        raise box.pop("error")
    return box.get("value")


BEGIN_S = 1.0       # how long a request an interrupt came upon is given to begin being sent (its thread started)


class Sending:
    """A Ray request being sent off the main thread (`send`): the task it makes, for whoever stops it after an
    interrupt that came as it was being sent (a remote model's run, exchange.py; a run's batch, ray_engine.py)."""
    __slots__ = ("begun", "done", "task")

    def __init__(self):
        self.begun, self.done, self.task = threading.Event(), threading.Event(), None

    def sent(self, limit_s: float):
        """Its task once it is sent; None where sending failed, never began (the interrupt came first) or took
        longer than `limit_s`."""
        if not self.begun.wait(BEGIN_S):
            return None
        self.done.wait(limit_s)
        return self.task


def send(submit, args: tuple, sending: Sending | None = None):
    """`submit(*args)`, a Ray request sent (off the main thread, by `off_main`), its task kept by `sending`."""
    if sending is None:
        return submit(*args)
    sending.begun.set()
    try:
        sending.task = submit(*args)
        return sending.task
    finally:
        sending.done.set()


def kill(ray, actor) -> None:
    """`ray.kill(actor)`, off the main thread: an actor already gone, or of a cluster since shut down, is no error."""
    off_main(_kill, ray, actor)


def _kill(ray, actor) -> None:
    try:
        ray.kill(actor)
    except Exception:
        pass
