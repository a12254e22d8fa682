"""The direct run: the common cell, run by one object instead of the runtime's six parts.

Most cells only read module outputs and their gradients, edit or replace them, run backward passes and save
(`Program.direct`: no invoke, input event, cache, stop, site or skip, and no `with` block around a read). For
those, the general runtime's parts (runtime.py) are machinery the cell never uses, and each costs microseconds
between two forward passes. A DirectRun is the run core itself (scheduler.py: the same trampoline, task type, start
and delivery) with the handlers of those events written into it: it hooks exactly the events the statements wait
for, the core resumes each when its event fires, and everything is given back in one `try/finally`. It runs the fast
statement kinds the compiler picks (a loop of on-event functions, hookloops.py; a deferred statement, the quiet
replay below; the one-read cell, directone.py); a differential test holds it equal to the general runtime. What only
a failure needs (messages, hints, the graph) is shared code, and so are gradients: the run is the core that the
runtime's GradientEvents deliver to.
"""
from __future__ import annotations

from threading import get_ident

from torch import Tensor, is_grad_enabled, set_grad_enabled

from ...errors import hints
from ..compile.program import RUNTIME_NAME, Backward, GradRead, GradWrite, Read, Write
from .cellstate import CellState
from .claims import _local, _tracing, claim, release
from .directevents import DirectEvents
from .directone import OneSave
from .gradients import GradientEvents
from .hookloops import HookLoops
from .hookset import HookSet
from .result import Later, Result, run_result
from .runtime import failed_cell, run_graph
from .scheduler import AFTER_FORWARD, FORWARD, Scheduler


