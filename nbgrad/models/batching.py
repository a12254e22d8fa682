"""The inputs of a cell's `with invoke(...)` blocks -> one batch for one model call, and each invoke's
rows in it. Text, and token ids of different lengths, are padded on the left, with the attention mask and
position ids set so that every invoke's values at its real tokens equal running its INPUT alone."""
from __future__ import annotations

import array
import functools
import inspect

import torch
from torch import nn

from ..errors import InputError
from .byid import weakly
from .inputs import call_arguments, input_device
from .loading import no_tokenizer_message
from .limits import check_token_range


def batch_invokes(values: list, invokes: list, model: nn.Module, tokenizer) -> tuple:
    """(args, kwargs, spans): the model call for all invokes, and [start, stop) of each invoke's rows."""
    if set(map(type, values)) == {str}:         # the common case, without a Python call per value
        return _text_batch(values, invokes, model, tokenizer)
    texts = [_is_text(value) for value in values]
    if all(texts):
        return _text_batch(values, invokes, model, tokenizer)
    if any(texts):
        raise InputError("the invokes mix text and other INPUTs; give every invoke text, or every invoke "
                         "tensors of one shape", invokes[texts.index(False)].line)
    calls = []
    for value, invoke in zip(values, invokes):
        args, kwargs = call_arguments(value, model, tokenizer)
        if _rows_of(args, kwargs) == 0:
            raise InputError(f"{invoke.named()} has no rows", invoke.line)
        calls.append((args, kwargs))
    try:
        return _concatenated(calls, invokes)
    except InputError:
        padded = _padded_ids(calls, model, tokenizer)
        if padded is None:
            raise
        return padded


def _is_text(value) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def _token_rows(value, invoke, tokenizer) -> list:
    prompts = [value] if isinstance(value, str) else value
    if not prompts:
        raise InputError(f"{invoke.named()} has no rows: its list of prompts is empty", invoke.line)
    rows = [_tokens(tokenizer, prompt) for prompt in prompts]
    if any(len(row) == 0 for row in rows):
        raise InputError(f"{invoke.named()} has an empty prompt: it gives no tokens", invoke.line)
    return rows


# Per tokenizer, what its prompts gave: token ids per prompt, and whole padded batches per set of
# invoke INPUTs (a notebook runs the same clean and corrupt prompts cell after cell). Keyed by what
# changes a tokenizer's output: its vocabulary size, the BOS/EOS flags and, for a batch, the pad id.
_seen: dict = {}            # id(tokenizer) -> (weak reference to it, {key: value})
_SEEN_LIMIT = 512


def _cache_of(tokenizer) -> dict | None:
    """The tokenizer's cache (a plain dict by id, see byid.py). None if it cannot be referenced."""
    entry = _seen.get(id(tokenizer))
    if entry is not None and entry[0]() is tokenizer:
        return entry[1]
    try:
        ref = weakly(tokenizer, _seen)
    except TypeError:
        return None
    _seen[id(tokenizer)] = (ref, {})
    return _seen[id(tokenizer)][1]


def _remembered(tokenizer, key, make):
    """`make()`, kept in the tokenizer's cache under `key`; made anew, unkept, for a tokenizer that
    cannot be weakly referenced or has no len()."""
    seen = _cache_of(tokenizer)
    try:
        key = (key, len(tokenizer), getattr(tokenizer, "add_bos_token", None),
               getattr(tokenizer, "add_eos_token", None))
    except TypeError:
        seen = None
    if seen is None:
        return make()
    value = seen.get(key)
    if value is None:
        value = seen[key] = make()
        if len(seen) > _SEEN_LIMIT:
            del seen[next(iter(seen))]
    return value


def _tokens(tokenizer, prompt: str) -> tuple:
    return _remembered(tokenizer, prompt, lambda: tuple(tokenizer(prompt)["input_ids"]))


class _Batch:
    """One padded batch of token rows: ids, attention mask and position ids stacked in one tensor (kept, so
    copied for each use), each invoke's rows, and the smallest and largest id."""
    __slots__ = ("stacked", "spans", "low", "high")

    def __init__(self, rows_per_invoke: list, pad: int):
        rows = [row for rows in rows_per_invoke for row in rows]
        length = max(map(len, rows))
        flat = array.array("q")
        for row in rows:
            flat.extend([pad] * (length - len(row)))
            flat.extend(row)
        self.low, self.high = min(flat), max(flat)
        for row in rows:
            flat.extend([0] * (length - len(row)) + [1] * len(row))
        for row in rows:
            flat.extend([0] * (length - len(row)) + list(range(len(row))))
        self.stacked = torch.frombuffer(flat, dtype=torch.long).view(3, len(rows), length).clone()
        self.spans = tuple(_spans(list(map(len, rows_per_invoke))))


