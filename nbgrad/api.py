"""`nbgrad.trace` and `nbgrad.backward`: the engine behind the magics, for scripts and tests."""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from . import models
from .engine.compile.compiler import compile_cell
from .engine.compile.editable import check_edit, edit_mode
from .engine.compile.helpers import compile_with_helpers
from .engine.compile.pasted import NAME as TRACER, rewritten
from .engine.compile.sourcetext import check_source
from .engine.compile.unroll import NeedsElements
from .engine import checks
from .engine.results.cache import Cache
from .engine.results.result import Result
from .engine.listing import listing
from .engine.edit.edits import Edit, install, names_read
from .engine.edit.editstack import stack_on
from .engine.moduletree import compiled_inner
from .engine.run.runtime import Runtime, active_runtime
from .errors import GradError, NbgradError
from .errors.options import checked_options, options_of, unknown_option
from .errors.naming import a_or_an, tensor_names
from .models.cell import call_options, default_namespace
from .models.inputs import call_arguments, input_ids_of
from .models.loading import remember
from .models.prepare import prepared
from .models.skeleton import on_skeleton
from .models.wrongcall import note_input
from .names import rewrite_of
from .names.misspelt import hint_root_misspelling, root_misspelling_hinted
from .names.rewrite import eager_attention, in_cell_words, mentions, wrap_caches
from .views.cache import CachePanel

Cache.panel = CachePanel      # a Cache shown on its own draws its panel (the engine imports no view)

_MISSING = object()


# `nbgrad.trace(..., over=DATASET)`: nbgrad.datasets, which sits on top of this module, puts its runner here
dataset_runner: list = []
# `trace`'s options that a run checks only when one differs: batch_size, out, engine, workers, column, model_factory, runner
_DEFAULTS = (8, None, "local", None, None, None, "fast")


def trace(model: nn.Module, input, source: str, namespace: dict | None = None, *, no_grad: bool = False,
          tokenizer=None, graph: bool = False, quiet: bool = True, over=None, batch_size: int = 8, out=None,
          engine: str = "local", workers: int | None = None, column: str | None = None, model_factory=None,
          progress: bool = True, runner: str = "fast", _aliased: bool = False, **_unknown) -> Result:
    """Run `source` (the body of a `%%trace` cell) on `model` called with `input`; per example with `over=`."""
    if _unknown or not isinstance(model, nn.Module) and hasattr(model, "nbgrad_trace"):   # a model elsewhere
        return _elsewhere(model, input, source, namespace, call_options(locals()))
    if TRACER in check_source(source, "nbgrad.trace"):    # pasted nnsight code: `tracer.cache(...)` (compile/pasted.py)
        source = rewritten(source, namespace)
    if not _aliased and mentions[source]:      # canonical names (nbgrad/names): the model's own paths
        return _canonical_trace(model, input, source, namespace, **_options(locals()))
    if (batch_size, out, engine, workers, column, model_factory, runner) != _DEFAULTS:
        checks.run_options(**_options(locals()))     # a runner known; options of --over only on a run over a dataset
    if over is not None:
        return dataset_runner[0](model, input, source, namespace, **_options(locals()))
    if not isinstance(model, nn.Module) or (namespace is not None and not isinstance(namespace, dict)) or \
            (tokenizer is not None and not callable(tokenizer)):
        checks.trace_arguments(model, namespace, tokenizer)
    try:
        program = compile_cell(source, "trace")
    except NeedsElements:        # a loop that makes invokes: unrolled over its elements in the notebook's names
        program = compile_with_helpers(source, "trace", namespace := default_namespace(namespace, model))
    if program.called_names and namespace is not None:
        program = compile_with_helpers(source, "trace", namespace)
    if graph:
        return Result(saved={}, graph=program.graph)
    namespace = default_namespace(namespace, model) if namespace is None else namespace
    if type(input) is torch.Tensor and not program.invokes and type(model).__name__ != "OptimizedModule":
        remember(model)          # ids on an eager model: all that model_to_trace does, and no tokenizer needed
        (args, kwargs), values, rows = call_arguments(input, model, tokenizer), [], None
        ids = None if args[0].is_floating_point() else args[0]       # input_ids_of, written out
    else:
        model, args, kwargs, values, rows = prepared(program, model, input, tokenizer, namespace)
        ids = input_ids_of(args, kwargs)
    try:
        result = Runtime(program, namespace, model, no_grad, rows, fast=runner == "fast").run_trace(args, kwargs)
    except (AttributeError, TypeError) as error:    # the model's own error over a plain INPUT; a misspelt root name
        raise hint_root_misspelling(note_input(error, input, args, kwargs), model, source, namespace)
    result.input_ids, result.invokes = ids, values
    return result


