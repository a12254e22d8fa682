"""Arguments of `nbgrad.trace` / `nbgrad.backward` (and so of the magics), and of a cell's `cache(...)`, checked before
anything runs: each wrong kind of argument is one clear message instead of a traceback from deep inside a run. The
run (run/caching.py) and a remote cell's check on the skeleton (remote/cachecheck.py) ask the same questions here."""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from ..errors import diagnose
from ..errors import ArgumentError, GradError, ModulePathError, NbgradError
from ..errors.naming import a_or_an, path_spellings
from .results.cache import matching_names

# What `cache(...)` takes (run/caching.py's start_cache): the modules by position or name, the rest by name
CACHE_OPTIONS = ("modules", "inputs", "grads", "device", "dtype")


def trace_arguments(model, namespace, tokenizer=None) -> None:
    tokenizer_argument(tokenizer)
    if not isinstance(model, nn.Module):
        raise ArgumentError(f"the model to trace is {_kind(model)}, not a torch.nn.Module: pass the module itself "
                            f"(e.g. `model = nbgrad.load_model()`)")
    if namespace is not None and not isinstance(namespace, dict):
        _check_namespace(namespace)


def edit_arguments(model, namespace, label) -> None:
    """`nbgrad.edit(model, source, namespace, label=...)`: a module, a dict of names, a label that is text."""
    trace_arguments(model, namespace)
    if not isinstance(label, str):
        raise ArgumentError(f"nbgrad.edit: label is {_kind(label)}, not a str: give the text that %nbgrad and the "
                            f"sidebar list the edit under (e.g. label=\"halve block 0\"), or leave it out")


def tokenizer_argument(tokenizer) -> None:
    """--tokenizer (tokenizer=): something that tokenizes text when called, as transformers' tokenizers do."""
    if tokenizer is not None and not callable(tokenizer):
        raise ArgumentError(f"--tokenizer (tokenizer=) is {_kind(tokenizer)}, not a tokenizer: give one that is "
                            f"called on text, e.g. transformers.AutoTokenizer.from_pretrained(...), or leave it out")


def remote_options(name, num_gpus, resources, runtime_env) -> None:
    """`nbgrad.remote(...)`'s keywords of the actor, each of the kind Ray takes, said before a cluster is asked."""
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ArgumentError(f"nbgrad.remote: name= is {_kind(name)}, not a name: give the text the model's actor is "
                            f"named by (another notebook attaches with nbgrad.remote(name=...)), or leave it out")
    if num_gpus is not None and (isinstance(num_gpus, bool) or not isinstance(num_gpus, (int, float)) or num_gpus < 0):
        raise ArgumentError(f"nbgrad.remote: num_gpus= is {_kind(num_gpus)}, not a number of GPUs: give how many "
                            f"GPUs the actor holds (e.g. num_gpus=1, or 0.5 to share one), or leave it out")
    for keyword, value in (("resources", resources), ("runtime_env", runtime_env)):
        if value is not None and not isinstance(value, dict):
            raise ArgumentError(f"nbgrad.remote: {keyword}= is {_kind(value)}, not a dict: give Ray's {keyword} "
                                f"as a dict, or leave it out")


RUNNERS = ("fast", "general")


def runner_argument(runner, over=None) -> None:
    """`runner=` names the statement kinds a run may use: "fast" (the compiler's choice) or "general"."""
    if runner not in RUNNERS:
        raise ArgumentError(f"runner={runner!r}: a run's runner is \"fast\" (the default: the statement kinds the "
                            f"compiler picks) or \"general\" (every statement resumed at its events)")
    if over is not None:
        raise ArgumentError(f"runner={runner!r} is for one run of a cell: a run over a dataset (over=) takes the "
                            f"default runner")


def run_options(over=None, runner: str = "fast", **given) -> None:
    """`trace`'s options that are not the defaults: a runner it knows, and what only a run over a dataset takes on
    one only."""
    if runner != "fast":
        runner_argument(runner, over)
    if over is None:
        dataset_options_alone(**given)


# What only a run over a dataset takes (--over / over=): keyword, option, what it is for
DATASET_OPTIONS = (("batch_size", "--batch-size", "how many examples run at a time"),
                   ("column", "--column", "the dataset's column of INPUTs"),
                   ("out", "--out", "the folder each batch's saved values are written to"),
                   ("engine", "--engine", "where the batches run"),
                   ("workers", "--workers", "how many Ray workers run them"),
                   ("model_factory", "--model-factory", "how each Ray worker makes its model"))
DATASET_DEFAULTS = {"batch_size": 8, "engine": "local"}


def dataset_options_alone(**given) -> None:
    """Refuse an option of a run over a dataset on a cell that runs once (no --over): it would do nothing."""
    for keyword, option, what in DATASET_OPTIONS:
        if given.get(keyword) is not None and given[keyword] != DATASET_DEFAULTS.get(keyword):
            raise ArgumentError(f"{option} ({keyword}=) is for a run over a dataset: it sets {what}. This cell runs "
                                f"once (it has no --over): add --over DATASET (over=), or drop {option}")


