"""`nbgrad.attribution_patching`: the linear estimate of activation patching at every (site, position)
from one clean forward and one corrupt forward + backward; exact patching of the top pairs to check it."""
from __future__ import annotations

import torch
from torch import nn

from ..errors import InputError
from ..errors.naming import a_or_an
from ..engine.run.gradients import register_grad_hook
from .progress import progress
from .prompt import Prompt, prepare
from .prompt import _scalar as scalar
from .result import Attribution
from .sites import eval_mode, hooked, logits_of, main_tensor, matching, replacing


def attribution_patching(model: nn.Module, clean, corrupt, metric, sites="*", positions=True,
                         check_top: int = 0) -> Attribution:
    """Scores ≈ metric(corrupt run with the site's clean activation patched in) − metric(corrupt run),
    estimated as (clean − corrupt) · ∂metric/∂activation on the corrupt run, summed over the hidden axis.
    `sites`: glob(s) over `model.named_modules()` names; `positions`: True (each position), False
    (whole sites), or position indices. See SPEC §5b."""
    if not isinstance(model, nn.Module) and hasattr(model, "call"):     # a model elsewhere (nbgrad.remote): run there
        return model.call(attribution_patching, clean, corrupt, metric, sites, positions, check_top)
    if isinstance(check_top, bool) or not isinstance(check_top, int) or check_top < 0:
        raise InputError(f"check_top is how many of the highest scores to check by exact patching, a whole number "
                         f"of at least 0, not {check_top!r}")
    if not callable(metric):
        raise InputError(f"metric must be a callable logits -> scalar, not {a_or_an(type(metric).__name__)}")
    with eval_mode(model):
        clean_prompt, corrupt_prompt = prepare(model, clean, "clean", True), prepare(model, corrupt, "corrupt", True)
        length, rows = _same_length(clean_prompt, corrupt_prompt), _same_rows(clean_prompt, corrupt_prompt)
        candidates = matching(model, sites)
        clean_acts, _, _ = record(model, candidates, clean_prompt)
        corrupt_acts, grads, (value, scale) = record(model, candidates, corrupt_prompt, metric)
        names, skipped = usable(candidates, clean_acts, corrupt_acts, length, positions is not False, rows)
        if not names:
            raise InputError(f"no site among {len(candidates)} matched modules returns a floating-point tensor "
                             f"[{rows}, positions, ...]: {', '.join(n for n, _ in candidates[:5])}")
        columns = _columns(positions, length or clean_acts[names[0]].shape[1])
        pairs = scale * torch.stack([estimate(clean_acts[n], corrupt_acts[n], grads.get(n), columns) for n in names],
                                    dim=1)
        scores = pairs.mean(0)
        modules = dict(candidates)
        exact = None
        if check_top:
            top = _top_pairs(scores, int(check_top))
            exact = exact_effects(model, [(n, modules[n]) for n in names], clean_acts, corrupt_prompt, metric,
                                  scores, columns, top)
    return _result(scores, names, columns, clean_prompt, corrupt_prompt, exact, skipped, value,
                   pairs if rows > 1 else None)


def record(model: nn.Module, candidates: list, prompt: Prompt, metric=None) -> tuple:
    """One forward on `prompt` with the site outputs recorded (values cloned, so later in-place edits
    inside the model do not change them); with a metric, also its backward: gradients at each site."""
    acts, grads, originals = {}, {}, []

    def recorder(name):
        def hook(_module, _inputs, output):
            tensor = main_tensor(output)
            if name in acts or tensor is None or not tensor.is_floating_point():
                acts.setdefault(name, None)
                return
            acts[name] = tensor.detach().clone()
            if metric is not None:
                if not tensor.requires_grad:
                    tensor.requires_grad_(True)     # frozen weights before this site: start the graph here
                register_grad_hook(tensor, lambda grad: grads.__setitem__(name, grad.detach()))
                originals.append(tensor)
        return hook
    with torch.enable_grad(), hooked([(module, recorder(name)) for name, module in candidates]):
        output = model(*prompt.args, **prompt.kwargs)
        if metric is None:
            return acts, grads, None
        value, mean, scale = batch_metric(metric(logits_of(output)), prompt.rows)
        if value.requires_grad and originals:
            torch.autograd.grad(value, originals, allow_unused=True)
    return acts, grads, (float(mean.detach()), scale)


def batch_metric(value, rows: int) -> tuple:
    """(what to backpropagate, the metric's value, the factor from a row's gradient to its pair's estimate).
    Over a batch of pairs the metric gives one value per pair (`[pairs]`: each pair's own gradient) or one
    scalar, read as the mean over pairs (as the tutorials write it): a pair's gradient is then 1/pairs of its
    own."""
    if rows > 1 and isinstance(value, torch.Tensor) and tuple(value.shape) == (rows,):
        return value.sum(), value.mean(), 1
    if rows > 1 and not (isinstance(value, torch.Tensor) and value.numel() == 1):
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise InputError(f"over {rows} pairs the metric returns one value per pair (a tensor [{rows}]) or their "
                         f"mean (a scalar); it returned {shape}")
    value = scalar(value)
    return value, value, rows


