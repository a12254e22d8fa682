"""The direct run: the common cell, run by one object instead of the runtime's six parts.

Most cells only read module outputs and their gradients, edit or replace them, run backward passes and save
(`Program.direct`: no invoke, input event, cache, stop, site or skip, and no `with` block around a read). For
those, the general runtime's parts (runtime.py) are machinery the cell never uses, and each costs microseconds
between two forward passes. A DirectRun does the same with the same compiled statements: it hooks exactly the
events they wait for, resumes each when its event fires, and gives everything back in one `try/finally`. Its
semantics are the runtime's, part for part (the names below say which part each step mirrors), and a
differential test holds them equal; what only a failure needs (messages, hints, the graph) is shared code, and
so are gradients: the run is its own scheduler for the runtime's GradientEvents.
"""
from __future__ import annotations

import types
from threading import get_ident

from torch import Tensor, is_grad_enabled, set_grad_enabled

from ...errors import OrderError, diagnose, for_the_cell, hints, located
from ..compile.program import RUNTIME_NAME, Backward, GradRead, GradWrite, Read, Write
from .cellstate import CellState
from .claims import _local, _tracing, claim, release
from .directevents import DirectEvents
from .directone import OneSave, Task as _Task
from .gradients import GradientEvents
from .hookloops import HookLoops
from .hookset import HookSet
from .result import Later, Result, run_result
from .runtime import run_graph
from .scheduler import AFTER_FORWARD, BEFORE_MODEL, FORWARD, Scheduler


