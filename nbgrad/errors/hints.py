"""Common slips, and the one line that says what went wrong. Added to the error a user sees (as a
note, so its type and message stay as Python made them) or printed beside a value that is probably
not what the cell meant."""
from __future__ import annotations

import difflib
import re
import sys

import torch
from torch import nn

from . import NbgradError
from .naming import a_or_an

MODULE_EVENTS = ("output", "input", "inputs")
_NO_EVENT = re.compile(r"'(\w+)' object has no attribute '(output|inputs|input)'")
_NO_SKIP = re.compile(r"'(\w+)' object has no attribute 'skip'")
_NO_ATTRIBUTE = re.compile(r"'(\w+)' object has no attribute '(\w+)'")
EVENT_LIKE = (*MODULE_EVENTS, "source", "skip")     # what a %%trace cell reads or calls on a module
_CALLED_ONLY = ("cache", "stop")      # names a body has only as calls (compile/rewrite.py, RUNTIME_CALLS)


def add_hints(error: BaseException, events) -> None:
    """Note on `error` what nbgrad can tell about its cause from the run that raised it: `events` is what answered
    its reads (the run's ForwardEvents), with what they returned of note."""
    if not isinstance(error, Exception) or getattr(error, "_nbgrad_hinted", False):
        return
    hints = [_misspelled_event(error), _save_not_as_written(error), _event_outside_the_cell(error),
             _skip_not_a_statement(error), _not_called(error), _calls_without_event(error),
             _tuple_as_tensor(error, events.tuple_reads), _not_a_tensor(error, events.other_reads),
             _after_a_replacement(error, events.last_replacement)]
    for hint in filter(None, hints):
        error.add_note(f"nbgrad: {hint}")
    try:
        error._nbgrad_hinted = True
    except AttributeError:
        pass


def note_misspelled_event(error: BaseException) -> None:
    """Add to `error` (raised by a module's attribute lookup in a cell's frame) the note a run adds to a misspelled
    event, for a check made before any run (a remote model's skeleton)."""
    hint = _misspelled_event(error)
    if hint:
        error.add_note(f"nbgrad: {hint}")
        error._nbgrad_hinted = True


def _event_outside_the_cell(error) -> str | None:
    """`.output` read inside a function nbgrad does not run as part of the cell: a plain AttributeError."""
    found = _NO_EVENT.search(str(error)) if isinstance(error, AttributeError) else None
    if found is None or getattr(error, "obj", None) is not None and not isinstance(error.obj, nn.Module):
        return None
    return (f"`.{found.group(2)}` of a module is an event that only a %%trace cell's own statements can read, "
            f"with the plain functions (defined at the top level of this cell or an earlier one) and the methods of "
            f"the notebook's objects (`adapter()`, `obj.patch()`) that the cell calls directly. This one was read "
            f"inside a function called some other way (passed to map or a library, or called by another function or "
            f"method): read it in the cell and pass the value to the function")


def _misspelled_event(error) -> str | None:
    """`net[0].outptu`: a module's attribute that is no attribute of it but near an event's name."""
    found = _NO_ATTRIBUTE.search(str(error)) if isinstance(error, AttributeError) else None
    if found is None or found.group(2) in EVENT_LIKE or not isinstance(_raised_by(error), nn.Module):
        return None
    near = difflib.get_close_matches(found.group(2), EVENT_LIKE, n=1, cutoff=0.6)
    if not near:
        return None
    line = _cell_line(error)
    where = f"line {line}: " if line else ""
    return (f"{where}{found.group(1)} has no attribute `.{found.group(2)}`: did you mean `.{near[0]}`? "
            f"(a module's events: {', '.join('.' + e for e in MODULE_EVENTS)})")


def _save_not_as_written(error) -> str | None:
    """`x.save(1)` (a save with arguments is not the cell's save) or `x.sav()`: a tensor has no such method."""
    found = _NO_ATTRIBUTE.search(str(error)) if isinstance(error, AttributeError) else None
    if found is None or found.group(1) not in ("Tensor", "Parameter") or \
            (found.group(2) != "save" and not difflib.get_close_matches(found.group(2), ["save"], cutoff=0.7)):
        return None
    line = _cell_line(error)
    where = f"line {line}: " if line else ""
    meant = "" if found.group(2) == "save" else "did you mean `.save()`? "
    return (f"{where}{meant}`x.save()` keeps x after the cell, and takes no arguments (`nbgrad.save(x)` is the same); "
            f"a tensor has no `.{found.group(2)}` of its own")


def _calls_without_event(error) -> str | None:
    """`c = M.calls[1]` or `M.calls[1].outptu`: `.calls[k]` is nbgrad's only with an event after it (docs/calls.md)."""
    found = _NO_ATTRIBUTE.search(str(error)) if isinstance(error, AttributeError) else None
    if found is None or found.group(2) != "calls" or not isinstance(_raised_by(error), nn.Module):
        return None
    line = _cell_line(error)
    return (f"{f'line {line}: ' if line else ''}`.calls[k]`, the k-th call of a module, is read with one of its "
            f"events right after it, in the same expression: `M.calls[k].output`, `.input` or `.inputs`")


def _raised_by(error):
    """The object whose method raised `error`: `self` of the innermost frame of its traceback (torch's
    `Module.__getattr__` raises it with no `obj` attached)."""
    if getattr(error, "obj", None) is not None:
        return error.obj
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_locals.get("self") if tb is not None else None