def usable(candidates: list, clean: dict, corrupt: dict, length: int | None, by_position: bool,
           rows: int = 1) -> tuple:
    names, skipped = [], []
    for name, _ in candidates:
        a, b = clean.get(name), corrupt.get(name)
        fits = a is not None and b is not None and a.shape == b.shape and a.dim() >= 1 and a.shape[0] == rows
        if fits and by_position:
            fits = a.dim() >= 2 and (length is None or a.shape[1] == length)
        (names if fits else skipped).append(name)
    return names, skipped


def estimate(clean: torch.Tensor, corrupt: torch.Tensor, grad, columns) -> torch.Tensor:
    """Per row (pair): (clean − corrupt) · grad summed over the hidden axes, per chosen position ([rows,
    columns]) or over the whole site ([rows])."""
    if grad is None:      # the metric does not depend on this site
        grad = torch.zeros_like(corrupt)
    product = (clean - corrupt) * grad
    if columns is None:
        return product.reshape(product.shape[0], -1).sum(-1)
    return product.reshape(*product.shape[:2], -1).sum(-1)[:, columns]


def exact_effects(model, sites: list, clean_acts: dict, prompt: Prompt, metric, scores, columns, top) -> torch.Tensor:
    """metric(corrupt run with the clean activation patched in at one site and position) − metric(corrupt
    run), for each (site index, column index) in `top`; NaN elsewhere."""
    exact = torch.full_like(scores, float("nan"))
    with torch.no_grad():
        reference = float(batch_metric(metric(logits_of(model(*prompt.args, **prompt.kwargs))), prompt.rows)[1])
        with progress(len(top), "exact patching") as bar:
            for index in top:
                name, module = sites[index[0]]
                position = None if columns is None else columns[index[1]]
                patch = replacing(module, _patcher(clean_acts[name], position))
                with hooked([patch]):
                    output = model(*prompt.args, **prompt.kwargs)
                exact[tuple(index)] = float(batch_metric(metric(logits_of(output)), prompt.rows)[1]) - reference
                bar.update()
    return exact


def _patcher(clean: torch.Tensor, position):
    def patch(corrupt: torch.Tensor) -> torch.Tensor:
        if position is None:
            return clean.to(corrupt, copy=True)
        patched = corrupt.clone()
        patched[:, position] = clean[:, position].to(corrupt)
        return patched
    return patch


def _top_pairs(scores: torch.Tensor, k: int) -> list:
    flat = scores.abs().reshape(-1)
    order = torch.argsort(flat, descending=True, stable=True)[:min(k, flat.numel())]
    return [list(divmod(int(i), scores.shape[1])) if scores.dim() == 2 else [int(i)] for i in order]


def _same_rows(clean: Prompt, corrupt: Prompt) -> int:
    if clean.rows != corrupt.rows:
        raise InputError(f"clean has {_rows(clean.rows)} and corrupt has {_rows(corrupt.rows)}: attribution "
                         f"patching compares them pair by pair; give one corrupt prompt per clean prompt")
    return clean.rows


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


def _same_length(clean: Prompt, corrupt: Prompt) -> int | None:
    if clean.ids is None or corrupt.ids is None:
        return None
    a, b = clean.ids.shape[-1], corrupt.ids.shape[-1]
    if a != b:
        raise InputError(f"clean has {a} tokens and corrupt has {b}: attribution patching compares them "
                         f"position by position; give prompts of the same length")
    return a


def _columns(positions, length: int):
    if positions is True:
        return list(range(length))
    if positions is False:
        return None
    chosen = [positions] if isinstance(positions, int) else list(positions)
    for p in chosen:
        if not -length <= int(p) < length:
            raise InputError(f"position {p} is outside the prompt's {length} positions")
    return [int(p) % length for p in chosen]


def _result(scores, names, columns, clean: Prompt, corrupt: Prompt, exact, skipped, value, pairs) -> Attribution:
    tokens = clean.tokens
    if columns is None:
        labels = list(names)
    else:
        labels = (list(names), [_position_label(tokens, corrupt.tokens, p) for p in columns])
    notes = [f"metric on the corrupt run: {value:.6g}"]
    if pairs is not None:
        notes.append(f"{pairs.shape[0]} pairs: the scores are their mean; .pairs holds each pair's")
    if skipped:
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        notes.append(f"skipped {len(skipped)} matched modules whose output is not a floating-point tensor "
                     f"[1, positions, ...]: {', '.join(skipped[:5])}{more}")
    return Attribution(scores=scores.detach(), labels=labels, method="attribution patching", exact=exact,
                       pairs=None if pairs is None else pairs.detach(),
                       tokens=tokens, sites=list(names), notes=notes,
                       title="attribution patching: (clean − corrupt) · ∂metric/∂activation on the corrupt run")


def _position_label(clean_tokens: list, corrupt_tokens: list, position: int) -> str:
    if position >= len(clean_tokens):
        return str(position)
    a = clean_tokens[position]
    b = corrupt_tokens[position] if position < len(corrupt_tokens) else a
    return a if a == b else f"{a}→{b}"
