"""Run a compiled Program on a model: hooks on exactly the events the graph names, each statement resumed when what it
waits for exists, every hook removed and every flag restored in `finally`. A Runtime is the run core itself
(scheduler.py) with the run's entry points and its parts: HookSet (every handle), ForwardEvents and GradientEvents (the
homes of module and gradient events), CellState (grad mode, flags, names to give back); docs/architecture.md draws it.
`fast` lets the run use the fast statement kinds the compiler gave the cell (on-event functions and loops of them,
hookloops.py; a deferred statement, forward.py's quiet log; the one-read cell, onesave.py); `runner="general"` runs
every statement as a generator resumed by the core, which a differential test holds equal."""
from __future__ import annotations

from threading import get_ident

from torch import Tensor, is_grad_enabled, nn, set_grad_enabled

from ...errors import hints
from ..compile.program import RUNTIME_NAME, Backward, GradRead, GradWrite, Program, Read, Write
from .cellstate import CellState
from .claims import _local, _tracing, active_runtime, claim, release  # noqa: F401  (tests read _local, _tracing)
from ..checks import check_cache_call
from .caching import start_cache
from .calls import call_of
from .forward import ForwardEvents
from .gradients import GradientEvents
from .hookloops import start_loop, start_one
from .hookset import HookSet
from .missing import never_came
from .onesave import forward_one
from .outcome import failed_cell, run_graph
from ..results.result import Later, Result, run_result
from .scheduler import AFTER_FORWARD, BEFORE_MODEL, FORWARD, Scheduler
from .sites import source_of
from .skips import skip_of
from .stopping import StopRun, request_stop


