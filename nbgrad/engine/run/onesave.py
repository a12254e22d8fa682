"""The statement kind "the one-read cell": `NAME = PATH.output.save()` alone (Program.one_save), the most common cell
there is, answered by its hook with no statement run (Runtime._forward, with the fast kinds).

Run as a statement, the cell would start the statement's generator, park it on the event, log the event in the
forward, replay the log and resume the statement to save: some fifteen Python calls, run cold between two forward
passes, for what a raw hook does in one. Here the run finds the module as the statement would, by `_modules`
(elements.py) and never by running the path's code, hooks it, and once the model has run does what the resumed
statement would have done: binds NAME to the value of the module's first call and saves it, or says that the event
never came. The timeline gets the two rows the statement would have written (started before the model; woken by its
one event), and a differential test holds the two kinds equal. A path not found that way (a class with ways of its
own, a compiled module, the model itself, a name not bound) goes the general way, from the start: nothing has
happened yet."""
from __future__ import annotations

from functools import partial

from torch import Tensor

from ...errors import hints
from .calls import note_called_again
from .elements import walk
from .missing import HOOKABLE, never_ran, note_type
from .scheduler import AFTER_FORWARD, BEFORE_MODEL, FORWARD


def forward_one(run, one: tuple, call_args: tuple, call_kwargs: dict) -> bool:
    """Run the model for the cell `one` describes; False, having done nothing, where the general way must."""
    module = walk(run.ns, one[1], one[2])
    if (module is None or module is run.model or not isinstance(module, HOOKABLE)
            or type(module).__name__ == "OptimizedModule"):
        return False
    key, forward = (id(module), "output"), run.forward
    run.unstarted.clear()                           # the statement starts, and waits for its event
    run.timeline.append((0, None, BEFORE_MODEL))
    forward.requested.add(0)
    kept: dict = {}                                 # the value of the module's first call, once it has run
    run.hooks.forward_hook(key, module, partial(_kept, forward, kept, key))
    forward.model_running, run.phase = True, FORWARD
    try:
        try:
            run.model(*call_args, **call_kwargs)
        except Exception:
            if kept:        # the statement had its value inside the hook: it is saved before the error goes on
                _saved_one(run, one, kept[key])
            raise
    except RuntimeError as error:
        hints.note_float_ids(error, call_args, call_kwargs)
        raise
    if kept:
        _saved_one(run, one, kept[key])
    forward.model_running, forward.done, run.phase = False, True, AFTER_FORWARD
    if not kept:            # still waiting when the cell ends: the event never came
        raise never_ran(run.forward.uses[0], module, run.model, late=False)
    return True


def _kept(forward, kept: dict, key, module, args, value) -> None:
    """The module's output hook: the first value for the read, the last for the sidebar's shape."""
    if key not in kept:
        kept[key] = value
    else:                   # the module called again: the hint about `M.calls[k]`, once (calls.py)
        note_called_again(forward, key)
    forward.values[key] = value


def _saved_one(run, one: tuple, value) -> None:
    """What the statement does with its value: saved, then bound (the rewritten `NAME = save(...)`)."""
    run.timeline.append((0, 0, run.phase))
    if type(value) is not Tensor:
        note_type(run.forward, 0, run.forward.uses[0], value)
    run.by_id[id(value)] = (one[3], value, one[4])
    run.ns[one[0]] = value
    run.finished.add(0)
