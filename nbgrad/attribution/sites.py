"""Sites: modules whose output is attributed or patched. Finding them by path or glob, reading and
replacing their output with plain forward hooks, and running the model in eval mode."""
from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch
from torch import nn

from ..errors import InputError, ModulePathError, diagnose
from ..engine.results.cache import matching_any
from ..errors.naming import a_or_an, path_spellings


def resolve(model: nn.Module, path) -> tuple:
    """(name, module) for a module path (negative block indices count from the end) or a module."""
    if isinstance(path, nn.Module):
        name = next((n for n, m in model.named_modules() if m is path and n), None)
        if name is None:
            raise ModulePathError(f"site is {a_or_an(type(path).__name__)} that is not a module of the model")
        return name, path
    if not isinstance(path, str):
        raise InputError(f"site is {a_or_an(type(path).__name__)}: give one module path ('transformer.h.3') or "
                         f"a module of the model")
    spellings = path_spellings(path)
    for name in spellings:                  # as written, then without the notebook's `model.` in front
        module = _walk(model, name)
        if module is not None:
            return next((n for n, m in model.named_modules() if m is module), name), module
    raise ModulePathError(f"site '{path}' is not in the model{_nearest(model, spellings[-1])}")


def _walk(model: nn.Module, name: str):
    """The module at a dotted path, or None; negative block indices count from the end."""
    module = model
    for part in [p for p in name.split(".") if p]:
        child = None
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and part.lstrip("-").isdigit():
            index = int(part)
            child = module[index] if -len(module) <= index < len(module) else None
        elif part in module._modules:
            child = module._modules[part]
        if child is None:
            return None
        module = child
    return module


def matching(model: nn.Module, sites) -> list:
    """[(name, module)] in model order whose name matches the glob(s) in `sites` (fnmatch: `*` also
    crosses dots, so "transformer.h.*" is every module inside the blocks). The root is never a site."""
    patterns = [sites] if isinstance(sites, str) else list(sites)
    chosen = matching_any([name for name, _ in model.named_modules() if name], patterns)
    if not chosen:
        shown = ", ".join(repr(path_spellings(p)[-1]) for p in patterns)
        raise ModulePathError(f"no module of the model matches sites={shown}"
                              f"{_nearest(model, path_spellings(patterns[0])[-1])}")
    return [(name, module) for name, module in model.named_modules() if name in chosen]


def _nearest(model: nn.Module, name: str) -> str:
    return diagnose.nearest_modules([n for n, _ in model.named_modules()], name)


def main_tensor(output):
    """The tensor a site's output stands for: the output itself, or the first element of a tuple,
    list or ModelOutput. None when there is none."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if isinstance(output, Mapping) and output:
        first = next(iter(output.values()))
        return first if isinstance(first, torch.Tensor) else None
    return None


def with_main_tensor(output, tensor: torch.Tensor):
    """`output` with its main tensor replaced by `tensor` (same container type)."""
    if isinstance(output, torch.Tensor):
        return tensor
    if isinstance(output, tuple):
        return (tensor,) + tuple(output[1:])
    if isinstance(output, list):
        return [tensor] + list(output[1:])
    key = next(iter(output.keys()))
    replaced = output.__class__(**output)
    replaced[key] = tensor
    return replaced


@contextlib.contextmanager
def hooked(pairs):
    """Register `(module, forward_hook)` pairs; every handle is removed on the way out, errors included."""
    handles = []
    try:
        for module, hook in pairs:
            handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


def replacing(module: nn.Module, make):
    """A forward hook pair whose first call of `module` returns `make(main_tensor)` as the main tensor."""
    fired = []

    def hook(_module, _inputs, output):
        if fired:
            return None
        fired.append(True)
        return with_main_tensor(output, make(main_tensor(output)))
    return module, hook


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Run in eval mode (no dropout: identical inputs give identical activations); restore every
    module's own mode afterwards."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def logits_of(output) -> torch.Tensor:
    """What a metric reads: `.logits` of a ModelOutput, or the main tensor of any other output."""
    logits = getattr(output, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else main_tensor(output)
