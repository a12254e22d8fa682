"""The inputs of a cell's `with invoke(...)` blocks -> one batch for one model call, and each invoke's
rows in it. Text, and token ids of different lengths, are padded on the left, with the attention mask and
position ids set so that every invoke's values at its real tokens equal running its INPUT alone."""
from __future__ import annotations

import torch
from torch import nn

from ..errors import InputError
from .inputs import call_arguments, input_device
from .loading import no_tokenizer_message
from .limits import check_token_range
from .padding import Batch, accepts, pad_id, pad_key, positions_from_mask, remembered, spans_of, token_rows, tokens


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
        try:
            args, kwargs = call_arguments(value, model, tokenizer)
        except InputError as error:         # which invoke's INPUT, on its line (an example of --over says its own)
            if error.line is not None or invoke.label:
                raise
            raise InputError(f"{invoke.named()}: {error.detail}", invoke.line) from error.__cause__
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
    rows = [tokens(tokenizer, prompt) for prompt in prompts]
    if any(len(row) == 0 for row in rows):
        raise InputError(f"{invoke.named()} has an empty prompt: it gives no tokens", invoke.line)
    return rows


def _rows_per_invoke(values: list, invokes: list, tokenizer) -> list:
    """Each invoke's token rows; the prompts not seen before tokenized together first (token_rows)."""
    token_rows(tokenizer, [prompt for value in values for prompt in ([value] if isinstance(value, str) else value)])
    return [_token_rows(value, invoke, tokenizer) for value, invoke in zip(values, invokes)]


def _text_batch(values: list, invokes: list, model: nn.Module, tokenizer) -> tuple:
    batch = text_batch(values, invokes, model, tokenizer)
    return (), batch.call_kwargs(model, input_device(model)), batch.spans


def text_batch(values: list, invokes: list, model: nn.Module, tokenizer) -> Batch:
    """Text padded on the left; ids, attention mask and position ids made into tensors at once (Batch). This runs
    before every cell with invokes, so the batch is kept per set of INPUTs, and each call gets its own copy on the
    input device (a cell may edit its inputs in place: Batch.call_kwargs)."""
    if tokenizer is None:
        raise InputError(no_tokenizer_message(model), invokes[0].line)
    key = (tuple(value if isinstance(value, str) else tuple(value) for value in values)
           if list in map(type, values) else tuple(values), pad_key(tokenizer))
    batch = remembered(tokenizer, key, lambda: Batch(_rows_per_invoke(values, invokes, tokenizer), pad_id(tokenizer)))
    check_token_range(batch.low, batch.high, batch.stacked.shape[-1], model)
    return batch


def _concatenated(calls: list, invokes: list) -> tuple:
    first_args, first_kwargs = calls[0]
    try:
        args = tuple(_cat([c[0][i] for c in calls]) for i in range(len(first_args)))
        kwargs = {k: _cat([c[1][k] for c in calls]) for k in first_kwargs}
    except (RuntimeError, KeyError, IndexError, TypeError) as error:
        raise InputError(f"the invokes' INPUTs cannot be put in one batch ({error}); give them one shape "
                         f"(pad them yourself), or give text", invokes[1].line if len(invokes) > 1 else None) from error
    return args, kwargs, spans_of([_rows_of(*call) for call in calls])


def _padded_ids(calls: list, model: nn.Module, tokenizer) -> tuple | None:
    """Token ids of different lengths (a tensor each, or `input_ids` with its `attention_mask`), padded on the left
    with mask and position ids as text is; None when the INPUTs are anything else, or the model takes no mask."""
    if not (accepts(model, "input_ids") and accepts(model, "attention_mask")):
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
    pad = pad_id(tokenizer)
    length = max(ids.shape[1] for ids, _ in parts)
    ids = torch.cat([nn.functional.pad(ids, (length - ids.shape[1], 0), value=pad) for ids, _ in parts])
    mask = torch.cat([nn.functional.pad(mask, (length - mask.shape[1], 0), value=0) for _, mask in parts])
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if accepts(model, "position_ids"):
        kwargs["position_ids"] = positions_from_mask(mask)
    return (), kwargs, spans_of([ids.shape[0] for ids, _ in parts])


def _cat(values: list):
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.cat(values, dim=0)
    if all(v is values[0] or v == values[0] for v in values):
        return values[0]
    raise TypeError("the invokes give different non-tensor arguments")


def _rows_of(args, kwargs) -> int:
    first = args[0] if args else next(iter(kwargs.values()), None)
    return first.shape[0] if isinstance(first, torch.Tensor) and first.dim() > 0 else 1
