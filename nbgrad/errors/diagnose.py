"""Every user-facing explanation of what went wrong, in one place: short, with the remedy."""
from __future__ import annotations

import ast
import difflib

import torch
from torch import nn

from . import naming
from . import GradError, ModulePathError
from .naming import a_or_an
from .elements import made_in_a_loop, read_by_element


def nearest_modules(names: list, name: str) -> str:
    """The end of a 'no such module' message: the three module paths (`named_modules()` names) nearest `name`, or
    the model's top-level ones."""
    names = [n for n in names if n]
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    top = [n for n in names if "." not in n]
    return f"; nearest: {', '.join(near)}" if near else f"; its top-level modules: {', '.join(top[:6])}"


def module_path(model: nn.Module, module: nn.Module, root: str = "model") -> str | None:
    """`model.transformer.h[3]` for a submodule, or None when it is not part of the model."""
    for name, candidate in model.named_modules():
        if candidate is module:
            return naming.module_path(root, name)
    return None


def _steps(expr: ast.expr) -> list:
    """`model.transformer.h[12]` -> [Name model, Attribute transformer, Attribute h, Subscript 12]."""
    steps = []
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        steps.append(expr)
        expr = expr.value
    steps.append(expr)
    return steps[::-1]


def _explain_step(parent, step: ast.expr, parent_text: str, namespace: dict) -> str | None:
    if isinstance(step, ast.Subscript) and isinstance(parent, (nn.ModuleList, nn.Sequential)):
        count = len(parent)
        kind = "blocks" if isinstance(parent, nn.ModuleList) else "modules"
        span = f"0–{count - 1}" if count else "none"
        return f"{parent_text} has {count} {kind}, indices {span} (or -{count}–-1)"
    if isinstance(step, ast.Attribute) and isinstance(parent, nn.Module):
        children = [name for name, _ in parent.named_children()]
        near = difflib.get_close_matches(step.attr, children, n=3, cutoff=0.5)
        hint = f"; nearest: {', '.join(near)}" if near else f"; its submodules: {', '.join(children) or 'none'}"
        return f"{parent_text} ({type(parent).__name__}) has no submodule '{step.attr}'{hint}"
    if isinstance(step, ast.Subscript) and isinstance(parent, nn.ModuleDict):
        return f"{parent_text} has no key {ast.unparse(step.slice)}; its keys: {', '.join(parent.keys())}"
    return None


def module_path_error(use, namespace: dict, error: Exception) -> ModulePathError:
    """Say which step of a module path is not in the model, and what is there instead."""
    try:
        expr = ast.parse(use.target, mode="eval").body
    except SyntaxError:
        return ModulePathError(f"{use.target}.{use.kind}: {error}", use.line)
    steps = _steps(expr)
    try:
        value = eval(compile(ast.Expression(steps[0]), "<path>", "eval"), namespace)
        for depth, step in enumerate(steps[1:], start=1):
            parent_text = ast.unparse(steps[depth - 1])
            try:
                value = _apply(value, step, namespace)
            except (AttributeError, IndexError, KeyError, TypeError):
                explained = _explain_step(value, step, parent_text, namespace)
                if explained:
                    return ModulePathError(f"{ast.unparse(step)} is not in the model: {explained}", use.line)
                raise
    except Exception:
        pass
    return ModulePathError(f"{use.target}.{use.kind}: {type(error).__name__}: {error}", use.line)


def _apply(parent, step: ast.expr, namespace: dict):
    if isinstance(step, ast.Attribute):
        return getattr(parent, step.attr)
    index = eval(compile(ast.Expression(step.slice), "<path>", "eval"), namespace)
    return parent[index]


def never_ran(use, module, model, after_forward: bool, late: bool = False) -> str:
    target = f"{use.target}.{use.kind}"
    past_last = getattr(module, "past_last", None)     # `M.calls[k]` with k past M's last call (run/calls.py)
    if past_last is not None and (said := past_last(use)) is not None:
        return said
    if use.skip and not after_forward and not late:
        return (f"{use.target}(...) skipped nothing: {use.target.removesuffix('.skip')} never ran during this call "
                f"of the model")
    path = module_path(model, module) if model is not None and isinstance(module, nn.Module) else use.target
    if path is None:
        return f"{target}: {use.target} ({type(module).__name__}) is not part of the traced model"
    # a loop variable or a computed path: say which module it was
    who = use.target if path == use.target else f"{use.target} ({path}, {a_or_an(type(module).__name__)})"
    if after_forward:
        return (f"{target} was asked for after the model had finished its forward pass, and "
                f"{who} did not run after that: read it earlier, or save it")
    if late:
        return (f"{target} never came: the statement asked for it only while the model was already running, "
                f"after {who} had (most likely) run. nbgrad could not tell ahead of time which module "
                f"this expression names; write the path with constants, or read the modules in forward order")
    if path == use.target:
        return f"{target} never came: {who} never ran during this call of the model"
    return (f"{target} never came: {who} never ran during this call of the model. To read every module that "
            f"runs, leave out those that do not (an `if` in the loop), or use cache(...), which keeps what each "
            f"module the run called returned")


