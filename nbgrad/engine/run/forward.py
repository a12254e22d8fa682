"""Forward events: what a module was called with and what it returned, read and replaced from hooks."""
from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from ...errors import diagnose
from ...errors import hints
from ...errors import OrderError
from .moduletree import compiled_inner
from .stopping import StopRun, never_came_after_stop
from .sites import NoSourceError, Site, SiteError
from .skips import PARTIAL, RowsSkipped, SkipGate, checked_skip_value, skipped_around, skipped_for_invoke
from .targets import target_elements

HOOKABLE = (nn.Module, Site, SkipGate)   # what has events: a module, a site inside a forward, a skip
# What finding a module along a statement's path may raise, for a step that is not in the model
PATH_ERRORS = (SiteError, NoSourceError, AttributeError, IndexError, KeyError, TypeError)


def never_ran(use, module, model, late: bool) -> OrderError:
    """The error for a read of a module's event that never came, with the model's forward over (`late`: its hook was
    first asked for while the model ran)."""
    skipped = skipped_around(module)
    if skipped is not None:
        return OrderError(f"{use.target}.{use.kind} never came: {type(skipped).__name__} was skipped "
                          f"(`.skip(...)`), so nothing inside it ran", use.line)
    return OrderError(diagnose.never_ran(use, module, model, after_forward=False, late=late), use.line)


