"""Run a compiled Program on a model: hooks on exactly the events the graph names, each statement
resumed when what it waits for exists, every hook removed and every flag restored in `finally`.

    Runtime ── HookSet        every handle, removed together        (hookset.py)
            ├─ Scheduler      which statement runs when             (scheduler.py)
            ├─ ForwardEvents  module outputs and inputs             (forward.py)
            ├─ GradientEvents backward passes and gradients         (gradients.py)
            ├─ SavedValues    what the cell kept, by name           (result.py)
            └─ CellState      grad mode, flags, names to give back  (cellstate.py)
"""
from __future__ import annotations

import torch
from torch import nn

from .cellstate import CellState
from .errors import for_the_cell
from .forward import ForwardEvents
from .gradients import GradientEvents
from .hookset import HookSet
from .program import Backward, GradRead, GradWrite, Program, Read, Write
from .result import Result, SavedValues, grad_pairs
from .scheduler import Scheduler

_active: list = []          # runtimes now running (nested traces are possible)


def active_runtime():
    return _active[-1] if _active else None


class Runtime:
    """One run of one cell. Create, call `run_trace` or `run_backward`, discard."""
    # The request types compiled code builds, as `__nbgrad__.Read(...)`.
    Read, Write, GradRead, GradWrite, Backward = Read, Write, GradRead, GradWrite, Backward

    def __init__(self, program: Program, namespace: dict, model: nn.Module | None = None,
                 no_grad: bool = False):
        self.program = program
        self.ns = namespace
        self.model = model
        self.no_grad = no_grad
        self.shapes: dict = {}           # event key -> shape, for the sidebar
        self.hooks = HookSet()
        self.saved = SavedValues()
        self.forward = ForwardEvents(self)
        self.gradients = GradientEvents(self)
        self.scheduler = Scheduler(program, namespace, self.gradients.pass_state)
        self.scheduler.handlers = {Read: self.forward.read, Write: self.forward.write,
                                   GradRead: self.gradients.read, GradWrite: self.gradients.write,
                                   Backward: self.gradients.backward}
        self.state = CellState(program, namespace, model)
        self.state.install(self)

    def save(self, value, line=None, label=None):
        """`x.save()` in the cell: keep x after it."""
        return self.saved.save(value, line, label)

    # --- entry points ---------------------------------------------------------------------------

    def run_trace(self, call_args: tuple, call_kwargs: dict) -> Result:
        def body():
            self.forward.hook_targets(self.program.forward_targets, self.ns)
            self.scheduler.start_ready()
            self.forward.model_running = True
            self.model(*call_args, **call_kwargs)
            self.forward.model_running = False
            self.forward.done = True
            self.scheduler.start_ready()
        return self._run(body)

    def run_backward(self, loss, grad_output=None, retain_graph=False, create_graph=False) -> Result:
        def body():
            self.forward.done = True
            kwargs = {"retain_graph": retain_graph or None, "create_graph": create_graph}
            if grad_output is not None:
                kwargs["gradient"] = grad_output
            self.gradients.backward(None, Backward(loss, 0, [], kwargs, True))
        return self._run(body)

    def _run(self, body) -> Result:
        __tracebackhide__ = True
        _active.append(self)
        try:
            with torch.set_grad_enabled(self.state.grad_mode and not self.no_grad):
                body()
                self._check_finished()
            return self._result()
        except BaseException as error:
            raise for_the_cell(error)
        finally:
            _active.remove(self)
            self.state.restore_grad_state()
            self._cleanup()

    # --- end of the cell ------------------------------------------------------------------------

    def _check_finished(self) -> None:
        """A statement still waiting when the cell ends waits for an event that never came: say which."""
        waiting = self.scheduler.first_wait()
        if waiting is None:
            return
        _, request = waiting
        if isinstance(request, (GradRead, GradWrite)):
            raise self.gradients.never_came(request)
        raise self.forward.never_came(request)

    def _result(self) -> Result:
        bound = self.program.bound_names
        saved = self.saved.by_name(bound, self.ns)
        return Result(saved=saved, graph=self.program.graph, shapes=self.shapes,
                      grad_pairs=grad_pairs(saved, self.gradients.sources, bound, self.ns))

    def _cleanup(self) -> None:
        self.hooks.remove_all()
        self.scheduler.close()
        self.state.restore_namespace(self.saved.by_id.keys())
        for store in (self.forward.values, self.gradients.grads, self.gradients.sources):
            store.clear()
