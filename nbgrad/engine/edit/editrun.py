"""One call of a model under one persistent edit (see edits.py): an EditRun, the Runtime of that call, whose events
go first on each module and whose gradients are those of the backward pass that reaches the call's tensors."""
from __future__ import annotations

import weakref
from functools import partial

import torch

from ..compile.program import RUNTIME_NAME, GradRead, GradWrite
from ..run.cellstate import CellState
from ..run.claims import active_runtime
from ...errors import NbgradError
from ..run.forward import ForwardEvents
from ..run.gradients import GradientEvents, register_grad_hook
from ..run.missing import never_came
from ..run.runtime import Runtime
from ..run.skips import _gates as skip_gates


def cell_statement_running() -> bool:
    """Is a statement of a cell running now in this thread? Module calls it makes are plain calls (a logit lens),
    not the model's: no edit applies to them, as no edit of the cell does."""
    cell = active_runtime()
    if cell is None:
        return False
    return cell.in_statement > 0


def of_the_edit(error: BaseException, label: str) -> BaseException:
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


NO_GRAPH = ("no graph",)     # where a `.grad` of a tensor with no autograd graph waits: nothing ever comes


class _CallGradients(GradientEvents):
    """The gradients of one call under an edit: they come in whatever backward pass reaches the call's tensors,
    once. A second pass through the same call (`retain_graph=True`) would find the statement already run."""

    def _on_grad(self, tensor_id, grad):
        key = (tensor_id, 0)
        if key in self.grads and not any(k[1] == tensor_id for k in self.scheduler.parked if k[0] == "grad"):
            raise NbgradError(f"a second backward pass reached a gradient that {self.runtime.label} already edited "
                              f"in this call of the model: an edit's gradient statements run once per call, in the "
                              f"first backward pass through it. Call the model again for each backward pass")
        return super()._on_grad(tensor_id, grad)


class EditRun(Runtime):
    """One call of the model under one edit: `arm()` before it, `begin()` as it starts, then `finish_step()`
    and `close()`. It takes no claim on the model and stays off the thread's list of runs, so that a cell
    running while the model is called (a trace, a generation) is still the run that `nbgrad.save` finds.
    An edit with `.grad` statements is compiled as a backward cell (every `.grad` is of one pass): its pass is
    the backward pass that reaches the call's tensors after the call, so a run whose statements wait for
    gradients outlives the call (`awaits_gradients`) until they come or the model is called again."""

    forward_events, gradient_events = _FirstEvents, _CallGradients

    def __init__(self, edit):
        self.label = edit.label
        self.edit_ref = weakref.ref(edit)
        super().__init__(edit.program, edit.namespace, model=edit.model)
        self.told_calls = edit.__dict__.setdefault("told_calls", set())     # a hint (run/calls.py) once an install
        if self._gradients is not None:
            self._grad_handlers(self._gradients)
        self.stepping = True
        self.armed = False

    def _gradient_events(self) -> GradientEvents:
        return self._grad_handlers(super()._gradient_events())

    def _grad_handlers(self, gradients) -> GradientEvents:
        self.handlers.update({GradRead: partial(self._grad_request, gradients.read),
                              GradWrite: partial(self._grad_request, gradients.write)})
        return gradients

    def _grad_request(self, handler, task, request):
        """A `.grad` of a tensor this call built no autograd graph for (generation, `torch.no_grad()`): no
        gradient will come, so there is none to edit; the statement waits for nothing and closes with the call."""
        tensor = request.tensor
        if isinstance(tensor, torch.Tensor) and not tensor.requires_grad:
            return self.park(NO_GRAPH, task, request)
        return handler(task, request)

    def arm(self) -> None:
        self.in_statement = 1        # until begin(): every event passes, as a cell's own calls do
        self.ns[RUNTIME_NAME] = self           # `M.source.SITE` and `M.skip` targets open through it
        self.forward.hook_targets(self.program.forward_targets)
        self.armed = True          # last: a run an interrupt cut short while arming is armed again

    def begin(self) -> None:
        self._enter()
        self.in_statement = 0
        if self.program.mode == "backward":     # its one pass: whichever reaches the call's tensors
            self.gradients.pass_state[0] = "running"
            self.gradients.running.append(0)
        self.start_step()

    def finish_step(self) -> None:
        """The call has returned: a statement still waiting for a module's event waits for one that never came
        (said now); those waiting for a gradient wait for the backward pass."""
        self._forward_done()
        self._note_skips()
        waiting = [pair for key, pairs in self.parked.items() if key[0] != "grad" and key != NO_GRAPH
                   for pair in pairs]
        if waiting:
            raise never_came(self.forward, *min(waiting, key=lambda pair: pair[0].node.spec.index))

    def _note_skips(self) -> None:
        """The modules this call skipped, for the sidebar: a skip in a loop or under a condition names its module
        only as the call runs."""
        edit = self.edit_ref()
        if edit is not None:
            edit.skipped_at_call = [module for module, gate in list(skip_gates.items())
                                    if gate.skipped and (id(gate), "output") in self.hooks]

    def awaits_gradients(self) -> bool:
        return any(key[0] == "grad" for key in self.parked)

    def close_awaiting(self) -> None:
        """Close a run whose gradients did not come before the next call of the model. Each tensor still waited
        on gets a hook that holds nothing of the run: should its gradient come later, the edit says it could not
        edit it rather than let it pass unedited."""
        try:
            edit_ref, label = self.edit_ref, self.label
            for key, pairs in list(self.parked.items()):
                tensor = self.gradients.hooked.get(key[1], (None,))[0] if key[0] == "grad" else None
                if tensor is not None:
                    use = self.program.uses[pairs[0][1].use]
                    register_grad_hook(tensor, partial(_late_gradient, edit_ref, label, use.describe(), use.line))
            if self.state is not None:
                self.state.grad_mode = torch.is_grad_enabled()     # the call now running keeps its own grad mode
        finally:
            self.close()

    def _enter(self) -> None:
        self.state = CellState(self.program, self.ns, None, [])
        self.ns[RUNTIME_NAME] = self
        self.ns.setdefault("__builtins__", __builtins__)

    def hook_count(self) -> int:
        """The hooks this run holds on the model's modules (a skip's gate, a site and a tensor are not modules)."""
        modules = {id(module) for module in self.model.modules()}
        return sum(1 for key in self.hooks if type(key) is tuple and key[0] in modules)


def _late_gradient(edit_ref, label: str, what: str, line: int, grad):
    edit = edit_ref()
    if edit is not None and edit.active:
        raise NbgradError(f"{what}: this gradient is of a call of the model made before its latest call, and "
                          f"{label} edits the gradients of a call only until the model is called again. Run each "
                          f"call's backward pass before the next call (or sum their losses into one call's)", line)
    return None
