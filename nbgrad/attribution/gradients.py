"""`nbgrad.attribute`: saliency, gradient × input and integrated gradients at any site, built on
Captum (its integrated gradients with Gauss-Legendre steps, its internal batching, its convergence
delta) over a function of the site's activation that plain forward hooks provide."""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import InputError, NbgradError
from .progress import progress
from .prompt import Prompt, prepare, scorer, target_notes, token_id
from .result import Attribution
from .sites import eval_mode, hooked, main_tensor, replacing, resolve

METHODS = ("ig", "saliency", "grad-x-input")
NAMES = {"ig": "integrated gradients", "saliency": "saliency", "grad-x-input": "gradient × input"}


def attribute(model: nn.Module, input, target, method: str = "ig", site: str | None = None, baseline=None,
              steps: int = 64, batch_size: int = 16) -> Attribution:
    """Attribute one prediction of `model` on `input` to the tokens, through the output of `site`
    (None: the input embeddings). See SPEC §5b. The model runs in eval mode; its mode, hooks, flags and
    `.grad`s are left as they were."""
    if not isinstance(model, nn.Module) and hasattr(model, "call"):     # a model elsewhere (nbgrad.remote): run there
        return model.call(attribute, input, target, method, site, baseline, steps, batch_size)
    _check(method, steps, batch_size)
    with eval_mode(model):
        prompt = prepare(model, input)
        name, module = _site(model, site)
        activation = capture(model, module, prompt)
        forward = SiteFunction(model, module, prompt, scorer(model, target))
        if method == "ig":
            base = _baseline(model, module, prompt, baseline, activation)
            attributions, delta = _integrated(forward, activation, base, steps, batch_size)
        else:
            attributions, delta = _gradient(forward, activation, method), None
    scores = per_position(attributions)
    change = None if delta is None else float(attributions.double().sum()) - delta
    labels = prompt.tokens if len(prompt.tokens) == scores.shape[0] else [str(i) for i in range(scores.shape[0])]
    return Attribution(scores=scores, labels=labels, method=method, delta=delta, tokens=prompt.tokens,
                       sites=[name], change=change, title=_title(model, method, target, name, steps),
                       notes=target_notes(model, target))


class SiteFunction:
    """F(a): the score of the model when the output of `module` is replaced by the activations `a`
    (one row per interpolation point; the prompt is repeated to match)."""

    def __init__(self, model: nn.Module, module: nn.Module, prompt: Prompt, score):
        self.model, self.module, self.prompt, self.score = model, module, prompt, score
        self.after_each_call = []

    def __call__(self, activation: torch.Tensor) -> torch.Tensor:
        args, kwargs = self.prompt.expanded(activation.shape[0])
        with hooked([replacing(self.module, lambda _original: activation)]):
            output = self.model(*args, **kwargs)
        for tick in self.after_each_call:
            tick()
        return self.score(output)


def capture(model: nn.Module, module: nn.Module, prompt: Prompt) -> torch.Tensor:
    """The output (main tensor) of `module`'s first call when the model runs on `prompt`, detached."""
    seen = []

    def keep(_module, _inputs, output):
        if not seen:
            seen.append(main_tensor(output))
    with torch.no_grad(), hooked([(module, keep)]):
        model(*prompt.args, **prompt.kwargs)
    if not seen:
        raise NbgradError(f"the site ({type(module).__name__}) never ran when the model ran on this input")
    if seen[0] is None or not seen[0].is_floating_point():
        raise NbgradError(f"the site ({type(module).__name__}) returned no floating-point tensor to attribute")
    return seen[0].detach().clone()


def _site(model: nn.Module, site):
    if site is not None:
        return resolve(model, site)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None:
        raise NbgradError(f"site=None means the input embeddings, and {type(model).__name__} has no "
                          f"get_input_embeddings(): give site='path.of.a.module'")
    return next((n for n, m in model.named_modules() if m is embeddings), "input embeddings"), embeddings


def _baseline(model, module, prompt: Prompt, baseline, activation: torch.Tensor) -> torch.Tensor:
    """Zeros; a float tensor (the site's activation, broadcast); a number; or a prompt of the same length
    (text or token ids), whose activation at the site is the baseline."""
    if baseline is None:
        return torch.zeros_like(activation)
    if isinstance(baseline, (int, float)) and not isinstance(baseline, bool):
        return torch.full_like(activation, float(baseline))
    if isinstance(baseline, torch.Tensor) and baseline.is_floating_point():
        try:
            return baseline.to(activation).expand_as(activation).clone()
        except RuntimeError as error:
            raise InputError(f"baseline of shape {tuple(baseline.shape)} does not fit the site's activation "
                             f"{tuple(activation.shape)}") from error
    other = prepare(model, baseline, "baseline")
    if other.ids is not None and prompt.ids is not None and other.ids.shape[-1] != prompt.ids.shape[-1]:
        raise InputError(f"baseline has {other.ids.shape[-1]} tokens and the input {prompt.ids.shape[-1]}: a "
                         f"baseline prompt must have the same length (pad it, or give a tensor)")
    return capture(model, module, other)


def _integrated(forward: SiteFunction, activation, base, steps: int, batch_size: int) -> tuple:
    from captum.attr import IntegratedGradients
    batches = math.ceil(steps / batch_size)
    with progress(batches + 2, "integrated gradients") as bar:
        forward.after_each_call.append(bar.update)
        attributions, delta = IntegratedGradients(forward).attribute(
            activation, baselines=base, n_steps=steps, method="gausslegendre", internal_batch_size=batch_size,
            return_convergence_delta=True)
    return attributions.detach(), float(delta.reshape(-1)[0])


def _gradient(forward: SiteFunction, activation, method: str) -> torch.Tensor:
    from captum.attr import InputXGradient, Saliency
    activation = activation.clone().requires_grad_(True)
    if method == "saliency":
        return Saliency(forward).attribute(activation, abs=True).detach()
    return InputXGradient(forward).attribute(activation).detach()


def per_position(attributions: torch.Tensor) -> torch.Tensor:
    """[1, positions, hidden...] -> [positions]: summed over every axis after the position axis."""
    row = attributions[0]
    return row.sum(dim=tuple(range(1, row.dim()))) if row.dim() >= 2 else row.reshape(-1)


def _check(method: str, steps: int, batch_size: int) -> None:
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}: use one of {', '.join(repr(m) for m in METHODS)}")
    if int(steps) < 1 or int(batch_size) < 1:
        raise InputError(f"steps ({steps}) and batch_size ({batch_size}) must be at least 1")


def _title(model, method: str, target, site: str, steps: int) -> str:
    if callable(target):
        what = f"metric {getattr(target, '__name__', 'metric')}"
    else:
        from ..models import tokenizer_for
        index, tokenizer = token_id(model, target), tokenizer_for(model)
        what = f"logit of {tokenizer.decode([index])!r}" if tokenizer is not None else f"logit {index}"
        what += " at the last position"
    detail = f", {steps} steps" if method == "ig" else ""
    return f"{NAMES[method]} of the {what}, through {site}{detail}"
