"""Inject a KeyboardInterrupt at the k-th line that nbgrad's own code or the cell runs, for a sweep of k.

`sys.settrace` sees every line event; only lines in files of the nbgrad package and in compiled cells
(`<nbgrad-cell-N>`) count. The interrupt is raised from the trace function, so it surfaces exactly at
that line, as a real Ctrl-C would between two bytecodes of it. A trace function that raises is
switched off by Python, so each run gets exactly one interrupt.
"""
import gc
import os
import sys

import nbgrad
from nbgrad.errors import CELL_FILENAME_PREFIX

PACKAGE_DIR = os.path.dirname(os.path.abspath(nbgrad.__file__)) + os.sep


def counted(filename: str) -> bool:
    return filename.startswith(PACKAGE_DIR) or filename.startswith(CELL_FILENAME_PREFIX)


class Injector:
    """Counts counted line events; raises KeyboardInterrupt at the `at`-th (never, with at=None)."""

    def __init__(self, at=None, record=False):
        self.at = at
        self.count = 0
        self.where = None
        self.lines = [] if record else None      # (file, function, line) of each counted line event

    def __enter__(self):
        # No collection of cycles while tracing: a collection runs weakref callbacks (byid.py's) in the middle of
        # whatever line allocated, a different one in every run, at the whim of what earlier tests left. An
        # interrupt there is one Python swallows ("Exception ignored in"), and raised from a trace function inside
        # such a callback it once left CPython 3.11's trace state broken: the next call event called a traceback
        # object ("TypeError: 'traceback' object is not callable"), as if the trace function had been freed; a
        # likely cause of the one crash (SIGSEGV) of a sweep seen in CI. Without collections the line events are
        # the same in every run of the cell.
        self.collecting = gc.isenabled()
        gc.disable()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)
        if self.collecting:
            gc.enable()
        return False

    def _call(self, frame, event, arg):
        return self._line if counted(frame.f_code.co_filename) else None

    def _line(self, frame, event, arg):
        if event == "line":
            self.count += 1
            if self.lines is not None:
                self.lines.append((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name,
                                   frame.f_lineno))
            if self.count == self.at:
                self.where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
                raise KeyboardInterrupt(f"injected at line event {self.at} ({self.where})")
        return self._line


# nbgrad's set-up and clean-up: where a missed line leaves hooks, flags or names behind.
SETUP_AND_CLEANUP = {"__init__", "_run", "_cleanup", "_write_back", "run_trace", "run_backward", "body",
                     "trace", "backward", "wrapper", "_display", "after_cell", "_enter", "_exit", "close",
                     "any_traces", "install", "restore_grad_state", "restore_namespace",
                     "remove_all", "replace", "_add", "acquire", "release", "register_forward_hook", "_bind",
                     "remove", "give_back_forward"}


# NBGRAD_INTERRUPT_FULL: unset, the bounded sweep of `make test`; "1" (`make fuzz`), every line: each line of nbgrad's
# code and the cell's that a clean run reaches, compile included, tried the first and the last time it runs, and every
# line event of a set-up or clean-up function; "events", every line event (hours: the invoke loop alone has 28,000).
FULL_MODE = {"1": "lines", "events": "events"}.get(os.environ.get("NBGRAD_INTERRUPT_FULL", ""), "")


def points(lines: list, full, stride: int) -> list:
    """Which k to try, by mode (FULL_MODE; `full` True means "events"): "events", all of them; "lines", every
    line's first and last event and every event of a set-up or clean-up function; else the first time each line of
    a set-up or clean-up function runs, and every `stride`-th other event. `lines` holds (file, function, line) of
    each line event of a clean run."""
    mode = full if isinstance(full, str) else "events" if full else ""
    if mode == "events":
        return list(range(1, len(lines) + 1))
    chosen, last = set(), {}
    for k, (filename, function, line) in enumerate(lines, start=1):
        new = (filename, line) not in last
        last[(filename, line)] = k
        if mode == "lines":
            take = new or function in SETUP_AND_CLEANUP
        else:
            take = (new and function in SETUP_AND_CLEANUP) or k % stride == 1
        if take:
            chosen.add(k)
    return sorted(chosen | set(last.values())) if mode == "lines" else sorted(chosen)
