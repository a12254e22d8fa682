"""Run a compiled Program on a model: hooks on exactly the events the graph names, each node resumed
when what it waits for exists, every hook removed and every flag restored in `finally`."""
from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch
from torch import nn

from . import diagnose
from .compiler import RUNTIME_NAME, Program
from .models import parameters_of
from .errors import GradError, OrderError, for_the_cell

_active: list = []          # runtimes now running (nested traces are possible)


def active_runtime():
    return _active[-1] if _active else None


@dataclass
class Result:
    """What a cell leaves behind: saved values by name, the hook graph, shapes of what was traced."""
    saved: dict
    graph: object
    shapes: dict = field(default_factory=dict)       # (id(module), "output" | "grad") -> shape, for the sidebar
    leaf_grads: dict = field(default_factory=dict)   # %%backward: leaf name -> its .grad
    accumulated: set = field(default_factory=set)    # leaf names whose .grad held a value before
    grad_pairs: dict = field(default_factory=dict)   # saved gradient name -> name of its tensor
    input_ids: object = None

    def __getitem__(self, name):
        return self.saved[name]


class _Task:
    __slots__ = ("node", "gen", "cause")

    def __init__(self, node, gen, cause):
        self.node, self.gen, self.cause = node, gen, cause


class Runtime:
    """One run of one cell. Create, call `run_trace` or `run_backward`, discard."""

    def __init__(self, program: Program, namespace: dict, model: nn.Module | None = None,
                 no_grad: bool = False):
        self.program = program
        self.model = model
        self.no_grad = no_grad
        self.ns = namespace
        self.before = {name: namespace.get(name, _MISSING) for name in program.bound_names}
        self.outer_runtime = namespace.get(RUNTIME_NAME, _MISSING)
        namespace[RUNTIME_NAME] = self
        namespace.setdefault("__builtins__", __builtins__)
        self.unstarted = [n for n in program.nodes]
        self.done = set()
        self.tasks: list = []
        self.parked: dict = {}           # event key -> [(task, request)]
        self.values: dict = {}           # forward key -> value of the latest firing
        self.live: set = set()           # forward keys whose hook is running now
        self.handles: dict = {}          # forward key or tensor id -> RemovableHandle
        self.grads: dict = {}            # (tensor id, pass) -> gradient
        self.live_grads: set = set()
        self.replaced_grads: set = set()
        self.pass_state = ["pending"] * len(program.graph.passes)
        self.running_passes: list = []
        self.forward_done = False
        self.model_running = False
        self.late_hooks: set = set()     # hooks first asked for while the model was already running
        self.late_grads: set = set()     # gradient hooks first asked for while their pass was running
        self.cause = None                # use id of the event being delivered now
        self.saved: dict = {}            # id -> (label, value, line)
        self.grad_sources: dict = {}     # id(gradient) -> the tensor it flowed into
        self.shapes: dict = {}

    # --- entry points ---------------------------------------------------------------------------

    def run_trace(self, call_args: tuple, call_kwargs: dict) -> Result:
        def body():
            self._register_static_hooks()
            self.start_ready()
            self.model_running = True
            self.model(*call_args, **call_kwargs)
            self.model_running = False
            self.forward_done = True
            self.start_ready()
        return self._run(body)

    def run_backward(self, loss, grad_output=None, retain_graph=False, create_graph=False) -> Result:
        def body():
            self.forward_done = True
            kwargs = {"retain_graph": retain_graph or None, "create_graph": create_graph}
            if grad_output is not None:
                kwargs["gradient"] = grad_output
            self._handle_backward(None, ("backward", loss, 0, [], kwargs, True))
        return self._run(body)

    def _run(self, body) -> Result:
        __tracebackhide__ = True
        grad_mode = torch.is_grad_enabled()
        flags = _parameter_flags(self.model) if self.model is not None else []
        _active.append(self)
        try:
            with torch.set_grad_enabled(grad_mode and not self.no_grad):
                body()
                self._check_finished()
            saved = self._saved_by_name()
            return Result(saved=saved, graph=self.program.graph, shapes=self.shapes,
                          grad_pairs=self._grad_pairs(saved))
        except BaseException as error:
            raise for_the_cell(error)
        finally:
            _active.remove(self)
            torch.set_grad_enabled(grad_mode)
            for param, flag in flags:
                if param.requires_grad != flag:
                    param.requires_grad_(flag)
            self._cleanup()

    # --- scheduling -----------------------------------------------------------------------------

    def _ready(self, node) -> bool:
        spec = node.spec
        if spec.block is not None and self.pass_state[spec.block] == "pending":
            return False
        return all(dep in self.done for dep in spec.deps)

    def start_ready(self) -> None:
        """Start, in source order, every node whose dependencies have finished."""
        progressed = True
        while progressed:
            progressed = False
            for node in self.unstarted:
                if self._ready(node):
                    self.unstarted.remove(node)
                    task = _Task(node, types.FunctionType(node.code, self.ns)(), self.cause)
                    self.tasks.append(task)
                    self._advance(task, None)
                    progressed = True
                    break

    def _advance(self, task: _Task, value) -> None:
        send = task.gen.send
        while True:
            try:
                request = send(value)
            except StopIteration:
                request = None      # finish outside the handler, so later errors chain to nothing
            if request is None:
                self.done.add(task.node.spec.index)
                self.tasks.remove(task)
                self.start_ready()
                return
            answered, value = self._dispatch(task, request)
            if not answered:
                return

    def _dispatch(self, task, request):
        op = request[0]
        if op == "read":
            return self._handle_read(task, request)
        if op == "write":
            return self._handle_write(task, request)
        if op == "grad":
            return self._handle_grad(task, request)
        if op == "set_grad":
            return self._handle_set_grad(task, request)
        return self._handle_backward(task, request)

    def _park(self, key, task, request) -> tuple:
        self.parked.setdefault(key, []).append((task, request))
        return False, None

    def _deliver(self, key, cause) -> None:
        waiting = self.parked.pop(key, None)
        if not waiting:
            return
        outer, self.cause = self.cause, cause
        try:
            if len(waiting) > 1:
                waiting.sort(key=lambda pair: pair[0].node.spec.index)
            for task, request in waiting:
                task.cause = cause
                answered, value = self._dispatch(task, request)
                if answered:
                    self._advance(task, value)
        finally:
            self.cause = outer

    # --- forward events -------------------------------------------------------------------------

    def _resolve(self, thunk, use_id):
        try:
            return thunk()
        except (AttributeError, IndexError, KeyError, TypeError) as error:
            use = self.program.uses[use_id]
            raise diagnose.module_path_error(use, self.ns, error) from error

    def _handle_read(self, task, request):
        _, thunk, use_id = request
        module = self._resolve(thunk, use_id)
        use = self.program.uses[use_id]
        if not isinstance(module, nn.Module):
            return True, getattr(module, use.kind)
        key = (id(module), use.kind)
        if key in self.values:
            if use.write and key not in self.live:
                raise self._too_late(task, use)
            return True, self.values[key]
        return self._wait_for(module, key, task, request, use)

    def _handle_write(self, task, request):
        _, thunk, use_id, value = request
        module = self._resolve(thunk, use_id)
        use = self.program.uses[use_id]
        if not isinstance(module, nn.Module):
            setattr(module, use.kind, value)
            return True, None
        key = (id(module), use.kind)
        if key in self.live:
            self.values[key] = value
            return True, None
        if key in self.values:
            raise self._too_late(task, use)
        return self._wait_for(module, key, task, request, use)

    def _wait_for(self, module, key, task, request, use):
        if self.forward_done:
            raise OrderError(diagnose.never_ran(use, module, self.model, after_forward=True), use.line)
        hooked_now = self._hook(module, use.kind)
        if hooked_now and self.model_running:
            self.late_hooks.add(key)
        return self._park(key, task, request)

    def _too_late(self, task, use) -> OrderError:
        return OrderError(diagnose.too_late(use, self.program.uses[task.cause] if task.cause is not None
                                            else None), use.line)

    def _register_static_hooks(self) -> None:
        for kind, _, code in self.program.static_targets:
            try:
                module = eval(code, self.ns)
            except Exception:
                continue      # the statement itself will report it, on its own line
            if isinstance(module, nn.Module):
                self._hook(module, kind)
        for kind, _, code in self.program.candidate_targets:
            try:
                container = eval(code, self.ns)
            except Exception:
                continue
            if isinstance(container, nn.Module):
                for child in container.children():
                    self._hook(child, kind)

    def _hook(self, module: nn.Module, kind: str) -> bool:
        """Hook one event of a module; True when the hook is new."""
        key = (id(module), "output" if kind == "output" else "input")
        if key in self.handles:
            return False
        if kind == "output":
            def on_output(mod, args, output, key=(id(module), "output")):
                return self._on_event(key, output)
            self.handles[key] = module.register_forward_hook(on_output)
        else:
            def on_input(mod, args, kwargs, module_id=id(module)):
                return self._on_input(module_id, args, kwargs)
            self.handles[key] = module.register_forward_pre_hook(on_input, with_kwargs=True)
        return True

    def _on_event(self, key, value):
        self.values[key] = value
        self.live.add(key)
        try:
            self._deliver(key, self._first_use(key))
        finally:
            self.live.discard(key)
        new = self.values[key]
        if _has_shape(new):
            self.shapes[key] = tuple(new.shape)
        return new if new is not value else None

    def _on_input(self, module_id, args, kwargs):
        new_pair = self._on_event((module_id, "inputs"), (args, kwargs))
        if new_pair is not None:
            args, kwargs = new_pair
        first = args[0] if args else next(iter(kwargs.values()), None)
        new_first = self._on_event((module_id, "input"), first)
        if new_first is not None:
            if args:
                args = (new_first,) + tuple(args[1:])
            else:
                kwargs = {**kwargs, next(iter(kwargs)): new_first}
        if new_pair is None and new_first is None:
            return None
        return tuple(args), kwargs

    def _first_use(self, key):
        """The use id that an event answers first: the cause named when a later write comes too late."""
        waiting = self.parked.get(key)
        return waiting[0][1][2] if waiting else None

    # --- gradients ------------------------------------------------------------------------------

    def _handle_grad(self, task, request):
        _, tensor, use_id, pass_index = request
        use = self.program.uses[use_id]
        if not isinstance(tensor, torch.Tensor):
            return True, tensor.grad
        if pass_index is None:
            raise GradError(diagnose.no_backward_pass(use, self.program.mode), use.line)
        gkey = (id(tensor), pass_index)
        if gkey in self.grads:
            if gkey in self.live_grads:
                if use.write and gkey not in self.replaced_grads:
                    self.grads[gkey] = self.grads[gkey].clone()
                    self.replaced_grads.add(gkey)
                return True, self.grads[gkey]
            if use.write:
                raise self._too_late(task, use)
            return True, self.grads[gkey]
        if self.pass_state[pass_index] == "done":
            if (tensor.is_leaf or tensor.retains_grad) and tensor.grad is not None and not use.write:
                return True, tensor.grad
            raise GradError(diagnose.grad_never_computed(use, tensor, self.program.graph.passes[pass_index]),
                            use.line)
        if not tensor.requires_grad:
            raise GradError(diagnose.grad_not_required(use, self.no_grad or not torch.is_grad_enabled()),
                            use.line)
        if self._grad_hook(tensor) and self.pass_state[pass_index] == "running":
            self.late_grads.add(gkey)
        return self._park(("grad",) + gkey, task, request)

    def _handle_set_grad(self, task, request):
        _, tensor, use_id, pass_index, value = request
        use = self.program.uses[use_id]
        if not isinstance(tensor, torch.Tensor):
            tensor.grad = value
            return True, None
        gkey = (id(tensor), pass_index) if pass_index is not None else None
        if gkey in self.live_grads:
            self.grads[gkey] = value
            self.replaced_grads.add(gkey)
            return True, None
        if gkey is None or gkey in self.grads or self.pass_state[pass_index] == "done":
            if pass_index is None or self.pass_state[pass_index] == "done":
                # Outside any pass this is the plain attribute, as in PyTorch.
                tensor.grad = value
                return True, None
            raise self._too_late(task, use)
        self._grad_hook(tensor)
        return self._park(("grad",) + gkey, task, request)

    def _hook_known_grads(self, pass_index: int) -> None:
        """Hook every `T.grad` of this pass whose T already exists, before any gradient arrives, so
        statements may read gradients in any order."""
        for target_pass, kind, every_element, code in self.program.grad_targets:
            if target_pass != pass_index:
                continue
            try:
                value = eval(code, self.ns)
            except Exception:
                continue        # the statement itself will say what is wrong, on its own line
            candidates = _elements(value) if every_element else [value]
            for candidate in candidates:
                if kind is not None:
                    candidate = self.values.get((id(candidate), kind))
                if isinstance(candidate, torch.Tensor) and candidate.requires_grad:
                    self._grad_hook(candidate)

    def _grad_hook(self, tensor: torch.Tensor) -> bool:
        """Hook the gradient of a tensor; True when the hook is new."""
        tensor_id = id(tensor)
        if tensor_id in self.handles:
            return False
        def on_grad(grad, tensor_id=tensor_id):
            return self._on_grad(tensor_id, grad)
        self.handles[tensor_id] = tensor.register_hook(on_grad)
        return True

    def _on_grad(self, tensor_id, grad):
        if not self.running_passes:
            return None
        gkey = (tensor_id, self.running_passes[-1])
        self.grads[gkey] = grad
        self.live_grads.add(gkey)
        try:
            self._deliver(("grad",) + gkey, self._first_use(("grad",) + gkey))
        finally:
            self.live_grads.discard(gkey)
        final = self.grads[gkey]
        self.grad_sources[id(grad)] = self.grad_sources[id(final)] = tensor_id
        for (module_id, kind), value in self.values.items():
            if kind == "output" and id(value) == tensor_id:
                self.shapes[(module_id, "grad")] = tuple(final.shape)
        return final if gkey in self.replaced_grads else None

    def _handle_backward(self, task, request):
        _, target, pass_index, args, kwargs, _block = request
        backward_pass = self.program.graph.passes[pass_index]
        loss, args = (args[0], args[1:]) if target is torch.autograd else (target, args)
        if not isinstance(loss, torch.Tensor):
            return True, target.backward(*args, **kwargs)
        diagnose.check_loss(loss, backward_pass, args, kwargs, self.no_grad, self.ns, self.model)
        self.pass_state[pass_index] = "running"
        self.running_passes.append(pass_index)
        self._hook_known_grads(pass_index)
        self.start_ready()
        try:
            if target is torch.autograd:
                torch.autograd.backward(loss, *args, **kwargs)
            else:
                loss.backward(*args, **kwargs)
        except RuntimeError as error:
            if "second time" in str(error):
                raise GradError(diagnose.second_backward(backward_pass), backward_pass.line) from error
            raise
        finally:
            self.running_passes.pop()
            self.pass_state[pass_index] = "done"
        for key in [k for k in self.parked if k[0] == "grad" and k[2] == pass_index]:
            waiting_task, waiting_request = self.parked[key][0]
            tensor = waiting_request[1]
            use = self.program.uses[waiting_request[2]]
            late = (id(tensor), pass_index) in self.late_grads
            raise GradError(diagnose.grad_never_computed(use, tensor, backward_pass, late), use.line)
        self.start_ready()
        return True, None

    # --- end of the cell ------------------------------------------------------------------------

    def _check_finished(self) -> None:
        if not self.parked:
            return
        waits = sorted(((request, task) for entries in self.parked.values() for task, request in entries),
                       key=lambda pair: pair[1].node.spec.index)
        request, task = waits[0]
        use = self.program.uses[request[2]]
        if request[0] in ("grad", "set_grad"):
            backward_pass = self.program.graph.passes[request[3]]
            raise GradError(diagnose.backward_never_ran(use, backward_pass), use.line)
        module = self._resolve(request[1], request[2])
        late = (id(module), use.kind) in self.late_hooks
        raise OrderError(diagnose.never_ran(use, module, self.model, after_forward=False, late=late), use.line)

    def save(self, value, line=None, label=None):
        self.saved[id(value)] = (label or f"line {line}", value, line or 0)
        return value

    def _saved_by_name(self) -> dict:
        """Saved values in the order they were saved, under the name the cell bound them to."""
        names = self._bound_names_by_id()
        for name in sorted(self.program.bound_names):   # then elements: `hidden = [... .save() for ...]`
            value = self.ns.get(name, _MISSING)
            if isinstance(value, (list, tuple)):
                for index, element in enumerate(value):
                    names.setdefault(id(element), f"{name}[{index}]")
            elif isinstance(value, dict):
                for key, element in value.items():
                    names.setdefault(id(element), f"{name}[{key!r}]")
        in_source_order = sorted(self.saved.items(), key=lambda item: item[1][2])
        by_name = {}
        for value_id, (label, value, _) in in_source_order:
            name = names.get(value_id, label)
            if name in by_name:           # one line saved several values (a loop): number them
                name = f"{name} #{sum(1 for k in by_name if k.split(' #')[0] == name) + 1}"
            by_name[name] = value
        return by_name

    def _bound_names_by_id(self) -> dict:
        """id(value) -> the name the cell bound it to (the first name, alphabetically, when several)."""
        names = {}
        for name in sorted(self.program.bound_names):
            names.setdefault(id(self.ns.get(name, _MISSING)), name)
        return names

    def _grad_pairs(self, saved: dict) -> dict:
        """Which saved values are gradients, and the name of the tensor each flowed into."""
        if not self.grad_sources:
            return {}
        names = {id(value): name for name, value in saved.items()}
        for value_id, name in self._bound_names_by_id().items():
            names.setdefault(value_id, name)
        pairs = {}
        for name, value in saved.items():
            source = self.grad_sources.get(id(value))
            if source is not None and source in names:
                pairs[name] = names[source]
        return pairs

    def _write_back(self) -> None:
        """Unbind the traced values the body bound but did not save; remember their names."""
        unsaved = self.ns.setdefault(UNSAVED_KEY, set())
        saved_ids = self.saved.keys()
        for name, before in self.before.items():
            value = self.ns.get(name, _MISSING)
            if value is _MISSING or value is before or not _holds_unsaved(value, saved_ids):
                unsaved.discard(name)
            else:
                del self.ns[name]
                unsaved.add(name)

    def _cleanup(self) -> None:
        for handle in self.handles.values():
            handle.remove()
        for task in self.tasks:
            task.gen.close()
        self._write_back()
        if self.outer_runtime is _MISSING:
            self.ns.pop(RUNTIME_NAME, None)
        else:
            self.ns[RUNTIME_NAME] = self.outer_runtime
        for store in (self.handles, self.parked, self.values, self.grads, self.before, self.grad_sources):
            store.clear()
        self.tasks.clear()
        self.unstarted.clear()


UNSAVED_KEY = "__nbgrad_unsaved__"
_MISSING = object()


def _elements(container) -> list:
    if isinstance(container, (dict, nn.ModuleDict)):
        return list(container.values())
    if isinstance(container, (list, tuple, nn.ModuleList, nn.Sequential)):
        return list(container)
    return []


def _parameter_flags(model: nn.Module) -> list:
    return [(param, param.requires_grad) for param in parameters_of(model)]


def _has_shape(value) -> bool:
    return isinstance(value, torch.Tensor)


def _holds_unsaved(value, saved_ids, depth: int = 0) -> bool:
    """Is this a tensor (or a container of tensors) from the trace that was not saved?"""
    if id(value) in saved_ids or isinstance(value, nn.Parameter):
        return False
    if isinstance(value, torch.Tensor):
        return True
    if depth > 2 or isinstance(value, (str, bytes, nn.Module)):
        return False
    if isinstance(value, dict):
        return any(_holds_unsaved(v, saved_ids, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple, set)):
        return any(_holds_unsaved(v, saved_ids, depth + 1) for v in value)
    return False
