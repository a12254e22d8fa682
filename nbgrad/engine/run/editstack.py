"""The steps of a model's persistent edits (see edits.py): an EditRun per edit and call, an EditStack per model
that starts, finishes and arms them from its two hooks on the model."""
from __future__ import annotations

import sys
import weakref

from torch import nn

from ..compile.program import RUNTIME_NAME, Read, Write
from .cellstate import CellState
from .claims import active_runtime
from ...errors import NbgradError, hints
from .forward import ForwardEvents
from .runtime import Runtime

# model -> a weak reference to its EditStack: the stack lives as long as its hooks on the model, so a model whose
# edits were never removed still goes when the notebook lets go of it (the stack holds the model)
stacks: "weakref.WeakKeyDictionary[nn.Module, weakref.ref]" = weakref.WeakKeyDictionary()


def stack_on(model: nn.Module):
    """The EditStack of `model`, or None when it has no edit."""
    found = stacks.get(model)
    return found() if found is not None else None


def cell_statement_running() -> bool:
    """Is a statement of a cell running now in this thread? Module calls it makes are plain calls (a logit lens),
    not the model's: no edit applies to them, as no edit of the cell does."""
    cell = active_runtime()
    if cell is None:
        return False
    scheduler = getattr(cell, "scheduler", None)      # a Runtime counts in its scheduler, a direct run in itself
    return (scheduler.in_statement if scheduler is not None else getattr(cell, "in_statement", 0)) > 0


def _of_the_edit(error: BaseException, label: str) -> BaseException:
    """An error an edit's step raised at the end of a call (a statement still waiting), saying whose it is."""
    if isinstance(error, NbgradError):
        found = type(error)(f"{error.detail} (in {label}; `.remove()` takes it off)", error.line)
        found.__cause__, found.__suppress_context__ = error.__cause__, True
        return found
    error.add_note(f"nbgrad: raised by {label}; `.remove()` takes it off")
    return error


class _FirstEvents(ForwardEvents):
    """An edit's forward events: every hook goes first on its module; a call a cell's statement makes passes."""

    def hook(self, module, kind, prepend=False, for_statement=True):
        return super().hook(module, kind, True, for_statement)

    def _on_event(self, key, module, args, value):
        if cell_statement_running():
            return None
        return super()._on_event(key, module, args, value)


class EditRun(Runtime):
    """One call of the model under one edit: `arm()` before it, `begin()` as it starts, then `finish_step()`
    and `close()`. It takes no claim on the model and stays off the thread's list of runs, so that a cell
    running while the model is called (a trace, a generation) is still the run that `nbgrad.save` finds."""

    def __init__(self, edit):
        super().__init__(edit.program, edit.namespace, model=edit.model)
        self.forward = _FirstEvents(self)
        self.scheduler.handlers = {Read: self.forward.read, Write: self.forward.write}
        self.stepping = True
        self.label = edit.label

    def arm(self) -> None:
        self.scheduler.in_statement = 1        # until begin(): every event passes, as a cell's own calls do
        self.forward.hook_targets(self.program.forward_targets, self.ns)

    def begin(self) -> None:
        self._enter()
        self.scheduler.in_statement = 0
        self.start_step()

    def _enter(self) -> None:
        self.state = CellState(self.program, self.ns, None, [])
        self.ns[RUNTIME_NAME] = self
        self.ns.setdefault("__builtins__", __builtins__)

    def hook_count(self) -> int:
        return len(self.hooks)


class EditStack:
    """The edits of one model, in the order they apply, and the two hooks on the model that start and finish
    their steps at each call."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.edits: list = []
        self.runs: list = []             # an EditRun per edit, in the edits' order: armed, or running
        self.running = False             # between a call's start and its return
        self.call_frame = None           # the frame of the call running now (to tell a nested call from a stale one)
        self.starts: list = []           # the stack's own handles on the model: its pre-hook (one, but while
        self.ends = None                 # a new one replaces it), and its hook on the model's return

    def add(self, edit) -> None:
        self.edits.append(edit)
        edit.active = True
        try:
            self._arm()
        except BaseException:
            self.remove(edit)
            raise
        if self.ends is None:     # always_call: a forward that raises still finishes the steps
            self.ends = self.model.register_forward_hook(self._on_return, always_call=True)

    def remove(self, edit) -> None:
        """Take one edit off; the last one takes the stack's own hooks with it. Safe at any point of a call."""
        try:
            self._close_runs()
        finally:
            if edit in self.edits:
                self.edits.remove(edit)
            edit.active = False
            if self.edits:
                self._arm()
            else:
                self._take_off()

    def hook_count(self) -> int:
        return sum(run.hook_count() for run in self.runs) + len(self.starts) + (self.ends is not None)

    # --- steps ----------------------------------------------------------------------------------

    def _arm(self) -> None:
        """Close the runs there are, then a fresh run per edit, hooked; the last armed goes first on a module, so
        arm the last edit first. Then the stack's pre-hook goes in front of them all (an edit of the model's own
        input waits for it), registered before the old one goes: the model is never without one."""
        self._close_runs()
        runs = []
        for edit in reversed(self.edits):
            run = EditRun(edit)
            runs.insert(0, run)
            self.runs = runs               # each one in the list before it hooks: `_close_runs` finds it
            run.arm()
        self.starts.append(self.model.register_forward_pre_hook(self._on_call, prepend=True))
        while len(self.starts) > 1:
            self.starts[0].remove()        # removed, then dropped: an interrupt between leaves it to remove again
            del self.starts[0]

    def _on_call(self, module, args):
        if self.running and self._inside_call() or cell_statement_running():
            return None                  # the model called by a cell's statement (while it runs, or after)
        if self.running or not self._armed():
            self._arm()                  # a call or an arming cut short by an interrupt: closed and armed first
        self.running, self.call_frame = True, sys._getframe(1)
        for run in self.runs:
            run.begin()
        return None

    def _on_return(self, module, args, output):
        if not self.running or (self.call_frame is not None and sys._getframe(1) is not self.call_frame
                                and self._inside_call()):
            return None
        failed = sys.exc_info()[1]      # called by torch for a forward that raised
        for run in self.runs if failed is not None else ():
            hints.note_edit(failed, run.label, run.forward)
        if failed is not None and any((id(self.model), "output") in run.hooks for run in self.runs):
            return None     # torch is walking the model's own hooks now: the next call or remove() closes the steps
        error = None
        try:
            for run in self.runs:
                if failed is None and error is None:
                    try:
                        run.finish_step()
                    except Exception as raised:
                        error = _of_the_edit(run.close(raised), run.label)
                run.close()
        finally:
            self._arm()
        if error is not None:
            raise error
        return None

    def _armed(self) -> bool:
        """Is every edit's run hooked and waiting for a call (not begun, not closed)?"""
        return len(self.runs) == len(self.edits) and all(run.state is None and not run._exited for run in self.runs)

    def _inside_call(self) -> bool:
        """Is the call that started the running steps still on this thread's stack?"""
        frame = sys._getframe(2)
        while frame is not None:
            if frame is self.call_frame:
                return True
            frame = frame.f_back
        return False

    def _close_runs(self) -> None:
        runs = self.runs
        try:
            for run in runs:
                run.close()
        finally:
            for run in runs:         # again where an interrupt cut the first pass short: closing is idempotent
                run.close()
            self.runs, self.running, self.call_frame = [], False, None

    def _take_off(self) -> None:
        for handle in [*self.starts, self.ends]:
            if handle is not None:
                handle.remove()
        self.starts, self.ends = [], None
        if stack_on(self.model) is self:
            del stacks[self.model]
