"""`%attribute MODEL INPUT --target T [options]`: the line, read and handed to `nbgrad.attribute`."""
from __future__ import annotations

from IPython.core.error import UsageError

from ..attribution import attribute
from ..errors import InputError
from .magic_line import split_expression

USAGE = "usage: %attribute MODEL INPUT --target T [--method ig|saliency|grad-x-input] [--steps N] " \
        "[--site PATH] [--baseline EXPR] [--batch-size N]; see %attribute?"


def attribute_line(line: str, magic, model_of, evaluate):
    """Parse the line of `%attribute` (MODEL, a Python INPUT, options) and run the attribution; `model_of(name)`
    finds MODEL in the notebook and `evaluate(text, what)` evaluates an expression there."""
    head, _, rest = line.strip().partition(" ")
    if not head or head.startswith("-"):
        raise UsageError(USAGE)
    input_text, args = split_expression(rest, magic, head)
    model = model_of(head)
    if input_text is None:
        raise InputError(f"missing INPUT: {USAGE}")
    if args.target is None:
        raise InputError('missing --target: a token (--target " Paris"), a token id (--target 42) or the '
                         "name of a metric logits -> scalar (--target my_metric)")
    value = evaluate(input_text, "INPUT")
    try:
        target = evaluate(args.target, "--target")
    except InputError as error:
        raise InputError(f'{error}; a token is a Python string: --target " Paris"') from error.__cause__
    baseline = evaluate(args.baseline, "--baseline") if args.baseline else None
    site = args.site.strip("'\"") if args.site else None
    return attribute(model, value, target, method=args.method, site=site, baseline=baseline, steps=args.steps,
                     batch_size=args.batch_size)
