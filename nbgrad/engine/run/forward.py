"""Forward events: what a module was called with and what it returned, read and replaced from hooks. The one home of
module events for every run (runtime.py): a hook delivers its event to the core (scheduler.py), which wakes the
statements parked on it. What a failure needs is in missing.py; the deferred statement kind (a quiet cell's log and
replay) is here, as it is only a way of answering these events later."""
from __future__ import annotations

from functools import partial

from torch import Tensor, nn
from torch.nn.modules import module as torch_module

from ..compile.program import Read
from .elements import element, find, hold
from .hookset import DictHandle
from .calls import hook_every_call, note_called_again
from .missing import HOOKABLE, PATH_ERRORS, note_type, path_error
from ..moduletree import compiled_inner
from .scheduler import Scheduler
from .rows import rows_of
from .skips import PARTIAL, RowsSkipped, SkipGate, checked_skip_value
from .stopping import StopRun, never_came_after_stop
from .targets import target_elements
from ...errors import OrderError, diagnose, hints

RETURNED = DictHandle({}.pop, None, None)      # the handle of an event answered without a hook: nothing to remove


class ForwardEvents:
    """Answers Read and Write requests. An event key is `(id(module), kind)`. `fast`: the run may use the fast
    statement kinds (a quiet cell deferred, the model's own output answered from what its call returns)."""
    __slots__ = ("runtime", "uses", "values", "live", "late_hooks", "model_running", "done", "tuple_reads",
                 "other_reads", "last_replacement", "requested", "sinks", "early_sinks", "cache_only", "stopping",
                 "quick", "batch", "quiet", "logged", "answers_return", "returned", "held", "covered", "deferred")

    def __init__(self, runtime, fast: bool = False):
        program = runtime.program
        self.runtime = runtime
        self.uses = program.uses
        self.values: dict = {}           # event key -> value of its latest firing
        self.live = None                 # the event whose statements run now (the one a write may replace)
        self.model_running = self.done = self.stopping = False    # done: the model's forward call has returned
        # For hints and messages, made when first needed: hooks first asked for while the model was already running;
        # reads that returned a tuple or another non-tensor; the latest replacement (use, shape before, shape after)
        self.late_hooks = self.tuple_reads = self.other_reads = self.last_replacement = None
        self.requested: set = set()      # use ids that a statement has waited on (so their module is hooked)
        self.sinks: dict = {}            # event key -> callbacks that get each value (a cache(...) of the cell)
        self.early_sinks: dict = {}      # event key -> callbacks that see it before the statements waiting on it
        self.cache_only: set = set()     # event keys only a copying cache watches: no value kept for statements
        # One read waiting is answered with the event's value itself: no invoke's rows to cut, no row-0 hint; in
        # invokes, one whose statement takes its rows as it indexes (`read`'s slice case), given a value of `batch` rows
        self.quick = runtime.rows is None and not program.row_zero
        self.batch = runtime.rows.batch_size if runtime.rows is not None and not program.row_zero else None
        self.quiet = fast and program.quiet   # the deferred kind: events logged, statements answered after the model
        self.logged = None               # a quiet cell's events (or `deferred`'s), key -> value in order, till replayed
        self.answers_return = fast       # the model's own output may be answered from what its call returns
        self.returned = None             # the key of that output, when it is answered so
        self.held = None                 # use id -> where its loop's `PATH[i]` finds blocks (elements.py), or False
        self.covered = frozenset()       # the PATHs of loops whose blocks are hooked by their Steps (hookloops.py)
        self.deferred = None             # the run's edit loop, whose log `logged` holds when it may (hookloops.py)

    def read(self, task, request):
        module = task.module        # the module it was parked on, when it is being woken
        if module is not None:
            task.module = None
        elif type(request.at) is not int or (module := self._element(request.use, request.at)) is None:
            module = self._module(task, request)      # `PATH[i]` and `PATH[-1]` are found by `at`, as modules
        use = self.uses[request.use]
        if not isinstance(module, HOOKABLE):
            return True, getattr(module, use.kind)
        key = (id(module), use.kind)
        values = self.values
        if key in values:
            if use.write and key != self.live:
                raise self.runtime.too_late(task, use)
            value, invoke = values[key], task.node.spec.invoke
            if invoke is not None:      # an invoke's rows (`rows_of`, its view written out where no skip is partial)
                rows = self.runtime.rows
                if type(task.item) is slice:    # which an on-event statement's index takes itself (OnEvent.rows)
                    if type(value) is Tensor and not PARTIAL and value.dim() and value.shape[0] == rows.batch_size:
                        return True, value
                    task.item = None
                value = rows_of(rows, module, value, use, invoke) if PARTIAL else rows.view(value, invoke)
            if type(value) is not Tensor:
                note_type(self, request.use, use, value)
            if use.row_zero:
                hints.note_row_zero(use, value)
            return True, value
        if self.done or self.cache_only or key not in self.runtime.hooks:
            return self._wait_for(module, key, task, request, use)
        task.module = module              # the common wait, hooked and still to come: `_wait_for` written out
        self.requested.add(request.use)
        self.runtime.parked.setdefault(key, []).append((task, request))
        return False, None

    def write(self, task, request):
        module = self._module(task, request)
        use = self.uses[request.use]
        if not isinstance(module, HOOKABLE):
            setattr(module, use.kind, request.value)
            return True, None
        key = (id(module), use.kind)
        if key == self.live:
            value, invoke, rows = request.value, task.node.spec.invoke, self.runtime.rows
            if use.skip:
                checked_skip_value(use, value)
            if invoke is not None and type(module) is SkipGate:     # M.skip(v) in an invoke: v is M at its rows
                value = RowsSkipped.add(self.values[key], rows, invoke, value)
            elif invoke is not None:
                value = rows.replace(self.values[key], invoke, value)
            shown = request.value if use.skip else value      # a skip's own v, not the invokes' values it joins
            self.last_replacement = (use, hints.shape_of(self.values[key]), hints.shape_of(shown))
            self.values[key] = value
            return True, None
        if key in self.values:
            raise self.runtime.too_late(task, use)
        return self._wait_for(module, key, task, request, use)

    def _wait_for(self, module, key, task, request, use):
        runtime = self.runtime
        if self.done and runtime.stopped_at is not None:
            raise never_came_after_stop(use, diagnose.module_path(runtime.model, module) or use.target,
                                        runtime.stopped_at, runtime.rows is not None)
        if self.done:
            raise OrderError(diagnose.never_ran(use, module, runtime.model, after_forward=True), use.line)
        if self.hook(module, use.kind) and self.model_running:
            self.late_hooks = self.late_hooks or set()
            self.late_hooks.add(key)
        task.module = module              # the event that wakes the task is this module's
        self.requested.add(request.use)
        runtime.parked.setdefault(key, []).append((task, request))
        return False, None

    def _module(self, task, request):
        """The module a request names: the one the task was parked on, when it is being woken; else found by its path,
        or an error that says which step of the path is not in the model."""
        module = task.module
        if module is not None:
            task.module = None
            return module
        try:
            module = request.module()
        except PATH_ERRORS as error:
            raise path_error(self, error, request.use)
        if type(module).__name__ == "OptimizedModule":     # `model.output` of a torch.compile'd model
            return compiled_inner(module) or module
        return module

    def _element(self, use_id: int, at: int):
        """The module `PATH[at]` names: looked up in the model for a constant index, from the run's copy of PATH's
        blocks for a loop's (elements.py), never a compiled one; None: evaluate the expression."""
        held = self.held
        if held is None:
            held = self.held = {}
        found = held.get(use_id)
        ns = self.runtime.ns
        if found is None:
            spec = self.runtime.program.containers[use_id]
            if not spec[2]:
                found = find(ns, spec, at)
                return None if type(found).__name__ == "OptimizedModule" else found     # unwrapped by _module
            found = held[use_id] = hold(ns, spec) or False
        return element(found, ns, at) if found else None

    def hook_targets(self, targets: list) -> None:
        """Hook, before the model runs, every event whose module can be found already, except a plain path
        one of whose uses a statement already waits on (its module is hooked), and a hook loop's blocks."""
        runtime, covered = self.runtime, self.covered
        done, ns = runtime.finished, runtime.ns
        for target in targets:
            if target.uses and not target.uses.isdisjoint(self.requested) or target.needs and not target.needs <= done:
                continue
            if covered and target.text in covered and target.every_element and target.keep is target.each is None:
                continue                # a HookLoop's blocks, hooked as it started
            modules = target_elements(target, ns)
            if not modules:
                self.logged = None     # its reads are hooked when asked for, so answered inside the hooks
            for module in modules:
                if target.every_call:
                    hook_every_call(self, module, target.kind)
                elif isinstance(module, HOOKABLE):
                    self.hook(module, target.kind)

    def hook(self, module: nn.Module, kind: str, prepend: bool = False, for_statement: bool = True) -> bool:
        """Hook one event of a module; True when the hook is new."""
        if for_statement and self.cache_only:
            self.cache_only.discard((id(module), kind))
        hooks = self.runtime.hooks
        if (id(module), "input" if kind == "inputs" else kind) in hooks:
            return False
        if kind == "output":
            key = (id(module), "output")
            if for_statement and self.answers_return and module is self.runtime.model and not (
                    module._backward_hooks or module._backward_pre_hooks or torch_module._global_backward_hooks
                    or torch_module._global_backward_pre_hooks):
                # The model's own output: answered from its call's return (Runtime._forward), as our last hook would
                # see it. Not with a backward hook on the model, which wraps the output after the forward hooks
                hooks[key] = RETURNED
                self.returned = key
                return True
            # Registered here, not through HookSet.add: this is every cell's hook, and the two calls add up
            hooks.forward_hook(key, module, partial(self._log_event if self.quiet else self._on_event, key), prepend)
            return True
        module_id = id(module)

        def on_input(mod, args, kwargs):
            return self._on_input(module_id, args, kwargs)
        return hooks.add((module_id, "input"), lambda: module.register_forward_pre_hook(
            on_input, with_kwargs=True, prepend=prepend))

    def _on_event(self, key, module, args, value):
        """An event fires: `value` is what the module returned or was called with. Called as a forward hook
        (with `module` and `args`, unused), from `_on_input` or a replay (with None for both). Returns the
        replacement, if a statement made one."""
        runtime = self.runtime
        if runtime.in_statement:
            return None         # a call the cell makes itself (a logit lens): not the model's own event
        if key in (values := self.values):      # a module called again in this forward (a recurrent cell): a hint
            note_called_again(self, key)
        values[key] = value
        if self.early_sinks and key in self.early_sinks:
            for callback in self.early_sinks[key]:
                callback(value)
        waiting = runtime.parked.get(key)
        if waiting is not None:
            outer_live, self.live = self.live, key
            try:
                task, request = waiting[0]
                if len(waiting) > 1 or type(request) is not Read or not self.quick and not (type(task.item) is slice
                        and type(value) is Tensor and not PARTIAL and value.dim() and value.shape[0] == self.batch):
                    Scheduler.deliver(runtime, key)
                else:            # one read waits, the common case: the core's delivery and `read`, written out
                    del runtime.parked[key]
                    outer, runtime.cause = runtime.cause, request.use
                    try:
                        task.cause, task.module = request.use, None
                        if type(value) is not Tensor:
                            note_type(self, request.use, self.uses[request.use], value)
                        runtime._advance(task, value, None, request.use)
                    finally:
                        runtime.cause = outer
            finally:
                self.live = outer_live
        new = values[key]
        if self.sinks and key in self.sinks:
            self._to_sinks(key, new)
        if self.stopping and self.model_running:
            raise StopRun                 # stop() ran in this event's statements: no later module runs
        return new if new is not value else None

    def _to_sinks(self, key, value) -> None:
        for callback in self.sinks[key]:
            callback(value)
        if key in self.cache_only:
            if isinstance(value, Tensor):
                self.runtime.shapes[key] = tuple(value.shape)
            del self.values[key]      # the cache keeps its own copy: the run need not hold this one

    def _on_input(self, module_id, args, kwargs):
        if self.runtime.in_statement:
            return None
        new_pair = self._on_event((module_id, "inputs"), None, None, (args, kwargs))
        if new_pair is not None:
            args, kwargs = new_pair
        first = args[0] if args else next(iter(kwargs.values()), None)
        new_first = self._on_event((module_id, "input"), None, None, first)
        if new_first is not None:
            if args:
                args = (new_first,) + tuple(args[1:])
            else:
                kwargs = {**kwargs, next(iter(kwargs)): new_first}
        if new_pair is None and new_first is None:
            return None
        return tuple(args), kwargs

    # --- the deferred statement kind: a quiet cell (Program.quiet) --------------------------------------

    def _log_event(self, key, module, args, value):
        """A quiet cell's hook: the event, kept for `replay`, as raw hooks keep what they read. Once the run answers
        inside the hooks (`logged` None: a target named nothing ahead, or a module called again, whose calls the log
        would keep all of), it passes the event on."""
        logged = self.logged
        if logged is not None and not self.runtime.in_statement:
            if key not in logged:
                logged[key] = value
                return None
            self.replay()
        return self._on_event(key, module, args, value)

    def replay(self) -> None:
        """Answer a quiet cell's statements from the events logged so far, in the order they came: what they would
        have done inside the hooks, done later (nothing they do could change the model's run); from here on,
        events are answered as they come."""
        logged, self.logged = self.logged, None
        for key, value in logged.items():
            self._on_event(key, None, None, value)
