"""The direct run: the common cell, run by one object instead of the runtime's six parts.

Most cells only read module outputs, edit or replace them, and save (`Program.direct`: no `.grad` or backward
pass, invoke, input event, cache, stop, site or skip, and no `with` block around a read). For those, the
general runtime's parts (runtime.py) are machinery the cell never uses, and each costs microseconds between
two forward passes. A DirectRun does the same with the same compiled statements: it hooks exactly the events
they wait for, resumes each when its event fires, and gives everything back in one `try/finally`. Its
semantics are the runtime's, part for part (the names below say which part each step mirrors), and a
differential test holds them equal; what only a failure needs (messages, hints, the graph) is shared code.
"""
from __future__ import annotations

import types
from threading import get_ident

from torch import Tensor, is_grad_enabled, set_grad_enabled

from ...errors import for_the_cell, hints, located
from ..compile.program import RUNTIME_NAME, Read, Write
from .cellstate import CellState
from .claims import _local, _tracing, claim, release
from .directevents import DirectEvents
from .hookset import HookSet
from .result import Later, Result, saved_later
from .runtime import run_graph
from .scheduler import AFTER_FORWARD, BEFORE_MODEL, FORWARD, Scheduler


class _Task:
    """A started statement (the scheduler's Task, with its node's index at hand)."""
    __slots__ = ("index", "gen", "cause", "module", "grad_mode")


class DirectRun(DirectEvents, CellState):
    """One run of one direct cell: create, `run_trace(args, kwargs)`, discard (as a Runtime). It is its own
    CellState: the snapshot of grad mode, flags and names that `_exit` gives back."""
    # What compiled statements ask of `__nbgrad__` (compile/rewrite.py), as of the Runtime
    Read, Write = Read, Write
    new = tuple.__new__
    stepping = False                 # never one step of a generation
    # Where a run starts: set here, not in __init__, so that making a run sets only what it fills
    live = None                      # the event whose statements run now
    cause = None                     # the use id of the event being delivered now
    failed = None                    # the index of the node whose statement raised
    in_statement = 0                 # > 0 while a statement's own code runs: its module calls are not events
    phase = BEFORE_MODEL
    model_running = done = _exited = False     # done: the model's forward call has returned
    thread_runtimes = None           # the runtimes list of the thread that entered this run, once its snapshot is whole
    # For hints and messages, made when first needed: hooks first asked for while the model was already running;
    # reads that returned a tuple or another non-tensor (as ForwardEvents')
    late_hooks = tuple_reads = other_reads = last_replacement = None
    logged = None                    # a quiet cell's events, key -> value in the order they came, until replayed
    held = None                      # use id -> what its `PATH[i]` reads find modules in (elements.py), or False

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

    # What shared code reads of a runtime's parts (hints, Cache._filling): here they are one object
    forward = saved = property(lambda self: self)

    def save(self, value, line=None, label=None):
        """`x.save()` in the cell: keep x after it."""
        self.by_id[id(value)] = (label or f"line {line}", value, line or 0)
        return value

    # --- the run (Runtime.run_trace and _run) ---------------------------------------------------

    def run_trace(self, call_args: tuple, call_kwargs: dict) -> Result:
        __tracebackhide__ = True
        try:
            try:
                self._enter()
                if self.no_grad and self.grad_mode:     # given back by _exit (restore_grad_state)
                    set_grad_enabled(False)
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
                self.model(*call_args, **call_kwargs)
            except Exception:
                if self.logged:      # what a quiet cell's statements did inside the hooks before the model failed
                    self._replay()
                raise
            if self.logged is not None:
                self._replay()
        except RuntimeError as error:
            hints.note_float_ids(error, call_args, call_kwargs)
            raise
        self.model_running, self.done, self.phase = False, True, AFTER_FORWARD
        if self.unstarted:
            self._start_ready()

    def _enter(self) -> None:
        model = self.model
        if _tracing.setdefault(id(model), me := get_ident()) != me:      # claims.claim, written out
            claim(model)
        runtimes = _local.runtimes
        CellState.__init__(self, self.program, self.ns, model, runtimes)
        self.thread_runtimes = runtimes      # set once the snapshot is whole: `_exit` gives it back then
        runtimes.append(self)
        self.ns[RUNTIME_NAME] = self
        if "__builtins__" not in self.ns:
            self.ns["__builtins__"] = __builtins__

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
        self._exited = True

    def _result(self) -> Result:
        saved = saved_later(self.by_id, self.program.bound_names, self.ns)
        shapes = {}            # of what each hooked event returned last (after the cell's edits), for the sidebar
        for key, value in self.values.items():
            if isinstance(value, Tensor):
                shapes[key] = tuple(value.shape)
        return Result(saved, Later((run_graph, self.program, self.timeline, self.failed)), shapes)

    def _for_the_cell(self, error: BaseException) -> BaseException:
        error = located(error, self.uses)
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
                if self.finished.issuperset(node.spec.deps):
                    self.unstarted.remove(node)
                    task = _Task()
                    task.index, task.cause, task.module, task.grad_mode = node.spec.index, self.cause, None, None
                    task.gen = types.FunctionType(node.code, self.ns)()
                    self.tasks.append(task)
                    self.timeline.append((node.spec.index, None, self.phase))
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
                answered, value = (self._read if type(request) is Read else self._write)(task, request)
                error = None
            except Exception as raised:     # raised where the statement asked: its own try/except sees it
                answered, value, error = True, None, raised
            if not answered:
                return
