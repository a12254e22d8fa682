"""A direct run's events (direct.py): what ForwardEvents does for a runtime, for a cell that reads and replaces
module outputs only; the core (scheduler.py) delivers them. A part of DirectRun, whose attributes it uses."""
from __future__ import annotations

from functools import partial

from torch import Tensor
from torch.nn.modules import module as torch_module

from ...errors import OrderError, diagnose, hints
from ..compile.program import Read, Write
from .forward import HOOKABLE, PATH_ERRORS, never_ran
from .hookset import DictHandle
from .elements import element, find, hold
from .moduletree import compiled_inner
from .scheduler import Scheduler
from .targets import target_elements


RETURNED = DictHandle({}.pop, None, None)      # the handle of an event answered without a hook: nothing to remove


class DirectEvents:
    """Module outputs, read and replaced from hooks, and the statements woken by them."""
    __slots__ = ()

    def _on_output(self, key, module, args, value):
        """A module returned `value`: answer what waits for it. Returns the replacement, if a statement made one."""
        if self.in_statement:
            return None         # a call the cell makes itself (a logit lens): not the model's own event
        values = self.values
        values[key] = value
        waiting = self.parked.get(key)
        if waiting is None:
            return None
        task, request = waiting[0]
        outer_live, self.live = self.live, key       # the module event whose value a statement may replace meanwhile
        try:
            if len(waiting) > 1 or type(request) is not Read or self.program.row_zero:
                Scheduler.deliver(self, key)
            else:                # one read waits, the common case: the core's delivery and `_read`, written out
                del self.parked[key]
                outer, self.cause = self.cause, request.use
                try:
                    task.cause, task.module = request.use, None
                    self.timeline.append((task.index, request.use, self.phase))
                    if type(value) is not Tensor:
                        self._note_type(request.use, self.uses[request.use], value)
                    (self._advance if task.loop is None else task.loop.advance)(task, value)
                finally:
                    self.cause = outer
        finally:
            self.live = outer_live
        new = values[key]
        return new if new is not value else None

    def _module(self, task, request):
        """The module a request names: the one the task was parked on, when it is being woken."""
        module = task.module
        if module is not None:
            task.module = None
            return module
        try:
            module = request.module()
        except PATH_ERRORS as error:
            raise self._path_error(error, request.use)
        if type(module).__name__ == "OptimizedModule":     # `model.output` of a torch.compile'd model
            return compiled_inner(module) or module
        return module

    def _read(self, task, request):
        module = task.module
        if module is not None:
            task.module = None
        elif type(request.at) is not int or (module := self._element(request.use, request.at)) is None:
            module = self._module(task, request)      # `PATH[i]` and `PATH[-1]` are found by `at`, as modules
            if not isinstance(module, HOOKABLE):
                return True, module.output
        key = (id(module), "output")
        values = self.values
        if key in values:
            use = self.uses[request.use]
            if use.write and key != self.live:
                raise OrderError(diagnose.too_late(use, self._cause_of(task)), use.line)
            value = values[key]
            if type(value) is not Tensor:
                self._note_type(request.use, use, value)
            if use.row_zero:
                hints.note_row_zero(use, value)
            return True, value
        if self.done or key not in self.hooks:
            return self._wait_for(module, key, task, request)
        task.module = module              # the common wait, hooked and still to come: _wait_for written out
        self.requested.add(request.use)
        self.parked.setdefault(key, []).append((task, request))
        return False, None

    def _element(self, use_id: int, at: int):
        """The module `PATH[at]` names: looked up in the model for a constant index, from the run's copy of PATH's
        blocks for a loop's (elements.py), never a compiled one; None: evaluate the expression."""
        held = self.held
        if held is None:
            held = self.held = {}
        found = held.get(use_id)
        if found is None:
            spec = self.program.containers[use_id]
            if not spec[2]:
                found = find(self.ns, spec, at)
                return None if type(found).__name__ == "OptimizedModule" else found     # unwrapped by _module
            found = held[use_id] = hold(self.ns, spec) or False
        return element(found, self.ns, at) if found else None

    def _write(self, task, request):
        module = self._module(task, request)
        if not isinstance(module, HOOKABLE):
            module.output = request.value
            return True, None
        key = (id(module), "output")
        if key == self.live:
            use = self.uses[request.use]
            self.last_replacement = (use, hints.shape_of(self.values[key]), hints.shape_of(request.value))
            self.values[key] = request.value
            return True, None
        if key in self.values:
            use = self.uses[request.use]
            raise OrderError(diagnose.too_late(use, self._cause_of(task)), use.line)
        return self._wait_for(module, key, task, request)

    def _wait_for(self, module, key, task, request) -> tuple:
        if self.done:
            use = self.uses[request.use]
            raise OrderError(diagnose.never_ran(use, module, self.model, after_forward=True), use.line)
        if key not in self.hooks:
            self._hook(module, key)
            if self.model_running:
                self.late_hooks = self.late_hooks or set()
                self.late_hooks.add(key)
        task.module = module              # the event that wakes the task is this module's
        self.requested.add(request.use)
        self.parked.setdefault(key, []).append((task, request))
        return False, None

    def _hook(self, module, key) -> None:
        if module is self.model and not (module._backward_hooks or module._backward_pre_hooks
                                         or torch_module._global_backward_hooks
                                         or torch_module._global_backward_pre_hooks):
            # The model's own output: answered from what its call returns (direct._forward), as a hook of ours,
            # which goes last, would see it; nothing of the model runs after that hook but the return. Not with
            # a backward hook on the model, whose wrapping of the output comes after the forward hooks.
            self.hooks[key] = RETURNED
            self.returned = key
            return
        # What answers the module's output event: a quiet cell logs it
        self.hooks.forward_hook(key, module, partial(self._log_event if self.program.quiet else self._on_output, key))

    def _log_event(self, key, module, args, value):
        """A quiet cell's hook (Program.quiet): the event, kept for `_replay`, as raw hooks keep what they read. Once
        the run answers inside the hooks (`logged` None: a target named nothing ahead, or a module called again,
        whose calls the log would keep all of), it passes the event on."""
        logged = self.logged
        if logged is not None and not self.in_statement:
            if key not in logged:
                logged[key] = value
                return None
            self._replay()
        return self._on_output(key, module, args, value)

    def _replay(self) -> None:
        """Answer a quiet cell's statements from the events logged so far, in the order they came: what they would
        have done inside the hooks, done later (nothing they do could change the model's run); from here on,
        events are answered as they come."""
        logged, self.logged = self.logged, None
        for key, value in logged.items():
            self._on_output(key, None, None, value)

    def _hook_targets(self) -> None:
        """Hook, before the model runs, every event the cell may read in any order (ForwardEvents.hook_targets)."""
        covered = self.covered
        for target in self.program.forward_targets:
            if target.uses and target.uses <= self.requested or target.needs and not target.needs <= self.finished:
                continue
            if covered and target.text in covered and target.every_element and target.keep is target.each is None:
                continue                # a HookLoop's blocks, hooked as it started
            modules = target_elements(target, self.ns)
            if not modules:
                self.logged = None     # its reads are hooked when asked for, so answered inside the hooks
            for module in modules:
                key = (id(module), "output")
                if isinstance(module, HOOKABLE) and key not in self.hooks:
                    self._hook(module, key)

    # --- what only a failure or a hint needs ----------------------------------------------------

    def _note_type(self, use_id: int, use, value) -> None:
        if type(value) is tuple:
            self.tuple_reads = self.tuple_reads or {}
            self.tuple_reads[use_id] = (use, len(value))
        elif not isinstance(value, Tensor):
            self.other_reads = self.other_reads or {}
            self.other_reads[use_id] = (use, type(value).__name__)

    def _cause_of(self, task):
        return self.uses[task.cause] if task.cause is not None else None

    def _path_error(self, error: Exception, use_id: int) -> Exception:
        found = diagnose.module_path_error(self.uses[use_id], self.ns, error)
        found.__cause__ = error
        return found

    def _never_came(self) -> Exception:
        """The error for the earliest statement still waiting when the cell ends (Runtime._check_finished)."""
        task, request = self.first_wait()
        if type(request) is not Read and type(request) is not Write:
            return self.gradients.never_came(request)
        late = self.late_hooks is not None and (id(task.module), "output") in self.late_hooks
        return never_ran(self.uses[request.use], task.module, self.model, late)
