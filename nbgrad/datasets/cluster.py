"""The Ray cluster that `--engine ray` and a remote model use: the one `ray.init(...)` connected the notebook to (a `ray://`
client included), or a local one started here. A start is tried a bounded number of times, and a failure
says what failed each time: on a busy machine a node's start can fail ("The current node timed out during
startup": its raylet waits 15 s for its agent, whose imports alone can take that long), and the next one work.
A start counts once the cluster answers a first request: a `ray://` client's session can be cleaned up on the
server while its first stream opens ("Attempted to reconnect a session that has already been cleaned up")."""
from __future__ import annotations

import time

from ..errors import NbgradError
from .waiting import off_main

START_ATTEMPTS = 3
ANSWER_S = 120
# How long the processes of a failed or interrupted start get to end on SIGTERM before SIGKILL: nothing of theirs is
# kept, and an interrupt waits for them (some of Ray's ignored SIGTERM for the 10 s given before)
END_GRACE_S = 3


def connected(**init_options) -> None:
    """Connect to a cluster unless the notebook already has: a local one, started with `init_options`."""
    import ray
    if ray.is_initialized():
        return
    start_cluster(**{"include_dashboard": False, "logging_level": "ERROR", **init_options})


def start_cluster(attempts: int = START_ATTEMPTS, pause_s: float = 2.0, **init_options) -> None:
    """`ray.init(**init_options)`, tried up to `attempts` times; every failure is kept and said at the end. An
    interrupt ends the start: what the attempt started goes first (a local cluster's GCS, raylet and agents would
    outlive it, holding CPUs and ports, and the next start would make a second cluster)."""
    import ray
    failures = []
    for attempt in range(attempts):
        before = _children()
        try:
            ray.init(**init_options)
            ray.get(ray.put(None), timeout=ANSWER_S)    # it answers: a `ray://` client's data channel can die as it opens
            return
        except BaseException as error:      # Ray raises several kinds (ConnectionError, RuntimeError, TimeoutError)
            off_main(_stop_attempt, ray, before)         # (a second interrupt stops the wait, not the clean-up)
            if not isinstance(error, Exception):
                raise
            failures.append(f"attempt {attempt + 1}: {type(error).__name__}: {error}")
            time.sleep(pause_s * (attempt + 1))       # a busy machine: give the last start's processes time to go
    raise NbgradError(f"could not start or reach a Ray cluster with ray.init({_options(init_options)}) in "
                      f"{attempts} attempts: " + "; ".join(failures))


def _options(options: dict) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in options.items() if key != "runtime_env")


def _stop_attempt(ray, before: set) -> None:
    """Disconnect, and end the processes a failed or interrupted start left (started since `before`)."""
    ray.shutdown()
    _end(_children() - before)


def _children() -> set:
    import psutil
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _end(pids: set) -> None:
    """End the processes a failed start left (its GCS, monitor, dashboard...: they would hold CPUs and ports)."""
    import psutil
    processes = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            process.terminate()
            processes.append(process)
        except psutil.Error:                # already gone
            pass
    _, alive = psutil.wait_procs(processes, timeout=END_GRACE_S)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=END_GRACE_S)       # reaped: none is left a zombie