def source(target):
    """The source of a module's forward (or of a Python function) with each site's name beside its line, as
    `M.source.NAME` takes it in a cell (`%source M`). A remote model's module is listed from the notebook's
    skeleton; `.names` holds the site names in source order."""
    return listing(on_skeleton(target))


def _elsewhere(model, input, source, namespace, options: dict):
    """`trace` given a keyword it does not take (one message, before anything runs), or a model elsewhere: every
    option to it."""
    unknown = options.pop("_unknown")
    if unknown:
        raise unknown_option("nbgrad.trace", next(iter(unknown)), options_of(trace), options_of(trace, False))
    return model.nbgrad_trace(input, source, namespace, **options)


def _options(arguments: dict) -> dict:
    return {name: value for name, value in arguments.items()
            if name not in ("model", "input", "source", "namespace", "_aliased", "_unknown")
            and (name != "runner" or value != "fast")}


def _canonical_trace(model, input, source: str, namespace, **options) -> Result:
    """`trace` of the cell rewritten into the model's own paths; a cell that reads attention patterns runs
    with the eager attention function, given back afterwards."""
    namespace = default_namespace(namespace, model)
    rewrite = rewrite_of(source, model, namespace)
    with eager_attention(model) if rewrite.eager and not options["graph"] else contextlib.nullcontext(), \
            in_cell_words(rewrite):
        result = trace(model, input, rewrite.text, namespace, **options, _aliased=True)
    wrap_caches(rewrite, namespace, result)
    return result


@checked_options("nbgrad.backward")
def backward(loss: torch.Tensor, source: str = "", namespace: dict | None = None, *, grad_output=None,
             retain_graph: bool = False, create_graph: bool = False, graph: bool = False,
             quiet: bool = True, runner: str = "fast") -> Result:
    """A standalone backward pass of `loss`; `source` reads and edits `.grad` like a `%%backward` body. Its
    statements are of the general kinds whatever `runner` says (see `trace`)."""
    check_source(source, "nbgrad.backward")
    if runner != "fast":
        checks.runner_argument(runner)
    program = compile_cell(source, "backward")
    if graph:
        return Result(saved={}, graph=program.graph)
    checks.backward_arguments(loss, namespace, grad_output)
    if elsewhere := getattr(loss, "nbgrad_kept", None):     # a remote cell's value: its graph is there (remote/kept.py)
        return elsewhere.nbgrad_backward(loss, source, namespace, grad_output=grad_output, retain_graph=retain_graph,
                                         create_graph=create_graph)
    namespace = namespace if namespace is not None else {}
    leaves = _leaves(loss) if isinstance(loss, torch.Tensor) else []
    held = {id(leaf) for leaf in leaves if leaf.grad is not None}
    runtime = Runtime(program, namespace)
    result = runtime.run_backward(loss, grad_output=grad_output, retain_graph=retain_graph,
                                  create_graph=create_graph)
    names = tensor_names(namespace)
    for leaf in leaves:
        name = names.get(id(leaf), f"leaf {tuple(leaf.shape)}")
        result.leaf_grads[name] = leaf.grad
        if id(leaf) in held:
            result.accumulated.add(name)
    return result


_CACHE_CELL = "nbgrad_cache = cache(nbgrad_modules, grads=nbgrad_grads, device=nbgrad_device, dtype=nbgrad_dtype)\n" \
              "nbgrad_output = model.output.save()\n"


def run_with_cache(model: nn.Module, input, modules="*", *, grads: bool = False, loss=None, device=None,
                   dtype=None, names: str | None = None) -> tuple:
    """`(output, Cache)`: one run of `model` on `input` with every module matching `modules` cached (see
    `cache(...)`). With `grads=True`, `loss(output)` is the scalar backpropagated; the Cache holds the
    gradient into each cached output, and parameters' `.grad` accumulate as in PyTorch. With
    `names="canonical"`, a `CanonicalCache` of every canonical value whose key matches `modules`."""
    if grads and not callable(loss):
        raise NbgradError("run_with_cache(..., grads=True) needs loss=: a function of the model's output that "
                          "returns the scalar to backpropagate (e.g. `lambda out: out.logits[0, -1].max()`)")
    if names is not None:
        return _canonical_run_with_cache(model, input, modules, names, grads, loss, device, dtype)
    namespace = {"model": model, "nbgrad_modules": modules, "nbgrad_grads": grads, "nbgrad_device": device,
                 "nbgrad_dtype": dtype, "nbgrad_loss": loss, "nbgrad_scalar": _scalar_loss}
    source = _CACHE_CELL + ("nbgrad_scalar(nbgrad_loss(nbgrad_output)).backward()\n" if grads else "")
    try:
        trace(model, input, source, namespace)
    except NbgradError as error:      # said of the call: the lines of the cell it runs are not the user's
        raise _without_line(error) from error.__cause__
    return namespace["nbgrad_output"], namespace["nbgrad_cache"]