def backward_arguments(loss, namespace, grad_output=None) -> None:
    """LOSS a tensor, the namespace a dict, --grad-output a tensor of LOSS's shape."""
    _check_namespace(namespace)
    if not isinstance(loss, torch.Tensor):
        raise ArgumentError(f"LOSS is {_kind(loss)}, not a tensor: give the tensor to backpropagate from "
                            f"(e.g. `loss` or `logits.sum()`)")
    if grad_output is None:
        return
    if not isinstance(grad_output, torch.Tensor):
        raise ArgumentError(f"--grad-output (grad_output=) is {_kind(grad_output)}, not a tensor: give a tensor "
                            f"of LOSS's shape {tuple(loss.shape)}")
    if grad_output.shape != loss.shape:
        raise GradError(f"--grad-output (grad_output=) has shape {tuple(grad_output.shape)}, but LOSS has shape "
                        f"{tuple(loss.shape)}: the vector of a vector-Jacobian product has the shape of LOSS")


def loss_requires_grad(loss, namespace: dict, expression: str) -> None:
    """`%%backward EXPR` of a tensor that does not require grad: name the tensors EXPR is made of."""
    if isinstance(loss, torch.Tensor) and not loss.requires_grad:
        raise GradError(diagnose.loss_without_grad(loss, namespace, expression))


def namespace_argument(namespace) -> None:
    """The names of a cell: a dict, or None (the model alone)."""
    _check_namespace(namespace)


def _check_namespace(namespace) -> None:
    if namespace is not None and not isinstance(namespace, dict):
        raise ArgumentError(f"namespace is {_kind(namespace)}, not a dict: pass the dict of names the cell "
                            f"reads and binds (e.g. `globals()` or `{{'model': model}}`), or leave it out")


def _kind(value) -> str:
    text = repr(value)
    shown = f" `{text}`" if len(text) <= 40 else ""
    return "None" if value is None else f"{a_or_an(type(value).__name__)}{shown}"


def check_cache_call(args: tuple, kwargs: dict, line: int) -> None:
    """`cache(...)`'s arguments as the cell wrote them, refused with what it takes (not Python's message about
    nbgrad's own function)."""
    options = CACHE_OPTIONS
    takes = f"cache({options[0]}, *, {', '.join(f'{name}=...' for name in options[1:])})"
    if len(args) > 1:
        raise NbgradError(f"{takes} takes one argument by position, the modules (a glob, a module path, a module "
                          f"or a list of them); give the others by name", line)
    unknown = [name for name in kwargs if name not in options]
    if unknown:
        raise NbgradError(f"cache(...) has no option {unknown[0]!r}: it takes {takes}", line)
    if args and options[0] in kwargs:
        raise NbgradError(f"cache(...) was given {options[0]} twice, by position and by name", line)
    for flag in ("inputs", "grads"):
        if flag in kwargs and not isinstance(kwargs[flag], bool):
            raise NbgradError(f"cache({flag}=...) is True or False, not {kwargs[flag]!r}", line)


def cache_placement(device, dtype, line: int) -> None:
    """device= and dtype= are checked before the run, not when the first value is copied inside the model."""
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise NbgradError(f"cache(device={device!r}): not a device torch knows ('cpu', 'cuda', 'cuda:1', "
                              f"a torch.device)", line) from error
        try:
            torch.empty(0, device=device)           # a device this machine lacks: said now, not inside the model
        except (RuntimeError, AssertionError) as error:
            raise NbgradError(f"cache(device={device!r}): this machine cannot hold tensors there ({error})",
                              line) from error
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise NbgradError(f"cache(dtype={dtype!r}): give a torch.dtype (torch.float16, torch.bfloat16, ...)", line)


def matching_modules(model: nn.Module, modules, line: int) -> list:
    """[(path, module)] in model order for a glob, a path, a module, or a list of them."""
    named = list(model.named_modules())
    if isinstance(modules, nn.ModuleDict):
        modules = list(modules.values())
    # a ModuleList never runs itself: it stands for its modules, as a list of them does
    wanted = list(modules) if isinstance(modules, (list, tuple, set, nn.ModuleList, Iterator)) else [modules]
    chosen = set()
    for item in wanted:
        if isinstance(item, nn.Module):
            found = [name for name, module in named if module is item]
            if not found:
                raise ModulePathError(f"cache(...): {a_or_an(type(item).__name__)} that is not part of the traced "
                                      f"model", line)
        elif isinstance(item, str):
            found = matching_names([name for name, _ in named], item)
            if not found:
                raise ModulePathError(f"cache(...): no module of the model matches {item!r}"
                                      f"{diagnose.nearest_modules([n for n, _ in named], path_spellings(item)[-1])}",
                                      line)
        else:
            raise NbgradError(f"cache(modules=...) takes a glob, a module path, a module or a list of them, "
                              f"not {a_or_an(type(item).__name__)}", line)
        chosen.update(found)
    return [(name, module) for name, module in named if name in chosen]
