"""The steps of a model's persistent edits (see edits.py): an EditRun per edit and call (editrun.py), an EditStack per
model that starts, finishes and arms them from its two hooks on the model."""
from __future__ import annotations

import sys
import weakref

import torch
from torch import nn

from ...errors import NbgradError, hints
from .editrun import EditRun, cell_statement_running, of_the_edit

# model -> a weak reference to its EditStack: the stack lives as long as its hooks on the model, so a model whose
# edits were never removed still goes when the notebook lets go of it (the stack holds the model)
stacks: "weakref.WeakKeyDictionary[nn.Module, weakref.ref]" = weakref.WeakKeyDictionary()


def stack_on(model: nn.Module):
    """The EditStack of `model`, or None when it has no edit."""
    found = stacks.get(model)
    return found() if found is not None else None


def compiled_call_error(label: str) -> "NbgradError":
    return NbgradError(f"{label} is on a model that torch.compile'd code calls: compiled code does not run the hooks "
                       f"an edit lives in. Call the model itself (not compiled) while the edit is on, or `.remove()` "
                       f"the edit and compile again")


class EditStack:
    """The edits of one model, in the order they apply, and the two hooks on the model that start and finish
    their steps at each call."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.edits: list = []
        self.runs: list = []             # an EditRun per edit, in the edits' order: armed, or running
        self.awaiting: list = []         # runs of the latest call whose statements wait for its backward pass
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
        """Take one edit off; the last one takes the stack's own hooks with it. Safe at any point of a call; one
        cut short by an interrupt is finished by a second one (Edit.remove)."""
        try:
            self._close_runs(self.awaiting)
            self._close_runs()
        finally:
            edit.active = False
            if edit in self.edits:
                self.edits.remove(edit)
            if self.edits:
                self._arm()
            else:
                self._take_off()

    def hook_count(self) -> int:
        return (sum(run.hook_count() for run in self.runs + self.awaiting) + len(self.starts)
                + (self.ends is not None))

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
        if torch.compiler.is_compiling():
            raise compiled_call_error(self.edits[0].label)
        if self.running and self._inside_call() or cell_statement_running():
            return None                  # the model called by a cell's statement (while it runs, or after)
        if self.awaiting:
            self._close_runs(self.awaiting, late=True)
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
                        error = of_the_edit(run.close(raised), run.label)
                if failed is None and error is None and run.awaits_gradients():
                    self.awaiting.append(run)
                else:
                    run.close()
            self.runs = [run for run in self.runs if run not in self.awaiting]
        finally:
            self._arm()
        if error is not None:
            raise error
        return None

    def _armed(self) -> bool:
        """Is every edit's run hooked and waiting for a call (not begun, not closed)?"""
        return len(self.runs) == len(self.edits) and all(run.armed and run.state is None and not run._exited
                                                         for run in self.runs)

    def _inside_call(self) -> bool:
        """Is the call that started the running steps still on this thread's stack?"""
        frame = sys._getframe(2)
        while frame is not None:
            if frame is self.call_frame:
                return True
            frame = frame.f_back
        return False

    def _close_runs(self, runs=None, late: bool = False) -> None:
        """Close `runs` (the armed or running ones by default; `late`: awaiting runs a new call ends)."""
        awaiting = runs is not None
        runs = self.runs if runs is None else runs
        try:
            for run in runs:
                run.close_awaiting() if late else run.close()
        finally:
            for run in runs:         # again where an interrupt cut the first pass short: closing is idempotent
                run.close()
            if awaiting:
                self.awaiting = []
            else:
                self.runs, self.running, self.call_frame = [], False, None

    def _take_off(self) -> None:
        for run in self.runs + self.awaiting:      # (closed by remove() unless an interrupt cut that short)
            run.close()
        for handle in [*self.starts, self.ends]:
            if handle is not None:
                handle.remove()
        self.starts, self.ends = [], None
        if stack_on(self.model) is self:
            del stacks[self.model]
