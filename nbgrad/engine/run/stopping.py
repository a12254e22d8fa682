"""`stop()` in a cell: the model's run ends once the statement that called it has run, so later modules
never run (nnsight's `tracer.stop()`). The hook that delivered the event raises `StopRun` through the
model's forward, and the run catches it around the model call."""
from __future__ import annotations

from ...errors import NbgradError, OrderError


class StopRun(BaseException):
    """Ends the model's forward call from inside a hook. A BaseException, so that a model's own
    `except Exception` cannot swallow it."""


def request_stop(runtime, line: int, *args, **kwargs) -> None:
    """`stop()`: the forward call ends after the current statement; after the forward pass it does nothing."""
    if args or kwargs:
        given = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
        raise NbgradError(f"stop() takes no arguments (given: {given}): it ends the model run once the statement "
                          f"that calls it has run. To stop after a module, call stop() after the line that reads "
                          f"that module's output", line)
    if runtime.stepping:
        raise NbgradError("stop() ends a %%trace run; %%generate runs the model once per new token: use "
                          "--max-new-tokens, or %%trace the prompt to stop inside one forward call", line)
    if not runtime.forward.done and runtime.stopped_at is None:
        runtime.stopped_at = line
        runtime.forward.stopping = True


def never_came_after_stop(use, module_text: str, stop_line: int, invokes: bool = False) -> OrderError:
    """`invokes`: the run is one batch of several invokes, which a stop() in any of them ends for all."""
    batch = " (for the whole batch: every invoke runs in that one call)" if invokes else ""
    return OrderError(f"{use.target}.{use.kind} never came: stop() at line {stop_line} ended the model run{batch} "
                      f"before {module_text} ran. Read it before stopping, or move stop() after the "
                      f"statements that need it", use.line)