class ForwardEvents:
    """Answers Read and Write requests. An event key is `(id(module), kind)`."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.uses = runtime.program.uses
        self.values: dict = {}           # event key -> value of the latest firing
        self.live: set = set()           # event keys whose hook is running now
        self.late_hooks: set = set()     # hooks first asked for while the model was already running
        self.model_running = False
        self.done = False                # the model's forward call has returned
        self.tuple_reads: dict = {}      # use id -> (use, length) of reads that returned a tuple, for hints
        self.other_reads: dict = {}      # use id -> (use, type name) of reads that returned neither, for hints
        self.last_replacement = None     # (use, shape before, shape after) of the latest replaced value
        self.requested: set = set()      # use ids that a statement has waited on (so their module is hooked)
        self.sinks: dict = {}            # event key -> callbacks that get each value (a cache(...) of the cell)
        self.early_sinks: dict = {}      # event key -> callbacks that see it before the statements waiting on it
        self.cache_only: set = set()     # event keys only a copying cache watches: no value kept for statements
        self.stopping = False            # a statement called stop(): the next event ends the model run

    # --- requests -------------------------------------------------------------------------------

    def read(self, task, request):
        module = task.module        # the module it was parked on, when it is being woken (as in _module)
        if module is None:
            try:                    # `resolve`, written out: this runs for every module a statement reads
                module = request.module()
            except PATH_ERRORS as error:
                raise self.path_error(error, request.use)
            if type(module).__name__ == "OptimizedModule":
                module = compiled_inner(module) or module
        else:
            task.module = None
        use = self.uses[request.use]
        if not isinstance(module, HOOKABLE):
            return True, getattr(module, use.kind)
        key = (id(module), use.kind)
        if key in self.values:
            if use.write and key not in self.live:
                raise self.runtime.scheduler.too_late(task, use)
            value = self.values[key]
            if task.node.spec.invoke is not None:
                if PARTIAL and (skipped := skipped_for_invoke(module, task.node.spec.invoke)) is not None:
                    raise OrderError(f"{use.target}.{use.kind} never came for this invoke: it skipped "
                                     f"{type(skipped).__name__} (`.skip(...)`), so nothing inside it ran at its rows "
                                     f"(it ran for the other invokes' rows)", use.line)
                value = self.runtime.rows.view(value, task.node.spec.invoke)
            if type(value) is not Tensor:
                if type(value) is tuple:
                    self.tuple_reads[request.use] = (use, len(value))
                elif not isinstance(value, Tensor):
                    self.other_reads[request.use] = (use, type(value).__name__)
            if use.row_zero:
                hints.note_row_zero(use, value)
            return True, value
        if self.done or self.cache_only or key not in self.runtime.hooks:
            return self._wait_for(module, key, task, request, use)
        # The common wait, hooked and still to come, written out (as at the end of `_wait_for`): no call
        task.module = module
        self.requested.add(request.use)
        self.runtime.scheduler.parked.setdefault(key, []).append((task, request))
        return False, None

    def write(self, task, request):
        module = self._module(task, request)
        use = self.uses[request.use]
        if not isinstance(module, HOOKABLE):
            setattr(module, use.kind, request.value)
            return True, None
        key = (id(module), use.kind)
        if key in self.live:
            value, invoke = request.value, task.node.spec.invoke
            if use.skip:
                checked_skip_value(use, value)
            if invoke is not None and type(module) is SkipGate:     # M.skip(v) in an invoke: v is M at its rows
                value = RowsSkipped.add(self.values[key], self.runtime.rows, invoke, value)
            elif invoke is not None:
                value = self.runtime.rows.replace(self.values[key], invoke, value)
            shown = request.value if use.skip else value      # a skip's own v, not the invokes' values it joins
            self.last_replacement = (use, hints.shape_of(self.values[key]), hints.shape_of(shown))
            self.values[key] = value
            return True, None
        if key in self.values:
            raise self.runtime.scheduler.too_late(task, use)
        return self._wait_for(module, key, task, request, use)

    def _wait_for(self, module, key, task, request, use):
        if self.done and self.runtime.stopped_at is not None:
            raise never_came_after_stop(use, diagnose.module_path(self.runtime.model, module) or use.target,
                                        self.runtime.stopped_at, self.runtime.rows is not None)
        if self.done:
            raise OrderError(diagnose.never_ran(use, module, self.runtime.model, after_forward=True), use.line)
        if self.hook(module, use.kind) and self.model_running:
            self.late_hooks.add(key)
        task.module = module              # the event that wakes the task is this module's
        self.requested.add(request.use)
        return self.runtime.scheduler.park(key, task, request)

    def _module(self, task, request):
        """The module a request names: the one the task was parked on, when it is being woken."""
        module = task.module
        if module is None:
            return self.resolve(request.module, request.use)
        task.module = None
        return module

    def resolve(self, thunk, use_id):
        """The module a request names, or an error that says which step of its path is not in the model."""
        try:
            module = thunk()
        except PATH_ERRORS as error:
            raise self.path_error(error, use_id)
        if type(module).__name__ == "OptimizedModule":     # `model.output` of a torch.compile'd model
            return compiled_inner(module) or module
        return module

    def path_error(self, error: Exception, use_id) -> Exception:
        """What to raise when finding a request's module raised `error` (one of PATH_ERRORS): an error that
        says which step of its path is not in the model, or for `M.source.NAME`, the message with the line."""
        if isinstance(error, (SiteError, NoSourceError)):
            found = type(error)(error.detail, error.line or self.uses[use_id].line)
            found.__suppress_context__ = True
            return found
        found = diagnose.module_path_error(self.uses[use_id], self.runtime.ns, error)
        found.__cause__ = error
        return found

    def never_came(self, request) -> OrderError:
        """The error for a statement still waiting on this event when the cell ends."""
        use = self.uses[request.use]
        module = self.resolve(request.module, request.use)
        if self.runtime.stopped_at is not None:
            return never_came_after_stop(use, diagnose.module_path(self.runtime.model, module) or use.target,
                                         self.runtime.stopped_at, self.runtime.rows is not None)
        if isinstance(module, Site) and module.table.reached(module) is False:
            return OrderError(diagnose.site_not_reached(use, f"{module.table.label}.{module.name}"), use.line)
        return never_ran(use, module, self.runtime.model, (id(module), use.kind) in self.late_hooks)

    # --- hooks ----------------------------------------------------------------------------------

    def hook_targets(self, targets: list, namespace: dict) -> None:
        """Hook, before the model runs, every event whose module can be found already, except a plain path
        whose every use a statement already waits on (its module is hooked)."""
        done = self.runtime.scheduler.finished
        for target in targets:
            if target.uses and target.uses <= self.requested or target.needs and not target.needs <= done:
                continue
            for module in target_elements(target, namespace):
                if isinstance(module, HOOKABLE):
                    self.hook(module, target.kind)

    def watch(self, module: nn.Module, kind: str, callback, drop_values: bool = False,
              prepend: bool = False, early=None) -> None:
        """Call `callback(value)` at every firing of an event (for `cache(...)`), once the statements waiting on
        it have run (with their edits), and `early(value)` before they run (one of them may start a backward
        pass); with `drop_values`, the run keeps no value of its own for it unless a statement asks for it."""
        key = (id(module), kind)
        if self.hook(module, kind, prepend=prepend, for_statement=False) and drop_values:
            self.cache_only.add(key)
        self.sinks.setdefault(key, []).append(callback)
        if early is not None:
            self.early_sinks.setdefault(key, []).append(early)

    def hook(self, module: nn.Module, kind: str, prepend: bool = False, for_statement: bool = True) -> bool:
        """Hook one event of a module; True when the hook is new."""
        if for_statement and self.cache_only:
            self.cache_only.discard((id(module), kind))
        if (id(module), "input" if kind == "inputs" else kind) in self.runtime.hooks:
            return False
        if kind == "output":
            key = (id(module), "output")
            # Registered here, not through HookSet.add: this is every cell's hook, and the two calls add up.
            self.runtime.hooks.forward_hook(key, module, partial(self._on_event, key), prepend)
            return True
        module_id = id(module)

        def on_input(mod, args, kwargs):
            return self._on_input(module_id, args, kwargs)
        return self.runtime.hooks.add((module_id, "input"), lambda: module.register_forward_pre_hook(
            on_input, with_kwargs=True, prepend=prepend))

    def _on_event(self, key, module, args, value):
        """An event fires: `value` is what the module returned or was called with. Called as a forward hook
        (with `module` and `args`, unused) or from `_on_input` (with None for both)."""
        if self.runtime.scheduler.in_statement:
            return None         # a call the cell makes itself (a logit lens): not the model's own event
        self.values[key] = value
        if self.early_sinks and key in self.early_sinks:
            for callback in self.early_sinks[key]:
                callback(value)
        self.live.add(key)
        try:
            self.runtime.scheduler.deliver(key)
        finally:
            self.live.discard(key)
        new = self.values[key]
        if isinstance(new, torch.Tensor):
            self.runtime.shapes[key] = tuple(new.shape)
        if self.sinks and key in self.sinks:
            for callback in self.sinks[key]:
                callback(new)
            if key in self.cache_only:
                del self.values[key]      # the cache keeps its own copy: the run need not hold this one
        if self.stopping and self.model_running:
            raise StopRun                 # stop() ran in this event's statements: no later module runs
        return new if new is not value else None

    def _on_input(self, module_id, args, kwargs):
        if self.runtime.scheduler.in_statement:
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
