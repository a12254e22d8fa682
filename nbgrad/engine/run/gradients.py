"""Gradient events: backward passes the cell starts, and the gradients that flow into its tensors."""
from __future__ import annotations

from functools import partial

import torch
from torch import nn

from ...errors import GradError, diagnose
from ..compile.program import GradRead
from .sites import Site
from .targets import target_elements


def register_grad_hook(tensor: torch.Tensor, hook):
    """`tensor.register_hook(hook)`, safe on a view just edited in place: reading `grad_fn` first makes
    PyTorch build the view's grad_fn anew; hooking the stale one kills the process (torch 2.13)."""
    tensor.grad_fn
    return tensor.register_hook(hook)


def keeps_graph(args: tuple, kwargs: dict) -> bool:
    """Does a backward call with these arguments (after the loss: gradient, retain_graph, create_graph, as
    both `Tensor.backward` and `torch.autograd.backward` take them) keep the graph for another pass?"""
    retain = kwargs.get("retain_graph", args[1] if len(args) > 1 else None)
    if retain is None:            # PyTorch's default: keep it when building a graph of the gradient
        retain = kwargs.get("create_graph", args[2] if len(args) > 2 else False)
    return bool(retain)


def _plain_grad(value, use):
    """`value`, whose `.grad` the cell reads or sets as Python's attribute (a value that is not a tensor); a module or
    a site, which has no gradient of its own, is an error that names what has one: what it returns."""
    if isinstance(value, (nn.Module, Site)):
        raise GradError(diagnose.grad_of_module(use, value), use.line)
    return value