def _cell_line(error) -> int | None:
    """The cell's line the error was raised on (the innermost frame of the compiled cell)."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<nbgrad-cell"):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _skip_not_a_statement(error) -> str | None:
    """`M.skip` written some other way than the statement `M.skip(v)`: a module has no `skip` of its own."""
    if not isinstance(error, AttributeError) or _NO_SKIP.search(str(error)) is None:
        return None
    return ("`M.skip(v)` is a statement of its own: a line that is only `M.skip(v)`, with one value v, which M's "
            "output becomes while M does not run (not `y = M.skip(v)`, nor `skip(v=...)`)")


def _not_called(error) -> str | None:
    """`cache` or `stop` used as a value: a body has them only as calls."""
    name = getattr(error, "name", None)
    if not isinstance(error, NameError) or name not in _CALLED_ONLY:
        return None
    return (f"`{name}` is a call a %%trace body makes where it is needed (`c = cache(...)`, `stop()`), not a name it "
            f"can pass around")


def _tuple_as_tensor(error, tuple_reads: dict) -> str | None:
    """A module that returns a tuple, its `.output` used as if it were a tensor."""
    if not tuple_reads or not isinstance(error, (AttributeError, TypeError)) or "tuple" not in str(error):
        return None
    use, length = next(iter(tuple_reads.values()))
    return (f"{use.target}.{use.kind} (line {use.line}) is a tuple of {length}, not a tensor: take "
            f"`{use.target}.{use.kind}[0]` for the first element")


def _not_a_tensor(error, other_reads: dict) -> str | None:
    """An event whose value is not a tensor (a site of a forward that assigns a function, a module that
    returns None or a dict), used as if it were one: Python's message names the value's type."""
    if not other_reads or not isinstance(error, (AttributeError, TypeError)):
        return None
    for use, type_name in other_reads.values():
        if f"'{type_name}'" in str(error):
            where = use.target.rpartition(".source.")
            look = (f": `%source {where[0]}` shows which line of its forward each site is" if where[1]
                    else "")
            return f"{use.target}.{use.kind} (line {use.line}) is {a_or_an(type_name)}, not a tensor{look}"
    return None


def note_edit(error: BaseException, label: str, events) -> None:
    """Note on an error raised during a call of a model that a persistent edit (`label`) was on, and what the
    edit replaced when the model failed after that; the cell's own hints are still added after this note."""
    if not isinstance(error, Exception):
        return
    replaced = _after_a_replacement(error, events.last_replacement)
    if isinstance(error, NbgradError):      # said in its message: IPython shows nbgrad's errors without notes
        error.detail = f"{error.detail}; raised by {label}, which is on the model: `.remove()` takes it off"
        error.args = (f"line {error.line}: {error.detail}" if error.line else error.detail,) + error.args[1:]
        return
    error.add_note(f"nbgrad: raised while {label} was on the model" + (f" ({replaced})" if replaced else "")
                   + "; `.remove()` takes it off")


def failed_after_replacement(error: BaseException, replacement) -> BaseException:
    """The model failed inside torch or transformers after the cell put a value of another form in place of a
    module's output with `.skip(v)`, or of a site's value: that is the error to show, with the form the value
    should have had; the model's own error is kept as its cause. (After an edit of a module's `.output` the
    model's own frames are the error, with a note: `_after_a_replacement`.)"""
    if replacement is None or not isinstance(error, (RuntimeError, ValueError, IndexError, TypeError)) or \
            isinstance(error, NbgradError) or not (replacement[0].skip or ".source." in replacement[0].target):
        return error
    use, before, after = replacement
    given = f"a tensor of shape {list(after)}" if isinstance(after, tuple) else a_or_an(after)
    failed = f"the model failed after that ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    if use.skip:           # the gate's event held nothing (or, in invokes, the other invokes' values) before v
        module = use.target[:-len(".skip")]
        message = (f"`{module}.skip(v)` gave v {given}, and {failed}: v stands in for that module's output, so it "
                   f"must have the form its forward returns (a tensor of the shape it returns; a tuple for many "
                   f"attention modules). Read `{module}.output` in a cell without the skip to see it")
    elif before == after:
        return error
    else:
        expected = f"a tensor of shape {list(before)}" if isinstance(before, tuple) else a_or_an(before)
        message = (f"{use.target}.{use.kind} is {expected}, and line {use.line} put {given} in its place; "
                   f"{failed}. Give a value of the form the model returns there ({expected})")
    replaced = NbgradError(message, use.line)
    replaced.__cause__ = error
    return replaced


def _after_a_replacement(error, replacement) -> str | None:
    """The model failed after the cell replaced a module's output or input with a value of another shape."""
    if replacement is None or not isinstance(error, (RuntimeError, ValueError, IndexError, TypeError)):
        return None
    use, before, after = replacement
    if before == after:
        return None
    return (f"line {use.line} replaced {use.target}.{use.kind} of shape {before} with a value of shape {after}; "
            f"the model failed after that")


def note_float_ids(error: RuntimeError, args: tuple, kwargs: dict) -> None:
    """The model's embedding refused a float INPUT (token ids are integers): say so beside torch's message."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if "indices" in str(error) and isinstance(ids, torch.Tensor) and ids.is_floating_point():
        error.add_note(f"nbgrad: INPUT is a tensor of {ids.dtype}, but the model looks token ids up in an embedding, "
                       f"and ids are integers: pass `ids.long()`, or give the text as a string")


def shape_of(value):
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def note_row_zero(use, value) -> None:
    """`M.output[0]` of a module that returns a tensor takes batch row 0, which older examples did not mean."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2:
        print(f"nbgrad: line {use.line}: {use.target}.{use.kind} is a tensor of shape {tuple(value.shape)}, so "
              f"`.{use.kind}[0]` takes batch row 0. (In transformers 5 a block returns a tensor, not a tuple: "
              f"older examples' `.output[0]` is `.output` here.)", file=sys.stderr)
