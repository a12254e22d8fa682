"""The error family of nbgrad, and the mapping from generated code back to cell lines.

Why a folder: every room raises these and names tensors and modules the way a user wrote them (`naming`),
and what to say about a failure (`diagnose`, `hints`) is one vocabulary; it sits below everything and
imports nothing else of nbgrad."""
from __future__ import annotations

import linecache
import os
import types

from .naming import LOOP_PREFIX, as_written

CELL_FILENAME_PREFIX = "<nbgrad-cell-"


class NbgradError(Exception):
    """An error in a traced cell. Its message names the cell line it concerns."""

    def __init__(self, message: str, line: int | None = None):
        if LOOP_PREFIX in message:       # a name of an unrolled loop's iteration: the user's own name instead
            message = as_written(message)
        self.line = line
        self.detail = message
        super().__init__(f"line {line}: {message}" if line else message)

    def _render_traceback_(self):
        """IPython shows this instead of a traceback of nbgrad's internals: one message, its notes and its cause."""
        lines = [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}", *getattr(self, "__notes__", ())]
        if self.__cause__ is not None:
            lines.append(f"  caused by {type(self.__cause__).__name__}: {self.__cause__}")
        return lines


class ModulePathError(NbgradError, AttributeError):
    """A module path that is not in the model."""


class InputError(NbgradError, ValueError):
    """An INPUT that cannot be turned into model call arguments."""


class ArgumentError(NbgradError, TypeError):
    """An argument of nbgrad.trace / nbgrad.backward (or a magic) of the wrong kind."""


class GradError(NbgradError, RuntimeError):
    """A backward pass or gradient statement that cannot run."""


class OrderError(NbgradError, RuntimeError):
    """A statement that cannot run in time: its event has already passed or never comes."""


def register_cell_source(source: str, serial: int) -> str:
    """Make the cell text visible to tracebacks under a filename of its own."""
    filename = f"{CELL_FILENAME_PREFIX}{serial}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    return filename


def is_cell_frame(frame: types.FrameType) -> bool:
    return frame.f_code.co_filename.startswith(CELL_FILENAME_PREFIX)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_CALL_MACHINERY = ("_call_impl", "_wrapped_call_impl")      # torch's Module.__call__, with its hooks


def _shown(frame: types.FrameType) -> bool:
    """Frames a user reads: not nbgrad's own, nor torch's machinery around a module call."""
    filename = frame.f_code.co_filename
    if filename.startswith(_PACKAGE_DIR):
        return False
    return not (frame.f_code.co_name in _CALL_MACHINERY and filename.endswith(os.path.join("nn", "modules", "module.py")))


def cell_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback a user reads. An error in the cell's code: from the cell's first frame on (what the
    cell called included). An error inside the model: the model's own frames. Never nbgrad's."""
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    first_cell = next((i for i, (frame, _, _) in enumerate(frames) if is_cell_frame(frame)), 0)
    trimmed = None
    for frame, lasti, lineno in reversed(frames[first_cell:]):
        if _shown(frame):
            trimmed = types.TracebackType(trimmed, frame, lasti, lineno)
    return trimmed


def located(error: BaseException, uses, filename: str | None = None) -> BaseException:
    """An nbgrad error with no line: raised inside the model about a path of the cell (`error.path`, e.g. a site
    of a callee, known only when it is called), the same error at the line of the first use naming it; raised by
    the cell's own code (an unknown site, `M.source.NAME`), at the cell's line it came from (`filename`'s)."""
    if not isinstance(error, NbgradError) or error.line is not None:
        return error
    path = getattr(error, "path", None)
    if path is not None:
        line = next((use.line for use in uses if path + "." in use.target + "."), None)
    else:
        line = _line_in(error.__traceback__, filename)
    if line is None:
        return error
    found = type(error)(error.detail, line)
    found.__cause__, found.__suppress_context__ = error.__cause__, True
    return found


def _line_in(tb, filename: str | None) -> int | None:
    """The last line of `filename` (a compiled cell) the traceback passes through."""
    line = None
    while tb is not None and filename is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def at_cell_line(error: BaseException, filename: str, line: int) -> BaseException:
    """`error` with a traceback of one frame, at `line` of the compiled cell `filename` (whose text linecache
    has): an error the cell raised in another process (a dataset run's worker), whose own frames stayed there."""
    code = compile("\n" * (line - 1) + "raise error", filename, "exec").replace(co_name="<cell>")
    try:
        exec(code, {"error": error})
    except BaseException as raised:
        return raised.with_traceback(raised.__traceback__.tb_next)      # from the cell's frame on
    return error


def for_the_cell(error: BaseException) -> BaseException:
    """The error as a cell shows it: an nbgrad error as its one message (cause kept), any other error
    with the frames a user reads (see `cell_traceback`)."""
    if isinstance(error, NbgradError):
        return error.with_traceback(None)
    return error.with_traceback(cell_traceback(error.__traceback__) or error.__traceback__)