class GradientEvents:
    """Answers GradRead, GradWrite and Backward requests. A gradient key is `(id(tensor), pass index)`."""

    def __init__(self, runtime):
        self.runtime = runtime
        # Held here, read at every request: the run's core (the run itself) and ForwardEvents' values
        self.scheduler = runtime
        self.values = runtime.forward.values
        self.uses = runtime.program.uses
        self.passes = runtime.program.graph.passes
        self.pass_state = ["pending"] * len(self.passes)
        self.running: list = []          # indices of the passes running now, innermost last
        self.grads: dict = {}            # gradient key -> gradient
        self.live: set = set()           # gradient keys whose hook is running now
        self.replaced: set = set()       # gradient keys the cell replaced or edits
        self.late: set = set()           # gradient hooks first asked for while their pass was running
        self.sources: dict = {}          # id(gradient) -> id of the tensor it flowed into
        # Gradients that an edit or replacement took the place of: held to the end of the run, so that no tensor made
        # meanwhile takes an id `sources` names (a saved copy would pass for a gradient in the Result's pairing)
        self.taken_over: list = []
        self.hooked: dict = {}           # id(tensor) -> (tensor, its version when hooked)
        self.freed_by = None             # the latest pass that ran without keeping its graph (retain_graph)

    def read(self, task, request):
        tensor, use, pass_index = request.tensor, self.uses[request.use], request.pass_index
        if not isinstance(tensor, torch.Tensor):
            return True, _plain_grad(tensor, use).grad
        rows = self.runtime.rows
        if rows is not None:            # an invoke's rows of the gradient of the batch tensor
            tensor, invoke = rows.grad_target(tensor, task.node.spec.invoke)
            if invoke is not None:
                answered, value = self._read(task, request, tensor, use, pass_index)
                if answered:
                    value = rows.view(value, invoke)
                    self.sources[id(value)] = id(request.tensor)
                return answered, value
        return self._read(task, request, tensor, use, pass_index)

    def _read(self, task, request, tensor, use, pass_index):
        if pass_index is None:
            raise GradError(diagnose.no_backward_pass(use, self.runtime.program.mode), use.line)
        key = (id(tensor), pass_index)
        if key in self.grads:
            return self._known(task, use, key)
        if self.pass_state[pass_index] == "done":
            if (tensor.is_leaf or tensor.retains_grad) and tensor.grad is not None and not use.write:
                return True, tensor.grad
            raise GradError(diagnose.grad_never_computed(use, tensor, self.passes[pass_index]), use.line)
        if not tensor.requires_grad:
            no_grad = self.runtime.no_grad or not torch.is_grad_enabled()
            # a generation step runs under generate's own torch.no_grad(), with no --no-grad to drop
            raise GradError(diagnose.grad_not_required(use, no_grad, option=not self.runtime.stepping), use.line)
        if self.hook(tensor) and self.pass_state[pass_index] == "running":
            self.late.add(key)
        return self.scheduler.park(("grad",) + key, task, request)

    def _known(self, task, use, key):
        """A read of a gradient that has arrived: live (editable), or already passed on."""
        if key in self.live:
            if use.write and key not in self.replaced:
                self.grads[key] = self.grads[key].clone()
                self.replaced.add(key)
            return True, self.grads[key]
        if use.write:
            raise self.scheduler.too_late(task, use)
        return True, self.grads[key]

    def write(self, task, request):
        tensor, use, pass_index = request.tensor, self.uses[request.use], request.pass_index
        if not isinstance(tensor, torch.Tensor):
            _plain_grad(tensor, use).grad = request.value
            return True, None
        invoke = None
        if self.runtime.rows is not None:
            tensor, invoke = self.runtime.rows.grad_target(tensor, task.node.spec.invoke)
        key = (id(tensor), pass_index) if pass_index is not None else None
        if key in self.live:
            value = request.value
            if invoke is not None:
                value = self.runtime.rows.replace(self.grads[key], invoke, value)
            self.grads[key] = value
            self.replaced.add(key)
            return True, None
        if key is None or key in self.grads or self.pass_state[pass_index] == "done":
            if pass_index is None or self.pass_state[pass_index] == "done":
                tensor.grad = request.value      # outside any pass this is the plain attribute, as in PyTorch
                return True, None
            raise self.scheduler.too_late(task, use)
        self.hook(tensor)
        return self.scheduler.park(("grad",) + key, task, request)

    def backward(self, task, request):
        target, pass_index, args, kwargs = request.target, request.pass_index, request.args, request.kwargs
        backward_pass = self.passes[pass_index]
        loss, args = (args[0], args[1:]) if target is torch.autograd else (target, args)
        if not isinstance(loss, torch.Tensor):
            return True, target.backward(*args, **kwargs)
        runtime = self.runtime
        if not loss.requires_grad or loss.numel() != 1:       # only a loss check_loss may refuse: its code runs cold
            diagnose.check_loss(loss, backward_pass, args, kwargs, runtime.no_grad, runtime.ns, runtime.model,
                                option=not runtime.stepping)
        scheduler = self.scheduler
        outer_phase = scheduler.phase
        self.pass_state[pass_index] = "running"
        self.running.append(pass_index)
        scheduler.phase = f"backward pass {pass_index}"
        self._hook_pass_targets(pass_index)
        if scheduler.unstarted:
            scheduler.start_ready()
        try:
            (torch.autograd.backward(loss, *args, **kwargs) if target is torch.autograd
             else loss.backward(*args, **kwargs))
        except RuntimeError as error:
            if "second time" in str(error):
                raise GradError(diagnose.second_backward(backward_pass, self.freed_by), backward_pass.line) from error
            raise
        finally:
            self.running.pop()
            self.pass_state[pass_index] = "done"
            scheduler.phase = outer_phase
        if not keeps_graph(args, kwargs):
            self.freed_by = backward_pass
        if scheduler.parked:
            self._check_pass_delivered(pass_index)
        if scheduler.unstarted:
            scheduler.start_ready()
        return True, None

    def _check_pass_delivered(self, pass_index: int) -> None:
        """After a pass: a statement still waiting for one of its gradients waits forever. Say why."""
        parked = self.scheduler.parked
        for key in [k for k in parked if k[0] == "grad" and k[2] == pass_index]:
            _, request = parked[key][0]
            use = self.uses[request.use]
            late = (id(request.tensor), pass_index) in self.late
            raise GradError(diagnose.grad_never_computed(use, request.tensor, self.passes[pass_index], late), use.line)

    def close(self) -> None:
        """Let go of every gradient and of the run: no cycle left (run <-> its GradientEvents), so that both go by
        reference counting."""
        for store in (self.grads, self.sources, self.hooked, self.taken_over):
            store.clear()
        self.runtime = self.scheduler = None

    def never_came(self, request) -> GradError:
        """The error for a statement still waiting on a gradient when the cell ends."""
        use = self.uses[request.use]
        return GradError(diagnose.backward_never_ran(use, self.passes[request.pass_index]), use.line)

    # --- hooks ----------------------------------------------------------------------------------

    def _hook_pass_targets(self, pass_index: int) -> None:
        """Hook every `T.grad` of this pass whose T already exists, before any gradient arrives, so
        statements may read gradients in any order."""
        if self.hooked:
            self._rehook_edited()
        for recorder in self.runtime.recorders:      # cache(..., grads=True): each cached output, at each pass
            recorder.hook_grads()
        values = self.values
        for target in self.runtime.program.grad_targets:
            if target.pass_index != pass_index:
                continue
            for candidate in target_elements(target, self.runtime.ns):
                if target.kind is not None:
                    candidate = values.get((id(candidate), target.kind))
                elif self.runtime.rows is not None:
                    candidate = self.runtime.rows.base_of(candidate)
                if isinstance(candidate, torch.Tensor) and candidate.requires_grad:
                    self.hook(candidate)

    def hook(self, tensor: torch.Tensor) -> bool:
        """Hook the gradient of a tensor; True when the hook is new."""
        if id(tensor) in self.runtime.hooks:
            return False
        self.hooked[id(tensor)] = (tensor, tensor._version)
        # HookSet.grad_hook, not HookSet.add and a closure: this runs for every gradient a cell reads
        self.runtime.hooks.grad_hook(id(tensor), tensor, partial(self._on_grad, id(tensor)))
        return True

    def _rehook_edited(self) -> None:
        """As a pass starts: a tensor edited in place since it was hooked is hooked again, so that its
        `.grad` is the gradient of the value it holds now (PyTorch drops a view's hook at an in-place
        edit, and gives a plain tensor's hook the gradient of the value before the edit)."""
        for tensor_id, (tensor, version) in list(self.hooked.items()):
            if tensor._version != version:
                self.hooked[tensor_id] = (tensor, tensor._version)
                self.runtime.hooks.replace(tensor_id, partial(register_grad_hook, tensor,
                                                              partial(self._on_grad, tensor_id)))

    def _deliver(self, key, grad) -> None:
        """A gradient has arrived: the core answers what waits for it. One read (not an edit) waiting, the common
        case, is answered here with the gradient: the core's delivery and `read`, written out (bench/phases.py)."""
        core = self.scheduler
        waiting = core.parked.get(key)
        if not waiting:
            return
        task, request = waiting[0]
        if len(waiting) > 1 or type(request) is not GradRead or self.runtime.rows is not None \
                or self.uses[request.use].write:
            core.deliver(key)
            return
        del core.parked[key]
        outer, core.cause = core.cause, request.use
        try:
            task.cause = request.use
            core._advance(task, grad, None, request.use)
        finally:
            core.cause = outer

    def _on_grad(self, tensor_id, grad):
        if not self.running or self.scheduler.in_statement:
            return None         # no pass of the cell's, or autograd called by a statement's own code
        key = (tensor_id, self.running[-1])
        self.grads[key] = grad
        self.live.add(key)
        try:
            self._deliver(("grad",) + key, grad)
        finally:
            self.live.discard(key)
        final = self.grads[key]
        self.sources[id(grad)] = self.sources[id(final)] = tensor_id
        if final is not grad:
            self.taken_over.append(grad)
        shapes = self.runtime.shapes
        for (module_id, kind), value in self.values.items():
            if kind == "output" and id(value) == tensor_id:
                shapes[(module_id, "grad")] = tuple(final.shape)
        return final if key in self.replaced else None
