"""An INPUT that reached the model with a value the model cannot take (`(1,)`, `{'input_ids': 5}`, a list of ids in
a tuple): the model's own AttributeError / TypeError stays, with a note that says how nbgrad passed INPUT and what
INPUT may be."""
from __future__ import annotations

import contextlib
import numbers
import reprlib

from ..errors import NbgradError, is_cell_frame
from ..errors.naming import a_or_an
from .inputs import INPUT_HELP

_PLAIN = (numbers.Number, str, bytes, list, tuple, dict, set)      # not what a model's forward takes for a tensor


@contextlib.contextmanager
def input_noted(input, args: tuple, kwargs: dict):
    """Run the model call inside; its AttributeError / TypeError over a plain value of INPUT gets `note_input`."""
    try:
        yield
    except (AttributeError, TypeError) as error:
        note_input(error, input, args, kwargs)
        raise


def note_input(error: BaseException, input, args: tuple, kwargs: dict) -> BaseException:
    """Note on `error` INPUT as nbgrad passed it, where the model itself raised it over a plain value of INPUT (the
    value's type is in the message) and no line of the cell was running; returns `error`."""
    plain = [(f"argument {i}", value) for i, value in enumerate(args) if _plain(value)] + \
            [(f"{name}=", value) for name, value in kwargs.items() if _plain(value)]
    named = [(where, value) for where, value in plain if f"'{type(value).__name__}'" in str(error)
             or f" {type(value).__name__}" in str(error)]
    if not named or isinstance(error, NbgradError) or _in_the_cell(error.__traceback__):
        return error
    how = "keyword arguments" if isinstance(input, dict) or not args else "positional arguments"
    given = "; ".join(f"{where} is {a_or_an(type(value).__name__)} `{reprlib.repr(value)}`" for where, value in named)
    error.add_note(f"nbgrad: INPUT {reprlib.repr(input)} went to the model as its {how}, as given: {given}, where the "
                   f"model takes a tensor. {INPUT_HELP}")
    return error


def _plain(value) -> bool:
    return isinstance(value, _PLAIN) and not isinstance(value, bool)


def _in_the_cell(tb) -> bool:
    while tb is not None:
        if is_cell_frame(tb.tb_frame):
            return True
        tb = tb.tb_next
    return False