def _canonical_run_with_cache(model, input, pattern, names, grads, loss, device, dtype) -> tuple:
    """`run_with_cache(..., names="canonical")`: one cell with `cache(pattern, names="canonical", ...)`."""
    if names != "canonical" or not isinstance(pattern, str):
        raise NbgradError('run_with_cache(..., names="canonical") takes a pattern of canonical keys '
                          '("layers.*.resid_post"); names= is "canonical" or None')
    namespace = {"model": model, "nbgrad_device": device, "nbgrad_dtype": dtype, "nbgrad_loss": loss,
                 "nbgrad_scalar": _scalar_loss}
    options = f", grads={bool(grads)}" + (", device=nbgrad_device" if device is not None else "") + \
        (", dtype=nbgrad_dtype" if dtype is not None else "")
    source = f"nbgrad_cache = cache({pattern!r}, names='canonical'{options})\nnbgrad_output = model.output.save()\n"
    try:
        trace(model, input, source + ("nbgrad_scalar(nbgrad_loss(nbgrad_output)).backward()\n" if grads else ""),
              namespace)
    except NbgradError as error:      # said of the call: the lines of the cell it runs are not the user's
        raise _without_line(error) from error.__cause__
    return namespace["nbgrad_output"], namespace["nbgrad_cache"]


def _scalar_loss(value):
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        what = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else a_or_an(
            type(value).__name__)
        raise GradError(f"run_with_cache(..., loss=...): loss(output) gave {what}, not a scalar: return the one "
                        f"number to backpropagate (`.sum()`, or one logit as in `out.logits[0, -1].max()`)")
    return value


def _without_line(error: NbgradError) -> NbgradError:
    detail = error.detail
    if detail.startswith("cache("):         # the call's own name for what was given to it
        detail = "run_with_cache(" + detail[len("cache("):]
    try:
        plain = type(error)(detail)
    except TypeError:
        plain = NbgradError(detail)
    plain.__suppress_context__ = True
    return plain


@checked_options("nbgrad.edit")
@root_misspelling_hinted
def edit(model: nn.Module, source: str, namespace: dict | None = None, *, label: str = "") -> Edit:
    """Install `source` (the body of a `%%edit` cell: writes and in-place edits of module events) on `model` for
    every later call of it (a plain call, `generate`, a later trace) until `.remove()`; returns the `Edit`, which
    is also a context manager. The body reads the namespace as it is now."""
    check_source(source, "nbgrad.edit")
    checks.edit_arguments(model, namespace, label)
    namespace = default_namespace(namespace, model)
    rewrite = rewrite_of(source, model, namespace, edit=True)     # canonical names (nbgrad/names)
    if rewrite.sites:
        line, name = rewrite.sites[0]
        raise NbgradError(f"canonical names: {name} is a value inside the attention's forward (a site), which an "
                          "edit does not take by its canonical name yet; write it in each %%trace or %%generate cell "
                          "that needs it", line)
    with in_cell_words(rewrite):
        program = compile_with_helpers(rewrite.text, edit_mode(rewrite.text), namespace)
        check_edit(program)
    model = compiled_inner(model) or model
    remember(model)
    installed = Edit(model, program, names_read(program, namespace), label)
    installed.source = source          # as written (canonical names included), for its summary and listings
    try:
        with in_cell_words(rewrite):
            return install(installed)
    except BaseException:       # an interrupt too: the caller never gets this Edit, so nothing of it may stay on
        withdraw(installed)
        raise


def withdraw(installed: Edit) -> None:
    """Take `installed` off its model whatever point its installing reached (`Edit.remove` needs it active)."""
    stack = stack_on(installed.model)
    if stack is not None:
        stack.remove(installed)


def save(value):
    """`nbgrad.save(x)`: keep x after the cell (same as `x.save()`); returns x."""
    runtime = active_runtime()
    return runtime.save(value, label="nbgrad.save(...)") if runtime is not None else value


def show(value, name: str = "", model=None, tokenizer=None):
    """The inline panel for a tensor, or a dict / list of tensors (what `%show` displays); a Cache's panel."""
    if isinstance(value, Cache):
        return CachePanel(value.summary(), title=name)
    from .views import show as build
    if tokenizer is None and model is not None:
        tokenizer = models.tokenizer_for(model)
    return build(value, name=name, tokenizer=tokenizer)


def _leaves(loss: torch.Tensor) -> list:
    """Leaf tensors whose .grad this backward pass fills, in the order the graph reaches them."""
    leaves, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)
        if variable is not None:
            leaves.append(variable)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    if loss.grad_fn is None and loss.requires_grad:
        leaves.append(loss)
    return leaves[::-1]
