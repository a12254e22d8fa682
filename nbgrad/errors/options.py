"""Keyword options of the public calls checked by name: an unknown one is one message that names it, the nearest
option taken (a misspelling) and all the options, before anything runs, rather than Python's bare
"unexpected keyword argument"."""
from __future__ import annotations

import difflib
import functools
import inspect

from . import ArgumentError


def options_of(function, defaults_only: bool = True) -> tuple[str, ...]:
    """The keywords `function` takes by name (those with a default: its options), its private ones (`_aliased`)
    left out."""
    return tuple(name for name, parameter in inspect.signature(function).parameters.items()
                 if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
                 and not name.startswith("_") and not (defaults_only and parameter.default is parameter.empty))


def unknown_option(where: str, given: str, options, names=None) -> ArgumentError:
    """`given=` is not taken: the nearest of `names` (every keyword, `options` by default) and the options."""
    near = difflib.get_close_matches(given, names or options, n=1, cutoff=0.6)
    meant = f"did you mean {near[0]}=? " if near else ""
    return ArgumentError(f"{where}: unknown option {given}=; {meant}its options are {', '.join(options)}")


def checked_options(where: str):
    """Decorate a public call named `where` (e.g. "nbgrad.trace") so that a keyword it does not take is said as
    `unknown_option` says it."""
    def decorate(function):
        taken = set(inspect.signature(function).parameters)
        options, names = options_of(function), options_of(function, defaults_only=False)

        @functools.wraps(function)
        def call(*args, **kwargs):
            if not taken.issuperset(kwargs):
                raise unknown_option(where, next(k for k in kwargs if k not in taken), options, names)
            return function(*args, **kwargs)
        return call
    return decorate
