"""`nbgrad.scan(model, INPUT, source)`: the shape and dtype of every value a cell saves, from a run of the cell on
the model's fake twin (remote/fakes.py): nbgrad's own engine, no weight read, no actor asked."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..engine.compile.sourcetext import check_source
from ..engine.results.cache import Cache
from ..engine.checks import trace_arguments
from ..errors import CELL_FILENAME_PREFIX, NbgradError
from ..errors.options import unknown_option
from ..models.cell import default_namespace
from ..models.loading import tokenizer_for
from ..names.cache import CanonicalCache
from .fakes import fake_mode, fake_twin, twin_names
from .shipping import free_names


class TensorSpec(NamedTuple):
    """What a scan says of one tensor."""
    shape: torch.Size
    dtype: torch.dtype

    def __repr__(self):
        return f"{str(self.dtype).removeprefix('torch.')}{list(self.shape)}"


class CacheSpec(dict):
    """A `Cache`'s specs: path -> spec of its output; `.inputs` and `.grads` likewise."""

    def __init__(self, outputs: dict, inputs: dict, grads: dict):
        super().__init__(outputs)
        self.inputs, self.grads = inputs, grads

    def __eq__(self, other):
        if not isinstance(other, CacheSpec):
            return dict.__eq__(self, other)
        return dict.__eq__(self, other) and (self.inputs, self.grads) == (other.inputs, other.grads)


def spec_of(value):
    """A saved value with every tensor in it replaced by its TensorSpec (lists, tuples, dicts and caches part by
    part); anything else by its type's name."""
    if isinstance(value, torch.Tensor):
        return TensorSpec(value.shape, value.dtype)
    if isinstance(value, Cache):
        return CacheSpec(*({path: spec_of(v) for path, v in part.items()}
                           for part in (value._outputs, value._inputs, value._grads)))
    if isinstance(value, CanonicalCache):
        return CacheSpec({key: spec_of(v) for key, v in value.items()}, {},
                         {key: spec_of(v) for key, v in value.grads.items()})
    if isinstance(value, (list, tuple)):
        return [spec_of(v) for v in value] if isinstance(value, list) else tuple(spec_of(v) for v in value)
    if isinstance(value, dict):
        return {key: spec_of(v) for key, v in value.items()}
    return "None" if value is None else type(value).__name__


class Scan(dict):
    """name -> spec of what the cell saves under that name (a TensorSpec, or a list of them per step, ...).
    Printed, a table: one row per tensor, with its name as the cell would index it."""

    def rows(self) -> list:
        """(name, shape, dtype) of every tensor, `top[2]` for step 2 of a saved list, `c.grads['transformer.h.0']`
        for a cache's gradient."""
        found: list = []
        for name, spec in self.items():
            _rows(name, spec, found)
        return found

    def __repr__(self):
        rows = [("name", "shape", "dtype")] + [(name, str(list(shape)) if shape is not None else "-",
                                                 str(dtype).removeprefix("torch.")) for name, shape, dtype in self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)

    def _repr_pretty_(self, printer, cycle):
        printer.text(repr(self))


def _rows(name: str, spec, found: list) -> None:
    if isinstance(spec, TensorSpec):
        found.append((name, spec.shape, spec.dtype))
    elif isinstance(spec, CacheSpec):
        for part, values in (("", spec), (".inputs", spec.inputs), (".grads", spec.grads)):
            for path, value in values.items():
                _rows(f"{name}{part}[{path!r}]", value, found)
    elif isinstance(spec, (list, tuple)):
        for index, value in enumerate(spec):
            _rows(f"{name}[{index}]", value, found)
    elif isinstance(spec, dict):
        for key, value in spec.items():
            _rows(f"{name}[{key!r}]", value, found)
    else:
        found.append((name, None, spec))


def scan(model, input, source: str, namespace: dict | None = None, *, generate: bool = False, **options) -> Scan:
    """The shape and dtype of every value the cell `source` saves (`.grad`s and caches included), from a run on
    fake tensors: no weight is read, and a remote model's actor is not asked. `generate=True` scans a
    `%%generate` body (every step: no sequence ends early at an end-of-text token); `options` are `nbgrad.trace`'s
    (or `nbgrad.generate`'s). An error in the cell is the error the real run gives."""
    from .. import api, generation
    check_source(source, "nbgrad.scan")
    remote = not isinstance(model, nn.Module) and hasattr(model, "skeleton")
    if not remote:
        trace_arguments(model, namespace)
    _check_options(options, generate)       # (`out` of a generation is the name of its token ids: harmless here)
    mode = fake_mode()
    twin = fake_twin(model.skeleton if remote else model, mode)
    namespace = default_namespace(namespace, model)
    names = twin_names(namespace, _read(source), model, twin)
    options.setdefault("tokenizer", model.tokenizer if remote else tokenizer_for(model))
    try:
        if generate:
            twin.generation_config.eos_token_id = None
            result = generation.generate(twin, input, source, names, **options)
        else:
            result = api.trace(twin, input, source, names, **options)
    except Exception as error:
        if isinstance(error, _undecidable_errors()):
            raise _undecidable(error) from None
        raise
    return Scan(saved_specs(result.saved, names))


def saved_specs(saved: dict, namespace: dict) -> dict:
    """A run's saved values as specs. A canonical cache is saved part by part (`c['layers.0.resid_post']`, its
    gradients not at all): it is the `CanonicalCache` the run left under its name, `.grads` included, as the
    other caches are."""
    specs: dict = {}
    for name, value in saved.items():
        owner = namespace.get(name.split("[", 1)[0]) if "[" in name else None
        whole = owner if isinstance(owner, CanonicalCache) else None
        if isinstance(owner, list) and owner and all(isinstance(one, CanonicalCache) for one in owner):
            whole = owner          # --over: one per example
        if whole is None:
            specs[name] = spec_of(value)
        else:
            specs.setdefault(name.split("[", 1)[0], spec_of(whole))
    return specs


def _check_options(options: dict, generate: bool) -> None:
    """Options that `nbgrad.trace` (`nbgrad.generate`) takes; a scan runs here, on fake tensors: it writes no folder
    and starts no cluster."""
    import inspect
    from .. import api, generation
    run = generation.generate if generate else api.trace
    known = [name for name, p in inspect.signature(run).parameters.items()
             if p.kind is p.KEYWORD_ONLY and not name.startswith("_")] + ["max_new_tokens"] * generate
    for option in options:
        if option not in known:
            raise unknown_option(f"nbgrad.scan (the options of nbgrad.{run.__name__})", option, known)
    if generate:
        return
    for option, default in (("out", None), ("engine", "local"), ("workers", None), ("model_factory", None)):
        if options.get(option, default) != default:
            raise NbgradError(f"nbgrad.scan runs the cell here, on fake tensors: `{option}` does not apply to it "
                              f"(leave it out; a scan of `over=DATASET` says each example's shapes)")


def _read(source: str) -> set:
    try:
        return free_names(source)
    except SyntaxError:         # the run says it, as a real run does
        return set()


def _undecidable_errors() -> tuple:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    return DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode


def _undecidable(error: Exception) -> NbgradError:
    """A question about the values that a scan cannot answer: a Python `if` on a tensor, `.item()`, `nonzero`."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(CELL_FILENAME_PREFIX):
            line = tb.tb_lineno
        tb = tb.tb_next
    what = "this line" if line else "the model"
    return NbgradError(f"nbgrad.scan cannot tell what {what} does without the values: it decides on a number "
                       f"or a truth value that depends on a tensor's data (an `if` on a tensor, say), and a scan "
                       f"has shapes only. Run the cell", line)