def site_not_reached(use, site: str) -> str:
    """A site whose forward ran in this call without reaching it: a branch not taken (or after a return)."""
    who = use.target if use.target.endswith(site.rsplit(".", 1)[1]) else f"{use.target} ({site})"
    return (f"{use.target}.{use.kind} never came: {who} never ran during this call of the model: its forward ran "
            f"without reaching it (a branch it did not take; `%source` shows each site's line)")


def too_late(use, cause) -> str:
    target = f"{use.target}.{use.kind}"
    if use.kind == "grad":
        what = f"the gradient of {use.target} has already flowed on to earlier layers"
    else:
        what = f"{use.target} has already run and later modules have used its {use.kind}"
    because = ""
    if cause is not None and (cause.target, cause.line) == (use.target, use.line) and use.kind == "grad":
        because = ("; the loop waited for another tensor's gradient first, and the backward pass went past this one "
                   "meanwhile: a loop that edits gradients must visit them in the order the pass computes them "
                   "(the last layer first)")
    elif cause is not None and (cause.target, cause.line) == (use.target, use.line):     # a loop, out of call order
        because = ("; the loop waited for this expression's event on another module first, and the model ran this "
                   "one meanwhile: a loop that edits must visit the modules in the order the model calls them "
                   "(not reversed(...))")
    elif cause is not None and (through := _names_between(use, cause)):
        because = (f"; the statement reads {through}, which line {cause.line} binds or changes, so it could only run "
                   f"once {cause.target}.{cause.kind} (line {cause.line}) existed")
        if made_in_a_loop(cause) and not use.skip:
            return f"{target} is edited too late: {what}{because}{read_by_element(use, cause, through)}"
    elif cause is not None:
        where = "this line" if cause.line == use.line else f"line {cause.line}"
        because = f"; the statement could only run once {cause.target}.{cause.kind} ({where}) existed"
    if use.skip:                  # `X.skip(v)`: v takes the place of X's call, so it must exist before that call
        module = use.target.removesuffix(".skip")
        return (f"{use.target}(...) comes too late: its value takes the place of the call of {module}, so it must "
                f"exist before {module} is called{because}. Skip with a value made earlier: what an earlier module "
                f"returned, or a tensor made before the cell")
    return f"{target} is edited too late: {what}{because}. Move the edit so it only needs earlier values"


def _names_between(use, cause) -> str:
    """`outs`: the names the statement of `use` reads that the (other) statement of `cause` binds or changes."""
    if cause.node is None or cause.node == use.node:
        return ""
    return ", ".join(f"`{name}`" for name in sorted(use.reads & cause.binds))


def no_backward_pass(use, mode: str) -> str:
    return (f"{use.target}.grad is read, but the cell runs no backward pass: add `loss.backward()` or "
            f"`with loss.backward():` to the cell, or use %%backward LOSS in a later cell")


def grad_of_module(use, value) -> str:
    what = "a site of a forward" if not isinstance(value, nn.Module) else f"a module ({type(value).__name__})"
    return (f"{use.target}.grad: {use.target} is {what}, which has no gradient of its own; the gradient into what "
            f"it returns is {use.target}.output.grad")


def _ran_without_grad(option: bool) -> tuple:
    """(how the cell came to run without autograd, the advice): under --no-grad, an option the user can drop, or
    under generation's own torch.no_grad() (`option` False), which has none."""
    if option:
        return "the cell ran under --no-grad / torch.no_grad()", "; drop --no-grad"
    return "the cell ran under torch.no_grad()", ""


def grad_not_required(use, no_grad: bool, option: bool = True) -> str:
    if no_grad:
        how, advice = _ran_without_grad(option)
        return f"{use.target}.grad: {how}, so nothing records gradients{advice}"
    return (f"{use.target}.grad: {use.target} does not require grad, so no gradient flows into it; "
            f"call {use.target}.requires_grad_(True) before the loss is computed")


def grad_never_computed(use, tensor: torch.Tensor, backward_pass, late: bool = False) -> str:
    if late:
        return (f"{use.target}.grad never came: the statement asked for it only while the backward pass of line "
                f"{backward_pass.line} was running, after that gradient had (most likely) flowed past. nbgrad "
                f"could not tell before the pass which tensor `{use.target}` names; bind it to a name or a list "
                f"before the backward line")
    base = (f"{use.target}.grad was never computed by the backward pass of line {backward_pass.line} "
            f"({backward_pass.source}): the loss does not depend on {use.target}")
    made_by = type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else ""
    if made_by == "CopySlices" or made_by.startswith("AsStrided"):
        return base      # edited in place: how it was made says nothing about the loss
    if made_by.startswith(("Select", "Slice", "Index", "Unbind", "Split")):
        base += (f". {use.target} is a slice taken after the fact: slicing makes a new tensor that the loss "
                 f"never used. Read .grad of the tensor itself, then slice the gradient: for {use.target} = "
                 f"M.output[0], write M.output.grad[0]")
    elif tensor._base is not None:
        base += (f". {use.target} is a view made from another tensor after the fact; read .grad of the "
                 f"tensor itself")
    return base


