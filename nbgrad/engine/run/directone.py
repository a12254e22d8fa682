"""The cell that is one read, saved: `NAME = PATH.output.save()` alone (Program.one_save), the most common cell there
is, answered by its hook with no statement run. A part of DirectRun (direct.py), whose attributes it uses.

A direct run would start the statement's generator, park it on the event, log the event in the forward, replay the
log and resume the statement to save: some fifteen Python calls, run cold between two forward passes, for what a raw
hook does in one. Here the run finds the module as the statement would, by `_modules` (elements.py) and never by
running the path's code, hooks it, and once the model has run does what the resumed statement would have done: binds
NAME to the value of the module's first call and saves it, or says that the event never came. Its timeline rows (the
statement started, woken by its one event) and values are what the statement would have left, and a differential test
holds the two equal. A path not found that way (a class with ways of its own, a compiled module,
the model itself, a name not bound) goes the direct run's general way, from the start: nothing has happened yet."""
from __future__ import annotations

from functools import partial

from torch import Tensor

from ...errors import hints
from .elements import walk
from .forward import HOOKABLE, never_ran
from .scheduler import AFTER_FORWARD, BEFORE_MODEL, FORWARD


class OneSave:
    """`_forward_one`: the forward of a one-save cell."""
    __slots__ = ()

    def _forward_one(self, one: tuple, call_args: tuple, call_kwargs: dict) -> bool:
        """Run the model for the cell `one` describes; False, having done nothing, where the general way must."""
        module = walk(self.ns, one[1], one[2])
        if (module is None or module is self.model or not isinstance(module, HOOKABLE)
                or type(module).__name__ == "OptimizedModule"):
            return False
        key = (id(module), "output")
        self.unstarted.clear()                          # the statement starts, and waits for its event
        self.timeline.append((0, None, BEFORE_MODEL))
        self.requested.add(0)
        kept: dict = {}                                 # the value of the module's first call, once it has run
        self.hooks.forward_hook(key, module, partial(self._kept, kept, key))
        self.model_running, self.phase = True, FORWARD
        try:
            try:
                self.model(*call_args, **call_kwargs)
            except Exception:
                if kept:        # the statement had its value inside the hook: it is saved before the error goes on
                    self._saved_one(one, kept[key])
                raise
        except RuntimeError as error:
            hints.note_float_ids(error, call_args, call_kwargs)
            raise
        if kept:
            self._saved_one(one, kept[key])
        self.model_running, self.done, self.phase = False, True, AFTER_FORWARD
        if not kept:            # still waiting when the cell ends: the event never came
            raise never_ran(self.uses[0], module, self.model, late=False)
        return True

    def _kept(self, kept: dict, key, module, args, value) -> None:
        """The module's output hook: the first value for the read, the last for the sidebar's shape."""
        if key not in kept:
            kept[key] = value
        self.values[key] = value

    def _saved_one(self, one: tuple, value) -> None:
        """What the statement does with its value: saved, then bound (the rewritten `NAME = save(...)`)."""
        self.timeline.append((0, 0, self.phase))
        if type(value) is not Tensor:
            self._note_type(0, self.uses[0], value)
        self.by_id[id(value)] = (one[3], value, one[4])
        self.ns[one[0]] = value
        self.finished.add(0)