class DirectRun(Scheduler, OneSave, DirectEvents, HookLoops):
    """One run of one direct cell: create, `run_trace(args, kwargs)`, discard (as a Runtime). `state` is the
    CellState: the snapshot of grad mode, flags and names that `_exit` gives back."""
    # What compiled statements ask of `__nbgrad__` (compile/rewrite.py), as of the Runtime
    Read, Write, GradRead, GradWrite, Backward = Read, Write, GradRead, GradWrite, Backward
    new = tuple.__new__
    stepping = False                 # never one step of a generation
    rows = None                      # never invokes
    recorders = ()                   # never a cache
    # Slots, not an instance dict: a run's state is read and written at every step of the cell, run cold between
    # two forward passes, and a slot is read in place where a dict of some 25 keys, written in an order that depends
    # on the cell, is a lookup each time (bench/instructions.py, (c): 33 k instructions a cell less)
    __slots__ = ("model", "no_grad", "uses", "hooks", "values", "by_id", "requested", "gradients", "shapes", "live",
                 "state", "model_running", "done", "_exited", "thread_runtimes", "late_hooks", "tuple_reads",
                 "other_reads", "last_replacement", "logged", "returned", "held", "covered", "__weakref__")
    hook_loops = True                # a loop of on-event functions starts as one (hookloops.py)

    def __init__(self, program, namespace: dict, model, no_grad: bool = False):
        Scheduler.__init__(self, program, namespace)
        self.model, self.no_grad = model, no_grad
        self.uses = program.uses
        self.hooks = HookSet()
        self.values: dict = {}           # event key (id(module), "output") -> value of its latest firing
        self.by_id: dict = {}            # what the cell saved: id -> (label, value, line)
        self.requested: set = set()      # use ids a statement has waited on
        self.live = None                 # the event whose statements run now
        self.model_running = self.done = self._exited = False      # done: the model's forward call has returned
        self.state = None                # the CellState, once taken
        self.thread_runtimes = None      # the entering thread's runtimes list, once the run's snapshot is whole
        # For hints and messages, made when first needed: hooks first asked for while the model was already running;
        # reads that returned a tuple or another non-tensor (as ForwardEvents')
        self.late_hooks = self.tuple_reads = self.other_reads = self.last_replacement = None
        self.logged = None               # a quiet cell's events, key -> value in the order they came, until replayed
        self.returned = None             # the key of the model's own output, when answered from what its call returns
        self.held = None                 # use id -> where its loop's `PATH[i]` finds blocks (elements.py), or False
        self.covered = frozenset()       # the PATHs of loops whose blocks are hooked by their Steps (hookloops.py)
        self.gradients = None            # GradientEvents, when the cell reads a `.grad` or starts a backward pass
        self.shapes = None               # (id(module), "grad") -> shape of the gradient into its output, with gradients
        self.pass_state = ()             # per backward pass: "pending" | "running" | "done" (the GradientEvents' list)
        if program.has_gradients:
            self.shapes = {}
            gradients = self.gradients = GradientEvents(self)
            self.pass_state = gradients.pass_state
            self.handlers = {Read: self._read, Write: self._write, GradRead: gradients.read,
                             GradWrite: gradients.write, Backward: gradients.backward}
        else:
            self.handlers = {Read: self._read, Write: self._write}

    # What shared code reads of a runtime's parts (hints, Cache._filling, GradientEvents): here they are one object
    forward = saved = scheduler = property(lambda self: self)

    def save(self, value, line=None, label=None):
        """`x.save()` in the cell: keep x after it."""
        self.by_id[id(value)] = (label or f"line {line}", value, line or 0)
        return value

    # --- the run (Runtime.run_trace and _run) ---------------------------------------------------

    def run_trace(self, call_args: tuple, call_kwargs: dict) -> Result:
        __tracebackhide__ = True
        try:
            try:
                # Entering the run, written out here (a call less, cold): claim the model, snapshot what `_exit`
                # gives back, and only then put the run in the thread's list and the namespace
                model, ns = self.model, self.ns
                if _tracing.setdefault(id(model), me := get_ident()) != me:      # claims.claim, written out
                    claim(model)
                runtimes = _local.runtimes
                self.state = CellState(self.program, ns, model, runtimes)
                self.thread_runtimes = runtimes      # set once the snapshot is whole: `_exit` gives it back then
                runtimes.append(self)
                ns[RUNTIME_NAME] = self
                if "__builtins__" not in ns:
                    ns["__builtins__"] = __builtins__
                if self.no_grad and self.state.grad_mode:     # given back by _exit (restore_grad_state)
                    set_grad_enabled(False)
                one = self.program.one_save     # the cell `NAME = PATH.output.save()`, answered by its hook
                if one is None or not self._forward_one(one, call_args, call_kwargs):
                    self._forward(call_args, call_kwargs)
                if self.parked:
                    raise self._never_came()
                return self._result()
            except BaseException as error:
                raise self._for_the_cell(error)
            finally:
                self._exit()
        finally:
            if not self._exited:     # again where an interrupt cut the first short (each step is idempotent)
                self._exit()

    def _forward(self, call_args: tuple, call_kwargs: dict) -> None:
        if self.program.quiet:
            self.logged = {}
        self.start_ready()
        plain = self.program.plain_target_uses
        if plain is None or not plain <= self.requested:
            self._hook_targets()
        self.model_running, self.phase = True, FORWARD
        try:
            try:
                output = self.model(*call_args, **call_kwargs)
            except Exception:
                if self.logged:      # what a quiet cell's statements did inside the hooks before the model failed
                    self._replay()
                raise
            if self.logged is not None:
                self._replay()
            if self.returned is not None:      # the last event of the forward, after those a quiet cell logged
                self._on_output(self.returned, None, None, output)
        except RuntimeError as error:
            hints.note_float_ids(error, call_args, call_kwargs)
            raise
        self.model_running, self.done, self.phase = False, True, AFTER_FORWARD
        if self.unstarted:
            self.start_ready()

    def _exit(self) -> None:
        """Give everything back: hooks first (nothing of ours may fire again), then the rest."""
        if self._exited:
            return
        self.hooks.remove_all()
        if self.tasks or self.parked:
            self.close()
        if self.logged:
            self.logged.clear()
        state = self.state
        if self.thread_runtimes is not None:
            if state.columns is not None or is_grad_enabled() != state.grad_mode:
                state.restore_grad_state()
            state.restore_namespace(self.by_id)
        release(self, self.thread_runtimes if self.thread_runtimes is not None else _local.runtimes)
        self.values.clear()
        gradients = self.gradients
        if gradients is not None:
            gradients.close()
        self._exited = True
        self.handlers = None             # they are the run's bound methods: no cycle left, as the Runtime's

    def _result(self) -> Result:
        shapes = {}            # of what each hooked event returned last (after the cell's edits), for the sidebar
        for key, value in self.values.items():
            if isinstance(value, Tensor):
                shapes[key] = tuple(value.shape)
        if self.shapes:
            shapes.update(self.shapes)
        return run_result(self.by_id, self.program.bound_names, self.ns,
                          Later((run_graph, self.program, self.timeline, self.failed)), shapes,
                          self.gradients.sources if self.gradients is not None else None)

    def _for_the_cell(self, error: BaseException) -> BaseException:
        return failed_cell(self, error)

    # --- gradients: the core's delivery, with the common case written out ---------------------------------

    def deliver(self, key) -> None:
        """A gradient has arrived (GradientEvents._on_grad): answer what waits for it. The module event being
        answered when the pass began (the model's output, read by the statement that started it) stays live."""
        waiting = self.parked.get(key)
        if not waiting:
            return
        task, request = waiting[0]
        if len(waiting) > 1 or type(request) is not GradRead or self.uses[request.use].write:
            Scheduler.deliver(self, key)
            return
        del self.parked[key]
        # One read of the gradient waits, the common case: the core's delivery and GradientEvents.read written out,
        # which answer a read (not an edit) of a gradient that has come with the gradient. Five functions of three
        # modules less, run cold inside the backward pass (bench/phases.py, the gradient scenario)
        outer, self.cause = self.cause, request.use
        try:
            task.cause = request.use
            self.timeline.append((task.index, request.use, self.phase))
            self._advance(task, self.gradients.grads[key[1:]])
        finally:
            self.cause = outer
