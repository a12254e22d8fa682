"""One prompt, ready to run: the model call's arguments, its tokens, and what it scores (the target)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import InputError
from ..errors.naming import a_or_an
from ..models.inputs import call_arguments, input_ids_of
from ..models import tokenizer_for
from .sites import logits_of


@dataclass
class Prompt:
    args: tuple
    kwargs: dict
    ids: torch.Tensor | None
    tokens: list
    rows: int = 1

    def expanded(self, rows: int) -> tuple:
        """(args, kwargs) with every one-row tensor repeated to `rows` rows (one per interpolation point)."""
        def grow(value):
            if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == 1 and rows != 1:
                return value.expand(rows, *value.shape[1:])
            return value
        return tuple(grow(a) for a in self.args), {k: grow(v) for k, v in self.kwargs.items()}


def prepare(model: nn.Module, value, what: str = "input", batch: bool = False) -> Prompt:
    """A prompt of one row (or, with `batch`, of as many rows as it holds: a list of prompts is padded as every
    list INPUT is): text, token ids, a dict of model keywords or a tuple of arguments."""
    tokenizer = tokenizer_for(model)
    args, kwargs = call_arguments(value, model, tokenizer)
    rows = {int(v.shape[0]) for v in list(args) + list(kwargs.values()) if isinstance(v, torch.Tensor) and v.dim()}
    if batch:
        return Prompt(args, kwargs, input_ids_of(args, kwargs), token_labels(input_ids_of(args, kwargs), tokenizer),
                      max(rows, default=1))
    if rows - {1}:
        raise InputError(f"{what} has {max(rows)} rows; attribution explains one prediction: give one prompt "
                         f"(one string, or ids of shape [1, positions])")
    ids = input_ids_of(args, kwargs)
    return Prompt(args, kwargs, ids, token_labels(ids, tokenizer))


def token_labels(ids, tokenizer) -> list:
    if ids is None:
        return []
    row = ids.reshape(-1, ids.shape[-1])[0].tolist() if ids.dim() else [int(ids)]
    if tokenizer is None:
        return [str(i) for i in row]
    return [tokenizer.decode([i]) for i in row]


def token_id(model: nn.Module, token) -> int:
    """A token string -> its first token id; an int (or one-element tensor) is an id already."""
    if isinstance(token, torch.Tensor) and token.numel() == 1 and not token.is_floating_point():
        return int(token)
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    if isinstance(token, str):
        tokenizer = tokenizer_for(model)
        if tokenizer is None:
            raise InputError(f"target {token!r} is text and the model has no tokenizer: give a token id, or "
                             f"load the model with nbgrad.load_model")
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        if not ids:
            raise InputError(f"target {token!r} tokenizes to no token")
        return int(ids[0])
    raise InputError(f"target is {a_or_an(type(token).__name__)}: give a token (string), a token id, or a "
                     f"callable logits -> scalar")


def target_notes(model: nn.Module, target) -> list:
    """What the result says of a text target of several tokens: the score is its first token's logit (a token
    string's first id), which a word split in pieces (" Paris" -> " ", "P", "ar", "is") makes easy to miss."""
    tokenizer = tokenizer_for(model) if isinstance(target, str) else None
    ids = tokenizer(target, add_special_tokens=False)["input_ids"] if tokenizer is not None else []
    if len(ids) < 2:
        return []
    pieces = ", ".join(repr(tokenizer.decode([i])) for i in ids)
    return [f"target {target!r} is {len(ids)} tokens ({pieces}): the score is the logit of the first, "
            f"{tokenizer.decode([ids[0]])!r} (id {ids[0]}); for another token give its id, or a metric logits -> scalar"]


def scorer(model: nn.Module, target):
    """model output -> one score per row: the target token's logit at the last position, or the metric."""
    if callable(target):
        def score_rows(output):
            logits = logits_of(output)
            values = [target(logits[i:i + 1]) for i in range(logits.shape[0])]
            return torch.stack([_scalar(value) for value in values])
        return score_rows
    index = token_id(model, target)

    def score_token(output):
        logits = logits_of(output)
        if logits is not None and logits.dim() >= 2 and not 0 <= index < logits.shape[-1]:
            raise InputError(f"token target {index} is outside the model's vocabulary: its logits have "
                             f"{logits.shape[-1]} entries, so token ids are 0–{logits.shape[-1] - 1}")
        if logits is None or logits.dim() < 2:
            shape = None if logits is None else tuple(logits.shape)
            raise InputError(f"token target {index} needs logits [batch, positions, vocab]; the model "
                             f"returned {shape}")
        return logits[:, -1, index] if logits.dim() == 3 else logits[:, index]
    return score_token


def _scalar(value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise InputError(f"the metric must return a scalar tensor (logits -> scalar); it returned {shape}. "
                         f"Reduce it, e.g. with .sum() or by indexing one logit")
    return value.reshape(())
