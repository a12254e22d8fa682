"""One batch of a dataset run: its examples as the invokes of one model call, the cell once per example
(replicate.py), and what each example saved, by the cell's own names.

A saved value is kept as a detached copy of the example's rows: the batch's autograd graph and activations
are freed with the batch, so a run over thousands of examples holds only what the cell saved."""
from __future__ import annotations

import re
import types
from dataclasses import replace

import torch

from ..engine.compile.compiler import compile_cell
from ..engine.results.cache import Cache, Calls, same_elements
from ..engine.results.result import holds_saved
from ..engine.run.rows import InvokeRows, rebuilt
from ..engine.run.runtime import Runtime
from ..errors import NbgradError, at_cell_line
from ..models.batching import batch_invokes
from .examples import describe
from .replicate import prefixed, replicated, unprefixed

_MISSING = object()


def run_batch(model, tokenizer, source: str, namespace: dict, examples: list, start: int,
              no_grad: bool = False, helpers: tuple = ()) -> tuple:
    """([{name: value} per example], {name: value} of the last example's unsaved plain values)."""
    __tracebackhide__ = True
    cell = replicated(source, len(examples), helpers)
    invokes = cell.program.invokes
    try:
        args, kwargs, spans = batch_invokes(examples, invokes, model, tokenizer)
    except NbgradError as error:
        raise _located_input_error(error, model, tokenizer, invokes, examples, start)
    private = dict(namespace)            # the copies' prefixed names live here, never in the user's namespace
    for name in cell.names:
        if name in namespace:            # a copy reading a name before binding it sees the value before the cell
            private.update({prefixed(name, k): namespace[name] for k in range(len(examples))})
    runtime = Runtime(cell.program, private, model=model, no_grad=no_grad, rows=InvokeRows(spans, spans[-1][1]))
    try:
        result = runtime.run_trace(args, kwargs)
    except BaseException as error:
        raise at_example(error, cell, runtime, examples, start, source)
    saved_ids = {id(value) for value in result.saved.values()}
    per_example, plain = [], {}
    for k in range(len(examples)):
        values = {}
        for name in cell.names:
            value = private.get(prefixed(name, k), _MISSING)
            if value is _MISSING:
                continue
            if holds_saved(value, saved_ids):
                values[name] = detached(value)
            elif not _has_tensor(value):
                plain[name] = value
        per_example.append(values)
    return per_example, plain


def at_example(error: BaseException, cell, runtime, examples: list, start: int, source: str) -> BaseException:
    """The error with the example it concerns: its index in the dataset and its INPUT, and the cell line (the
    traceback's frame of the cell at the cell's own line, as a worker's error shows it: ray_engine.py)."""
    failed = runtime.failed
    example = runtime.program.nodes[failed].spec.invoke if failed is not None else None
    if isinstance(error, NbgradError) and error.line:
        line, example = cell.cell_line(error.line)
        error.line = line
    where = (f"example {start + example} (INPUT {describe(examples[example])})" if example is not None else
             f"the batch of examples {start}-{start + len(examples) - 1}")
    if isinstance(error, NbgradError):
        error.detail = f"{_cell_lines(unprefixed(error.detail), cell)} [in {where}]"
        error.args = (f"line {error.line}: {error.detail}" if error.line else error.detail,) + error.args[1:]
    elif isinstance(error, Exception):
        error.args = tuple(unprefixed(arg) if isinstance(arg, str) else arg for arg in error.args)
        line = error.nbgrad_cell_line = _cell_frame_line(error, cell)    # for a worker's driver (ray_engine.py)
        error.add_note(f"nbgrad: raised by {where}" + (f", at line {line} of the cell" if line else ""))
        if line:
            return _in_cell_frame(error, cell, line, compile_cell(source, "trace").filename)
    return error


def _in_cell_frame(error: BaseException, cell, line: int, filename: str) -> BaseException:
    """The traceback with the batch program's frames (which repeat the cell once per example, so their line is
    not the cell's) given as one frame of the cell at `line`; the frames below it (the model's) kept."""
    below, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == cell.program.filename:
            below = tb.tb_next
        tb = tb.tb_next
    top = at_cell_line(error, filename, line).__traceback__
    return error.with_traceback(types.TracebackType(below, top.tb_frame, top.tb_lasti, top.tb_lineno))


def _cell_lines(text: str, cell) -> str:
    """A message's mentions of other lines (`the backward pass of line 6`) as lines of the cell, as its own line
    is: the batch's program repeats the cell once per example."""
    return _LINE.sub(lambda found: f"line {cell.cell_line(int(found.group(1)))[0]}", text)


_LINE = re.compile(r"\bline (\d+)\b")


def _located_input_error(error, model, tokenizer, invokes, examples: list, start: int) -> NbgradError:
    """An INPUT that cannot be batched: find which example, trying each alone (only on this error path)."""
    alone = [replace(invokes[0], label="the example")]     # said of the example, not of the invoke made of it
    for k, example in enumerate(examples):
        try:
            batch_invokes([example], alone, model, tokenizer)
        except NbgradError as failed:
            return NbgradError(f"example {start + k} (INPUT {describe(example)}): {failed.detail}")
    return NbgradError(f"examples {start}-{start + len(examples) - 1} cannot be put in one batch: {error.detail}")


def _cell_frame_line(error: BaseException, cell) -> int | None:
    tb, line = error.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == cell.program.filename:
            line = cell.cell_line(tb.tb_lineno)[0]
        tb = tb.tb_next
    return line


def detached(value, copies: dict | None = None):
    """A tensor's own copy, cut from the batch and its graph; containers element by element, and a Cache part by
    part. `copies` (what a tensor views -> its copy) keeps one copy of a tensor held twice (a cache holds a module's output again as
    the next module's input)."""
    if isinstance(value, torch.Tensor):
        if copies is None:
            return value.detach().clone()
        same = same_elements(value)         # the same rows of the same tensor, through two views
        copy = copies.get(same)
        if copy is None:
            copy = copies[same] = value.detach().clone()
        return copy
    if isinstance(value, Cache):
        copies = {} if copies is None else copies
        copy = Cache(value.options)
        for part in ("_outputs", "_inputs", "_grads"):
            setattr(copy, part, {path: detached(v, copies) for path, v in getattr(value, part).items()})
        return copy
    if isinstance(value, (list, tuple)):
        if type(value) in (list, tuple, Calls):
            return type(value)(detached(v, copies) for v in value)
        return value
    if isinstance(value, dict):
        return rebuilt(value, {key: detached(v, copies) for key, v in value.items()})    # a ModelOutput keeps its type
    return value


def _has_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, (list, tuple)) and any(isinstance(element, torch.Tensor) for element in value)