class Runtime(Scheduler):
    """One run of one cell. Create, call `run_trace` or `run_backward`, discard. Creating one changes nothing outside
    it: everything the run touches is taken and given back inside `run_trace` (or by `close`, for steps)."""
    # The request types compiled code builds, as `__nbgrad__.new(__nbgrad__.Read, (...))` (compile/rewrite.py)
    Read, Write, GradRead, GradWrite, Backward = Read, Write, GradRead, GradWrite, Backward
    new = tuple.__new__
    source_of = staticmethod(source_of)      # `M.source` in the cell (compile/siteaccess.py)
    skip_of, call_of = staticmethod(skip_of), staticmethod(call_of)      # `M.skip(v)`, `M.calls[k]` (calls.py)
    _start_loop, _start_one = start_loop, start_one    # the core starts those kinds so (`hook_loops`, `one_events`)
    forward_events, gradient_events = ForwardEvents, GradientEvents      # the homes' classes (an edit's are its own)
    # Slots: a run's state is read and written at every step of the cell, run cold between two forward passes, and a
    # slot is read in place where a dict of some 25 keys is a lookup each time (bench/instructions.py)
    __slots__ = ("model", "no_grad", "rows", "hooks", "forward", "_gradients", "by_id", "invoke_of", "shapes", "state",
                 "recorders", "stopped_at", "stepping", "fast", "thread_runtimes", "_exited", "__weakref__", "__dict__")

    def __init__(self, program: Program, namespace: dict, model: nn.Module | None = None, no_grad: bool = False,
                 rows=None, fast: bool = False):
        # The core's state (scheduler.py says what each holds), then the run's
        self.program, self.ns, self.pass_state, self.unstarted = program, namespace, (), list(program.nodes)
        self.finished, self.tasks, self.parked, self.timeline, self.ahead = set(), [], {}, [], {}
        self.cause = self.current = self.failed = self.one_reads = None
        self.in_statement, self.phase, self.forward_over = 0, BEFORE_MODEL, False
        self.model, self.no_grad, self.rows = model, no_grad, rows     # rows: InvokeRows with `with invoke(...)`
        self.fast = self.hook_loops = fast and program.direct     # the fast statement kinds, where the cell has them
        self.one_events = fast and program.one_events
        self.hooks = HookSet()
        forward = self.forward = self.forward_events(self, self.fast)
        self.by_id: dict = {}            # what the cell saved: id -> (label, value, line)
        self.invoke_of: dict = {}        # id -> index of the invoke whose statement saved it
        self.shapes: dict = {}           # event key -> shape, for the sidebar, of what values do not hold
        if program.has_gradients:        # `_gradient_events`, written out
            gradients = self._gradients = self.gradient_events(self)
            self.pass_state = gradients.pass_state
            self.handlers = {Read: forward.read, Write: forward.write, GradRead: gradients.read,
                             GradWrite: gradients.write, Backward: gradients.backward}
        else:
            self._gradients, self.handlers = None, {Read: forward.read, Write: forward.write}
        self.state = None                # CellState, once the run has taken its snapshot
        self.thread_runtimes = None      # the entering thread's runtimes list, once the snapshot is whole
        self.recorders: list = []        # the cell's cache(..., grads=True) recorders, hooked at each pass
        self.stopped_at = None           # the line of the `stop()` that ended the model run
        self.stepping = self._exited = False     # stepping: one step of a generation (see open_step)

    def _gradient_events(self) -> GradientEvents:
        """The run's GradientEvents: made with the run when the cell reads a `.grad` or starts a backward pass, else
        on first use (`cache(..., grads=True)`, `%%backward`), so that a forward-only cell never pays for it."""
        gradients = self._gradients = self.gradient_events(self)
        self.pass_state = gradients.pass_state
        self.handlers.update({GradRead: gradients.read, GradWrite: gradients.write, Backward: gradients.backward})
        return gradients

    @property
    def gradients(self) -> GradientEvents:
        gradients = self._gradients
        if gradients is None and not self._exited:
            return self._gradient_events()
        return gradients

    def save(self, value, line=None, label=None):
        """`x.save()` in the cell: keep x after it."""
        self.by_id[id(value)] = (label or f"line {line}", value, line or 0)
        if self.rows is not None:
            current = self.current
            if current is not None and current.node.spec.invoke is not None:
                self.invoke_of[id(value)] = current.node.spec.invoke
        return value

    def cache(self, line, *args, **kwargs):
        """`cache(...)` in the cell (see caching.py)."""
        check_cache_call(args, kwargs, line)
        return start_cache(self, line, *args, **kwargs)

    def stop(self, line, *args, **kwargs):
        """`stop()` in the cell (see stopping.py)."""
        request_stop(self, line, *args, **kwargs)

    # --- entry points ---------------------------------------------------------------------------

    def run_trace(self, call_args: tuple, call_kwargs: dict, backward: tuple | None = None) -> Result:
        """The cell's run: the model called on `call_args`, or with `backward` (loss, options), the cell's backward
        pass (`run_backward`)."""
        __tracebackhide__ = True
        try:
            try:
                model, ns = self.model, self.ns          # `_enter`, written out (a call less, cold)
                if model is not None and _tracing.setdefault(id(model), me := get_ident()) != me:
                    claim(model)
                runtimes = _local.runtimes
                state = self.state = CellState(self.program, ns, model, runtimes)
                self.thread_runtimes = runtimes
                runtimes.append(self)
                ns[RUNTIME_NAME] = self
                if "__builtins__" not in ns:
                    ns["__builtins__"] = __builtins__
                if self.no_grad and state.grad_mode:     # given back by _exit (restore_grad_state)
                    set_grad_enabled(False)
                one = self.program.one_save if self.fast else None     # `NAME = PATH.output.save()`, by its hook
                if backward is not None:
                    self._backward(*backward)
                elif one is None or not forward_one(self, one, call_args, call_kwargs):
                    self._forward(call_args, call_kwargs)
                if self.parked:
                    self._check_finished()
                return self._result()
            except BaseException as error:
                raise failed_cell(self, error)
            finally:
                self._exit()
        finally:
            if not self._exited:     # again where an interrupt cut the first short (at any line): each step is
                self._exit()         # idempotent

    def run_backward(self, loss, grad_output=None, retain_graph=False, create_graph=False) -> Result:
        kwargs = {"retain_graph": retain_graph or None, "create_graph": create_graph}
        if grad_output is not None:
            kwargs["gradient"] = grad_output
        return self.run_trace((), {}, (loss, kwargs))

    def _forward(self, call_args: tuple, call_kwargs: dict) -> None:
        forward, plain = self.forward, self.program.plain_target_uses
        if forward.quiet:
            forward.logged = {}
        self.start_ready()
        if self.one_events and self.unstarted:      # on-event statements that wait for another: found now (start_one)
            for node in self.unstarted:
                if node.one is not None:
                    self._start_one(node, True)
        if plain is None or not plain <= forward.requested:
            forward.hook_targets(self.program.forward_targets)
        loop = forward.deferred     # an edit loop that alone waits inside the forward (its blocks, once each) logs them
        if loop and self.rows is None and self._gradients is None and not self.unstarted and len(self.hooks) == (
                loop.size + (forward.returned is not None)) and sum(map(len, self.parked.values())) == len(self.parked):
            forward.logged = {}
        forward.model_running, self.phase = True, FORWARD
        try:
            try:
                if self.stopped_at is None:      # a stop() before the model ran: it does not run at all
                    output = self.model(*call_args, **call_kwargs)
                    if forward.logged is not None:
                        (forward.deferred or forward).replay()
                    if forward.returned is not None:    # the last event of the forward, after those a quiet cell logged
                        forward._on_event(forward.returned, None, None, output)
            except StopRun:
                pass
            except Exception:
                if forward.logged:      # what a quiet cell's statements did inside the hooks before the model failed
                    (forward.deferred or forward).replay()
                raise
        except RuntimeError as error:
            hints.note_float_ids(error, call_args, call_kwargs)
            raise
        forward.model_running, forward.done, self.phase, self.forward_over = False, True, AFTER_FORWARD, True
        if self.unstarted:                 # `_forward_done`, written out
            self.start_ready()

    def _backward(self, loss, kwargs: dict) -> None:
        self.forward.done, self.phase, self.forward_over = True, AFTER_FORWARD, True     # its statements start with
        self.gradients.backward(None, Backward(loss, 0, [], kwargs, True))                # the pass

    # --- one step of a run whose model call is made elsewhere (each forward call of `generate`) -----

    def open_step(self) -> None:
        """Before the caller's model call: take the snapshot and hook what the graph names. Then `start_step()` as
        the call begins, `finish_step()` after it, and `close()` in a `finally`. Grad mode is the caller's
        (generation runs under `torch.no_grad()`)."""
        self._enter()
        self.stepping = True
        self.forward.hook_targets(self.program.forward_targets)

    def start_step(self) -> None:
        self.start_ready()
        if self.program.late_targets:      # they read names the step's own statements bind (Target.needs)
            self.forward.hook_targets(self.program.late_targets)
        self.forward.model_running, self.phase = True, FORWARD

    def finish_step(self) -> Result:
        self._forward_done()
        if self.parked:
            self._check_finished()
        return self._result()

    def close(self, error: BaseException | None = None) -> BaseException | None:
        """Give everything back (idempotent, from two nested `finally` blocks as in `run_trace`); with `error`,
        return it as the cell shows it, hints added."""
        try:
            try:
                if error is not None:
                    error = failed_cell(self, error)
            finally:
                self._exit()
        finally:
            self._exit()
        return error

    def _enter(self) -> None:
        model = self.model
        if model is not None and _tracing.setdefault(id(model), me := get_ident()) != me:   # claim, written out
            claim(model)
        runtimes = _local.runtimes     # read once: a thread-local costs us cold
        self.state = CellState(self.program, self.ns, model, runtimes)
        self.thread_runtimes = runtimes      # set once the snapshot is whole: `_exit` gives it back then
        runtimes.append(self)
        self.ns[RUNTIME_NAME] = self        # the state's install, written out (given back by restore_namespace)
        if "__builtins__" not in self.ns:
            self.ns["__builtins__"] = __builtins__

    def _exit(self) -> None:
        """Give everything back: hooks first (nothing of ours may fire again), then the rest."""
        if self._exited:
            return
        self.hooks.remove_all()
        if self.tasks or self.parked or self.unstarted:
            Scheduler.close(self)
        state, forward = self.state, self.forward
        if forward.logged:
            forward.logged.clear()
        if self.thread_runtimes is not None:
            if state.columns is not None or is_grad_enabled() != state.grad_mode:
                state.restore_grad_state()
            state.restore_namespace(self.by_id)
        release(self, self.thread_runtimes if self.thread_runtimes is not None else _local.runtimes)
        for store in (forward.values, forward.sinks, forward.early_sinks, self.recorders):
            store.clear()
        if self._gradients is not None:
            self._gradients.close()
        if self.rows is not None:
            self.rows.clear()
        self._exited = True
        # No cycle left (the run <-> its parts): what it held goes by reference counting, not at a collector's pass
        self.handlers = {}
        forward.runtime = forward.deferred = self.ahead = None

    def _forward_done(self) -> None:
        """The model's forward call has returned: start what waited for that."""
        self.forward.model_running, self.forward.done = False, True
        self.phase, self.forward_over = AFTER_FORWARD, True
        if self.unstarted:
            self.start_ready()

    # --- end of the cell ------------------------------------------------------------------------

    def _check_finished(self) -> None:
        """A statement still waiting when the cell ends waits for an event that never came: say which."""
        waiting = self.first_wait()
        if waiting is None:
            return
        task, request = waiting
        if type(request) is GradRead or type(request) is GradWrite:
            raise self.gradients.never_came(request)
        raise never_came(self.forward, task, request)

    def _result(self) -> Result:
        shapes = {}            # of what each hooked event returned last (after the cell's edits), for the sidebar
        for key, value in self.forward.values.items():
            if isinstance(value, Tensor):
                shapes[key] = tuple(value.shape)
        if self.shapes:
            shapes.update(self.shapes)
        gradients = self._gradients
        # The picture is drawn from the timeline (held, not the run) only when someone looks (a panel, `result.graph`)
        return run_result(self.by_id, self.program.bound_names, self.ns,
                          Later((run_graph, self.program, self.timeline, self.failed, self.one_reads)), shapes,
                          gradients.sources if gradients is not None else None, self.invoke_of)
