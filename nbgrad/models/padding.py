"""The one padding rule of nbgrad: prompts of different lengths are padded on the left, with the attention
mask and position ids counted from each row's first real token, so that every row's values at its real
tokens equal running that prompt alone. A list INPUT, invokes and `--over` batches all pad this way."""
from __future__ import annotations

import array
import functools
import inspect
import sys

import torch
from torch import nn

from .byid import weakly


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids from a left-padded attention mask: 0 on each row's first real token (0 on padding too)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def accepts(model: nn.Module, name: str) -> bool:
    """Whether the model's forward takes an argument of this name."""
    forward = model.forward
    function = getattr(forward, "__func__", None)      # a plain method: its signature is the class's
    return name in (_parameter_names(function) if function is not None else _parameter_names.__wrapped__(forward))


@functools.lru_cache(maxsize=64)
def _parameter_names(function) -> frozenset:
    try:
        return frozenset(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return frozenset()


def pad_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its end-of-text token, else 0 (masked either way)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)


def pad_key(tokenizer):
    """What the pad id is made from, for the key of a kept batch: a transformers tokenizer keeps its special tokens
    in a dict, and looks `pad_token_id` up token to id at each read (some ten Python calls, run cold before every
    cell with invokes); the two tokens it is made from are two reads of that dict. Else the pad id itself. (The id
    of a token changes only with the vocabulary's size, which every key holds: `remembered`.)"""
    special = getattr(tokenizer, "__dict__", _NO_DICT).get("_special_tokens_map")
    if type(special) is dict:
        return special.get("pad_token"), special.get("eos_token")
    return pad_id(tokenizer)


_NO_DICT: dict = {}


# Per tokenizer, what its prompts gave: token ids per prompt, and whole padded batches per set of
# INPUTs (a notebook runs the same clean and corrupt prompts cell after cell). Keyed by what
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


def _kept(tokenizer, key) -> tuple:
    """(the tokenizer's cache, the full key) for `key`; (None, None) where nothing can be kept for it."""
    seen = _cache_of(tokenizer)
    try:
        return seen, (key, len(tokenizer), getattr(tokenizer, "add_bos_token", None),
                      getattr(tokenizer, "add_eos_token", None))
    except TypeError:
        return None, None


def remembered(tokenizer, key, make):
    """`make()`, kept in the tokenizer's cache under `key`; made anew, unkept, for a tokenizer that
    cannot be weakly referenced or has no len()."""
    seen, key = _kept(tokenizer, key)
    if seen is None:
        return make()
    value = seen.get(key)
    if value is None:
        value = seen[key] = make()
        if len(seen) > _SEEN_LIMIT:
            del seen[next(iter(seen))]
    return value


def tokens(tokenizer, prompt: str) -> tuple:
    """The token ids of one prompt, as the tokenizer gives them for the prompt alone."""
    return remembered(tokenizer, prompt, lambda: tuple(tokenizer(prompt)["input_ids"]))


def token_rows(tokenizer, prompts: list) -> list:
    """`tokens` of each prompt. A fast tokenizer encodes the prompts it has not seen in one call on the list (one
    pass of its Rust code, not a Python call per prompt): unpadded, each row is the prompt's ids alone."""
    seen, _ = _kept(tokenizer, None)
    if seen is not None and getattr(tokenizer, "is_fast", False) is True:
        new = [prompt for prompt in dict.fromkeys(prompts) if _kept(tokenizer, prompt)[1] not in seen]
        if len(new) > 1:
            for prompt, ids in zip(new, tokenizer(new)["input_ids"]):
                remembered(tokenizer, prompt, lambda ids=ids: tuple(ids))
    return [tokens(tokenizer, prompt) for prompt in prompts]


class Batch:
    """One padded batch of token rows: ids, attention mask and position ids stacked in one tensor (kept, so
    copied for each use), each group's rows, the smallest and largest id, and the copy lent last (`call_kwargs`)."""
    __slots__ = ("stacked", "spans", "low", "high", "lent")

    def __init__(self, rows_per_group: list, pad: int):
        rows = [row for rows in rows_per_group for row in rows]
        length = max(map(len, rows))
        flat = array.array("q")
        for row in rows:
            flat.extend([pad] * (length - len(row)))
            flat.extend(row)
        self.low, self.high = min(flat), max(flat)
        for row in rows:
            flat.extend([0] * (length - len(row)) + [1] * len(row))
        flat.extend([0] * (len(rows) * length))
        stacked = torch.frombuffer(flat, dtype=torch.long).view(3, len(rows), length).clone()
        stacked[2] = positions_from_mask(stacked[1])
        self.stacked, self.lent = stacked, None
        self.spans = tuple(spans_of(list(map(len, rows_per_group))))

    def call_kwargs(self, model: nn.Module, device) -> dict:
        """`input_ids`, `attention_mask` and, where the model's forward takes them, `position_ids`, on `device`
        (None: where they are). A cell may edit its inputs in place, so a call gets a copy; the last copy is lent
        again to a call that finds it as it was lent and held by nothing else (`_held`): a loop of traces that lets
        each Result go copies once. Taken while it is checked, so that two threads never share one."""
        lent, self.lent = self.lent, None
        where = self.stacked.device if device is None else device
        if lent is None or lent[2] is None or where != lent[1] or _held(lent[0], lent[3]) != lent[2]:
            stacked = self.stacked      # (a clone where it is: `to(device, copy=True)` does more to find that out)
            stacked = stacked.clone() if where == stacked.device else stacked.to(where, copy=True)
            views, storage = stacked.unbind(), _storage_of(stacked)
            lent = (views, where, _held(views, storage), storage)     # (views, device, as lent, storage)
        ids, mask, positions = lent[0]
        self.lent = lent
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if accepts(model, "position_ids"):
            kwargs["position_ids"] = positions
        return kwargs


_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)     # how many tensors share a storage (torch's own)


def _storage_of(tensor: torch.Tensor):
    return tensor.untyped_storage()._cdata if _USE_COUNT is not None else None


def _held(views: tuple, storage) -> tuple | None:
    """What says whether a lent copy is as it was lent and held by nothing else: its version (an edit in place
    bumps it); the references to each tensor, Python's and torch's (a Result's input ids, a saved autograd graph);
    the tensors that share its storage (a view). None where torch does not count those: it is not lent again."""
    if storage is None:
        return None
    ids, mask, positions = views
    return (ids._version, sys.getrefcount(ids), sys.getrefcount(mask), sys.getrefcount(positions), ids._use_count(),
            mask._use_count(), positions._use_count(), _USE_COUNT(storage))


def spans_of(counts: list) -> list:
    """[start, stop) of each group of `counts` rows, one after another."""
    spans, start = [], 0
    for count in counts:
        spans.append((start, start + count))
        start += count
    return spans