class DirectRun(OneSave, DirectEvents, HookLoops, CellState):
    """One run of one direct cell: create, `run_trace(args, kwargs)`, discard (as a Runtime). It is its own
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
    __slots__ = ("program", "ns", "model", "no_grad", "uses", "hooks", "values", "parked", "by_id", "timeline",
                 "unstarted", "finished", "tasks", "requested", "gradients", "shapes", "pass_state", "live", "cause",
                 "failed", "in_statement", "phase", "model_running", "done", "_exited", "thread_runtimes",
                 "late_hooks", "tuple_reads", "other_reads", "last_replacement", "logged", "returned", "held",
                 "covered", "__weakref__")

    def __init__(self, program, namespace: dict, model, no_grad: bool = False):
        self.program, self.ns, self.model, self.no_grad = program, namespace, model, no_grad
        self.uses = program.uses
        self.hooks = HookSet()
        self.values: dict = {}           # event key (id(module), "output") -> value of its latest firing
        self.parked: dict = {}           # event key -> [(task, request)] waiting for it
        self.by_id: dict = {}            # what the cell saved: id -> (label, value, line)
        self.timeline: list = []         # (node index, use id of the event that woke it or None, phase)
        self.unstarted = list(program.nodes)
        self.finished: set = set()       # indices of finished nodes
        self.tasks: list = []            # started, not finished
        self.requested: set = set()      # use ids a statement has waited on
        self.live = None                 # the event whose statements run now
        self.cause = None                # the use id of the event being delivered now
        self.failed = None               # the index of the node whose statement raised
        self.in_statement = 0            # > 0 while a statement's own code runs: its module calls are not events
        self.phase = BEFORE_MODEL
        self.model_running = self.done = self._exited = False      # done: the model's forward call has returned
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
            self.gradients = GradientEvents(self)
            self.pass_state = self.gradients.pass_state

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
                CellState.__init__(self, self.program, ns, model, runtimes)
                self.thread_runtimes = runtimes      # set once the snapshot is whole: `_exit` gives it back then
                runtimes.append(self)
                ns[RUNTIME_NAME] = self
                if "__builtins__" not in ns:
                    ns["__builtins__"] = __builtins__
                if self.no_grad and self.grad_mode:     # given back by _exit (restore_grad_state)
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
        self._start_ready()
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
            self._start_ready()

    def _exit(self) -> None:
        """Give everything back: hooks first (nothing of ours may fire again), then the rest."""
        if self._exited:
            return
        self.hooks.remove_all()
        while self.tasks:
            self.tasks.pop().gen.close()
        self.parked.clear()
        if self.logged:
            self.logged.clear()
        if self.thread_runtimes is not None:
            if self.columns is not None or is_grad_enabled() != self.grad_mode:
                self.restore_grad_state()
            self.restore_namespace(self.by_id)
        release(self, self.thread_runtimes if self.thread_runtimes is not None else _local.runtimes)
        self.values.clear()
        gradients = self.gradients
        if gradients is not None:        # no cycle left (run <-> its GradientEvents): both go by reference counting
            for store in (gradients.grads, gradients.sources, gradients.hooked, gradients.taken_over):
                store.clear()
            gradients.runtime = gradients.scheduler = None
        self._exited = True

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
        if self.thread_runtimes is not None:        # the snapshot was taken
            self.unbind()
        error = located(error, self.uses, self.program.filename)
        error = hints.failed_after_replacement(error, self.last_replacement)
        hints.add_hints(error, self)
        error.nbgrad_graph = run_graph(self.program, self.timeline, self.failed)
        return for_the_cell(error)

    # --- statements (Scheduler) ------------------------------------------------------------------

    def _start_ready(self) -> None:
        """Start, in source order, every node whose dependencies have finished."""
        progressed = True
        while progressed:
            progressed = False
            for node in self.unstarted:
                spec = node.spec       # inside `with LOSS.backward():`, a statement waits for its pass to begin
                if self.finished.issuperset(spec.deps) and (spec.block is None
                                                             or self.pass_state[spec.block] != "pending"):
                    if node.loop is not None and self._start_loop(node):
                        progressed = True
                        break
                    self.unstarted.remove(node)
                    task = _Task()
                    task.index, task.cause, task.module, task.grad_mode = spec.index, self.cause, None, None
                    task.gen = types.FunctionType(node.code, self.ns)()
                    self.tasks.append(task)
                    self.timeline.append((spec.index, None, self.phase))
                    self._advance(task, None)
                    progressed = True
                    break

    def _advance(self, task: _Task, value, error: Exception | None = None) -> None:
        """Resume a statement with `value` (or raise `error` at its line) until it waits or finishes."""
        gen = task.gen
        while True:
            self.in_statement += 1
            entry, own = is_grad_enabled(), task.grad_mode     # a statement's own grad mode: see Scheduler
            if own is not None and own is not entry:
                set_grad_enabled(own)
            try:
                request = gen.send(value) if error is None else gen.throw(error)
            except StopIteration:
                request = None
            except BaseException:
                self.failed = task.index if self.failed is None else self.failed
                raise
            finally:
                self.in_statement -= 1
            if own is not None or (request is not None and is_grad_enabled() is not entry):
                Scheduler._hand_back_grad_mode(task, entry)
            if request is None:
                self.finished.add(task.index)
                self.tasks.remove(task)
                if self.unstarted:
                    self._start_ready()
                return
            try:
                kind = type(request)
                if kind is Read:
                    answered, value = self._read(task, request)
                elif kind is Write:
                    answered, value = self._write(task, request)
                else:                     # GradRead, GradWrite, Backward: _gradient_request, written out
                    gradients = self.gradients
                    answered, value = (gradients.read if kind is GradRead else gradients.write if kind is GradWrite
                                       else gradients.backward)(task, request)
                error = None
            except Exception as raised:     # raised where the statement asked: its own try/except sees it
                answered, value, error = True, None, raised
            if not answered:
                return

    start_ready = _start_ready

    # --- gradients: the scheduler that GradientEvents answers GradRead, GradWrite and Backward requests for ------

    def _gradient_request(self, task, request):
        gradients, kind = self.gradients, type(request)
        return (gradients.read if kind is GradRead else gradients.write if kind is GradWrite
                else gradients.backward)(task, request)

    def park(self, key, task, request) -> tuple:
        """Keep the task until `deliver(key)` (Scheduler.park)."""
        self.parked.setdefault(key, []).append((task, request))
        return False, None

    def deliver(self, key) -> None:
        """A gradient has arrived (GradientEvents._on_grad): answer what waits for it. The module event being
        answered when the pass began (the model's output, read by the statement that started it) stays live."""
        waiting = self.parked.pop(key, None)
        if not waiting:
            return
        task, request = waiting[0]
        if len(waiting) > 1 or type(request) is not GradRead or self.uses[request.use].write:
            self._deliver(key, waiting, self.live)
            return
        # One read of the gradient waits, the common case: _deliver and GradientEvents.read written out, which answer
        # a read (not an edit) of a gradient that has come with the gradient. Five functions of three modules less,
        # run cold inside the backward pass (bench/phases.py, the gradient scenario)
        outer, self.cause = self.cause, request.use
        try:
            task.cause = request.use
            self.timeline.append((task.index, request.use, self.phase))
            self._advance(task, self.gradients.grads[key[1:]])
        finally:
            self.cause = outer

    def too_late(self, task, use) -> OrderError:
        return OrderError(diagnose.too_late(use, self._cause_of(task)), use.line)
