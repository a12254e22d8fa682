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

from threading import get_ident

import torch
from torch import nn

from ...errors import for_the_cell, hints, located
from .claims import _local, _tracing, active_runtime, claim, release  # noqa: F401  (tests read _local, _tracing)
from .cellstate import CellState
from .forward import ForwardEvents
from ..compile.graph import HookGraph, Run
from .gradients import GradientEvents
from .hookset import HookSet
from ..compile.program import RUNTIME_NAME, Backward, GradRead, GradWrite, Program, Read, Write
from .result import Later, Result, SavedValues, grad_pairs, saved_by_name
from .scheduler import AFTER_FORWARD, FORWARD, Scheduler
from .caching import check_cache_call, start_cache
from .stopping import StopRun, request_stop
from .sites import source_of
from .skips import skip_of


class Runtime:
    """One run of one cell. Create, call `run_trace` or `run_backward`, discard. Creating one changes
    nothing outside it: everything the run touches is taken and given back inside `_run`."""
    # The request types compiled code builds, as `__nbgrad__.new(__nbgrad__.Read, (...))` (compile/rewrite.py)
    Read, Write, GradRead, GradWrite, Backward = Read, Write, GradRead, GradWrite, Backward
    new = tuple.__new__
    thread_runtimes = None                   # the runtimes list of the thread that entered this run
    source_of = staticmethod(source_of)      # `M.source` in the cell (compile/siteaccess.py)
    skip_of = staticmethod(skip_of)          # `M.skip(v)` in the cell

    def __init__(self, program: Program, namespace: dict, model: nn.Module | None = None,
                 no_grad: bool = False, rows=None):
        self.program = program
        self.rows = rows                 # InvokeRows when the cell has `with invoke(...)` blocks
        self.ns = namespace
        self.model = model
        self.no_grad = no_grad
        self.shapes: dict = {}           # event key -> shape, for the sidebar
        self.hooks = HookSet()
        self.forward = ForwardEvents(self)
        self.scheduler = Scheduler(program, namespace, [])
        self.saved = SavedValues(self.scheduler)
        self.save = self.saved.save      # `x.save()` in the cell: one call, not two
        self.scheduler.handlers = {Read: self.forward.read, Write: self.forward.write}
        if program.has_gradients:
            self._gradient_events()
        self.state = None                # CellState, once the run has taken its snapshot
        self.recorders: list = []        # the cell's cache(..., grads=True) recorders, hooked at each pass
        self.stopped_at = None           # the line of the `stop()` that ended the model run
        self.stepping = False            # one step of a generation (see open_step)
        self._exited = False

    def _gradient_events(self) -> GradientEvents:
        """`self.gradients`: made with the run when the cell reads a `.grad` or starts a backward pass, else on
        first use (`cache(..., grads=True)`, `%%backward`), so that a forward-only cell never pays for it."""
        gradients = self.gradients = GradientEvents(self)
        self.scheduler.pass_state = gradients.pass_state
        self.scheduler.handlers.update({GradRead: gradients.read, GradWrite: gradients.write,
                                        Backward: gradients.backward})
        return gradients

    def __getattr__(self, name):         # only for a name not set: `gradients` before its first use
        if name != "gradients" or self.__dict__.get("_exited", True):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self._gradient_events()

    def cache(self, line, *args, **kwargs):
        """`cache(...)` in the cell (see caching.py)."""
        check_cache_call(args, kwargs, line)
        return start_cache(self, line, *args, **kwargs)

    def stop(self, line, *args, **kwargs):
        """`stop()` in the cell (see stopping.py)."""
        request_stop(self, line, *args, **kwargs)

    # --- entry points ---------------------------------------------------------------------------

    def run_trace(self, call_args: tuple, call_kwargs: dict) -> Result:
        def body():
            forward, scheduler, plain = self.forward, self.scheduler, self.program.plain_target_uses
            scheduler.start_ready()
            if plain is None or not plain <= forward.requested:
                forward.hook_targets(self.program.forward_targets, self.ns)
            forward.model_running, scheduler.phase = True, FORWARD
            try:
                if self.stopped_at is None:      # a stop() before the model ran: it does not run at all
                    self.model(*call_args, **call_kwargs)
            except StopRun:
                pass
            except RuntimeError as error:
                hints.note_float_ids(error, call_args, call_kwargs)
                raise
            forward.model_running, forward.done = False, True                          # as in _forward_done
            scheduler.phase, scheduler.forward_over = AFTER_FORWARD, True
            if scheduler.unstarted:
                scheduler.start_ready()
        return self._run(body)

    def run_backward(self, loss, grad_output=None, retain_graph=False, create_graph=False) -> Result:
        def body():
            # its statements start with the pass
            self.forward.done, self.scheduler.phase, self.scheduler.forward_over = True, AFTER_FORWARD, True
            kwargs = {"retain_graph": retain_graph or None, "create_graph": create_graph}
            if grad_output is not None:
                kwargs["gradient"] = grad_output
            self.gradients.backward(None, Backward(loss, 0, [], kwargs, True))
        return self._run(body)

    # --- one step of a run whose model call is made elsewhere (each forward call of `generate`) -----

    def open_step(self) -> None:
        """Before the caller's model call: take the snapshot and hook what the graph names. Then
        `start_step()` as the call begins, `finish_step()` after it, and `close()` in a `finally`.
        Grad mode is the caller's (generation runs under `torch.no_grad()`)."""
        self._enter()
        self.stepping = True
        self.forward.hook_targets(self.program.forward_targets, self.ns)

    def start_step(self) -> None:
        self.scheduler.start_ready()
        if self.program.late_targets:      # they read names the step's own statements bind (Target.needs)
            self.forward.hook_targets(self.program.late_targets, self.ns)
        self.forward.model_running, self.scheduler.phase = True, FORWARD

    def finish_step(self) -> Result:
        self._forward_done()
        if self.scheduler.parked:
            self._check_finished()
        return self._result()

    def close(self, error: BaseException | None = None) -> BaseException | None:
        """Give everything back (idempotent, from two nested `finally` blocks as in `_run`); with `error`,
        return it as the cell shows it, hints added."""
        try:
            try:
                if error is not None:
                    error = self._for_the_cell(error)
            finally:
                self._exit()
        finally:
            self._exit()
        return error

    def _run(self, body) -> Result:
        __tracebackhide__ = True
        try:
            try:
                self._enter()
                if self.no_grad and self.state.grad_mode:     # given back by _exit (restore_grad_state)
                    torch.set_grad_enabled(False)
                body()
                if self.scheduler.parked:
                    self._check_finished()
                return self._result()
            except BaseException as error:
                raise self._for_the_cell(error)
            finally:
                self._exit()
        finally:
            if not self._exited:     # again where an interrupt cut the first short (at any line): each step is
                self._exit()         # idempotent

    def _for_the_cell(self, error: BaseException) -> BaseException:
        return failed_cell(self, error)

    def _enter(self) -> None:
        model = self.model
        if model is not None and _tracing.setdefault(id(model), me := get_ident()) != me:   # claim, written out
            claim(model)
        runtimes = self.thread_runtimes = _local.runtimes     # read once: a thread-local costs us cold
        self.state = CellState(self.program, self.ns, model, runtimes)
        runtimes.append(self)
        self.ns[RUNTIME_NAME] = self        # the state's install, written out (given back by restore_namespace)
        if "__builtins__" not in self.ns:
            self.ns["__builtins__"] = __builtins__

    def _exit(self) -> None:
        """Give everything back: hooks first (nothing of ours may fire again), then the rest."""
        if self._exited:
            return
        self.hooks.remove_all()
        scheduler, state = self.scheduler, self.state
        if scheduler.tasks or scheduler.parked or scheduler.unstarted:
            scheduler.close()
        if state is not None:
            if state.columns is not None or torch.is_grad_enabled() != state.grad_mode:
                state.restore_grad_state()
            state.restore_namespace(self.saved.by_id)
        release(self, self.thread_runtimes if self.thread_runtimes is not None else _local.runtimes)
        gradients = self.__dict__.get("gradients")      # not made here if the run never needed it
        for store in (self.forward.values, self.forward.sinks, self.forward.early_sinks, self.recorders):
            store.clear()
        if gradients is not None:
            gradients.close()
        if self.rows is not None:
            self.rows.clear()
        self._exited = True
        # No cycle left (runtime <-> its parts): the run, and what it held, go by reference counting the moment
        # the cell lets go of them, not at a garbage-collector pass.
        self.scheduler.handlers = {}
        self.forward.runtime = None

    def _forward_done(self) -> None:
        """The model's forward call has returned: start what waited for that."""
        self.forward.model_running, self.forward.done = False, True
        self.scheduler.phase, self.scheduler.forward_over = AFTER_FORWARD, True
        if self.scheduler.unstarted:
            self.scheduler.start_ready()

    def graph(self):
        """The hook graph with what happened in this run: which event woke each statement, and when."""
        return run_graph(self.program, self.scheduler.timeline, self.scheduler.failed)

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
        saved = saved_by_name(self.saved.by_id, bound, self.ns)
        invoke_of = self.saved.invoke_of
        # The picture is drawn from the timeline only when someone looks (a panel, `result.graph`): a loop of
        # traces that reads values only never pays for it. Holds the program and timeline, not the runtime.
        graph = Later((run_graph, self.program, self.scheduler.timeline, self.scheduler.failed))
        gradients = self.__dict__.get("gradients")
        sources = gradients.sources if gradients is not None else None
        return Result(saved, graph, self.shapes,
                      grad_pairs=grad_pairs(saved, sources, bound, self.ns) if sources else None,
                      saved_invokes={name: invoke_of[id(v)] for name, v in saved.items() if id(v) in invoke_of}
                      if invoke_of else None)


def failed_cell(run, error: BaseException) -> BaseException:
    """The error of a run (a Runtime or a DirectRun) as the cell shows it: the names the cell bound given back, the
    error at its line, with hints and the graph of what ran and which statement failed."""
    if run.state is not None:
        run.state.unbind()
    program, forward, core = run.program, run.forward, run.scheduler
    error = located(error, program.uses, program.filename)
    error = hints.failed_after_replacement(error, forward.last_replacement)
    hints.add_hints(error, forward)
    try:
        error.nbgrad_graph = run_graph(program, core.timeline, core.failed)
    except AttributeError:
        pass
    return for_the_cell(error)


def run_graph(program: Program, timeline: list, failed) -> HookGraph:
    """The hook graph with what happened in a run: which event woke each statement, and when."""
    uses, nodes = program.uses, program.graph.nodes
    runs = [Run(node, nodes[node].line, uses[use].describe() if use is not None else None, phase)
            for node, use, phase in timeline]
    return HookGraph(nodes, program.graph.passes, runs, failed, program.graph.caches)