def backward_never_ran(use, backward_pass) -> str:
    return (f"{use.target}.grad waits for the backward pass of line {backward_pass.line} "
            f"({backward_pass.source}), which never ran")


def second_backward(backward_pass, freed_by=None) -> str:
    """`freed_by`: the pass of this cell that ran last without keeping its graph, when there is one."""
    if freed_by is None or freed_by is backward_pass:
        return ("backward through the same graph a second time: its buffers were freed by an earlier pass. "
                "Pass retain_graph=True to the first backward (--retain-graph on %%backward)")
    return (f"backward through the same graph a second time: the backward pass of line {freed_by.line} "
            f"({freed_by.source}) ran before this one and freed its buffers. Pass retain_graph=True to "
            f"that backward (--retain-graph on %%backward)")


def check_loss(loss: torch.Tensor, backward_pass, args, kwargs, no_grad: bool, namespace: dict,
               model, option: bool = True) -> None:
    """Refuse a backward pass that cannot work, saying why and what to do (`option`: as in `_ran_without_grad`)."""
    gradient_given = bool(args) or kwargs.get("gradient") is not None or kwargs.get("grad_tensors") is not None
    if loss.numel() != 1 and not gradient_given:
        raise GradError(
            f"the loss has shape {tuple(loss.shape)}, not a scalar: backward needs a scalar, or the vector of a "
            f"vector-Jacobian product. Reduce it (`.sum()` or `.mean()`), or give that vector: "
            f"--grad-output V on %%backward, gradient=V in .backward()", backward_pass.line or None)
    if not loss.requires_grad:
        expression = backward_pass.source if backward_pass.line else ""
        raise GradError(_no_grad_reason(no_grad, namespace, model, loss, expression, option),
                        backward_pass.line or None)


_NO_GRAD_HEAD = "the loss does not require grad, so there is nothing to backpropagate"


def _no_grad_reason(no_grad: bool, namespace: dict, model, loss, expression: str, option: bool = True) -> str:
    if no_grad or not torch.is_grad_enabled():
        how, advice = _ran_without_grad(option)
        return f"{_NO_GRAD_HEAD}: {how}{advice}"
    if model is not None and not any(p.requires_grad for p in model.parameters()):
        return (f"{_NO_GRAD_HEAD}: no parameter of the model requires grad (all are frozen) and no traced value "
                f"was marked; call .requires_grad_(True) on the output you want gradients from")
    return loss_without_grad(loss, namespace, expression)


def loss_without_grad(loss: torch.Tensor, namespace: dict, expression: str = "") -> str:
    """Why `loss` does not require grad. Such a tensor has no grad_fn: autograd recorded nothing it was
    made from, so the loss is itself the leaf. What can be named is what the loss expression reads."""
    if not torch.is_grad_enabled():
        return f"{_NO_GRAD_HEAD}: grad mode is off here (torch.no_grad() / torch.set_grad_enabled(False))"
    read = _tensors_read(expression, namespace)
    own = [name for name, value in read if value is loss] or [naming.tensor_names(namespace).get(id(loss))]
    lacking = [name for name, value in read if value is not loss and not value.requires_grad]
    elsewhere = [name for name, value in read if getattr(value, "nbgrad_kept", None)]
    if elsewhere:
        return (f"{_NO_GRAD_HEAD}: {elsewhere[0]} came back from a remote model's cell, and its autograd graph stays "
                f"on the model's actor: `%%backward {elsewhere[0]}` runs the pass there, but a value computed from it "
                f"here has no graph: compute the loss in the remote cell, .save() it, and %%backward that name")
    ways = ("made without requires_grad=True, or computed under torch.no_grad() / --no-grad, through "
            ".detach(), or only from tensors that do not require grad")
    if lacking:
        verb = "has" if len(lacking) == 1 else "have"
        return (f"{_NO_GRAD_HEAD}: it is computed from {', '.join(lacking[:6])}, which {verb} requires_grad=False; "
                f"create {'it' if len(lacking) == 1 else 'them'} with requires_grad=True (or call .requires_grad_())")
    if any(value.requires_grad for _, value in read):
        return (f"{_NO_GRAD_HEAD}: what it is computed from requires grad, but the loss has no grad_fn: it was "
                f"computed under torch.no_grad() / --no-grad or through .detach(); compute it with grad enabled")
    what = f"{own[0]} is" if own[0] else "the loss itself is"
    return f"{_NO_GRAD_HEAD}: {what} a tensor that does not require grad (it has no grad_fn): it was {ways}"


def _tensors_read(expression: str, namespace: dict) -> list:
    """(name, tensor) for each name the expression reads that holds a tensor, in order, once each."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return []
    found = {}
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Name)), key=lambda n: n.col_offset):
        value = namespace.get(node.id)
        if isinstance(value, torch.Tensor):
            found.setdefault(node.id, value)
    return list(found.items())