def _text_batch(values: list, invokes: list, model: nn.Module, tokenizer) -> tuple:
    """Text padded on the left; ids, attention mask and position ids made into tensors at once, on the
    input device. This runs before every cell with invokes, so the batch is kept per set of INPUTs and
    each call gets its own copy (a cell may edit its inputs in place)."""
    if tokenizer is None:
        raise InputError(no_tokenizer_message(model), invokes[0].line)
    pad = _pad_id(tokenizer)
    key = (tuple(value if isinstance(value, str) else tuple(value) for value in values)
           if list in map(type, values) else tuple(values), pad)
    batch = _remembered(tokenizer, key, lambda: _Batch(
        [_token_rows(value, invoke, tokenizer) for value, invoke in zip(values, invokes)], pad))
    check_token_range(batch.low, batch.high, batch.stacked.shape[-1], model)
    ids, mask, positions = batch.stacked.to(input_device(model), copy=True).unbind()
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if _accepts(model, "position_ids"):
        kwargs["position_ids"] = positions
    return (), kwargs, batch.spans


def _concatenated(calls: list, invokes: list) -> tuple:
    first_args, first_kwargs = calls[0]
    try:
        args = tuple(_cat([c[0][i] for c in calls]) for i in range(len(first_args)))
        kwargs = {k: _cat([c[1][k] for c in calls]) for k in first_kwargs}
    except (RuntimeError, KeyError, IndexError, TypeError) as error:
        raise InputError(f"the invokes' INPUTs cannot be put in one batch ({error}); give them one shape "
                         f"(pad them yourself), or give text", invokes[1].line if len(invokes) > 1 else None) from error
    return args, kwargs, _spans([_rows_of(*call) for call in calls])


def _padded_ids(calls: list, model: nn.Module, tokenizer) -> tuple | None:
    """Token ids of different lengths (a tensor each, or `input_ids` with its `attention_mask`), padded on the left
    with mask and position ids as text is; None when the INPUTs are anything else, or the model takes no mask."""
    if not (_accepts(model, "input_ids") and _accepts(model, "attention_mask")):
        return None
    parts = []
    for args, kwargs in calls:
        if args:
            ids, mask = (args[0], None) if len(args) == 1 and not kwargs else (None, None)
        else:
            ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
            if set(kwargs) - {"input_ids", "attention_mask"}:
                return None
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
            return None
        if mask is not None and not (isinstance(mask, torch.Tensor) and mask.shape == ids.shape):
            return None
        parts.append((ids, torch.ones_like(ids) if mask is None else mask.to(ids.dtype)))
    pad = _pad_id(tokenizer)
    length = max(ids.shape[1] for ids, _ in parts)
    ids = torch.cat([nn.functional.pad(ids, (length - ids.shape[1], 0), value=pad) for ids, _ in parts])
    mask = torch.cat([nn.functional.pad(mask, (length - mask.shape[1], 0), value=0) for _, mask in parts])
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if _accepts(model, "position_ids"):
        kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)     # 0 on the first real token, as alone
    return (), kwargs, _spans([ids.shape[0] for ids, _ in parts])


def _pad_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its end-of-text token, else 0 (masked either way)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)


def _cat(values: list):
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.cat(values, dim=0)
    if all(v is values[0] or v == values[0] for v in values):
        return values[0]
    raise TypeError("the invokes give different non-tensor arguments")


def _rows_of(args, kwargs) -> int:
    first = args[0] if args else next(iter(kwargs.values()), None)
    return first.shape[0] if isinstance(first, torch.Tensor) and first.dim() > 0 else 1


def _spans(counts: list) -> list:
    spans, start = [], 0
    for count in counts:
        spans.append((start, start + count))
        start += count
    return spans


def _accepts(model: nn.Module, name: str) -> bool:
    forward = model.forward
    function = getattr(forward, "__func__", None)      # a plain method: its signature is the class's
    return name in (_parameter_names(function) if function is not None else _parameter_names.__wrapped__(forward))


@functools.lru_cache(maxsize=64)
def _parameter_names(function) -> frozenset:
    try:
        return frozenset(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return frozenset()
