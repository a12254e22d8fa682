"""Read a magic line: `MODEL INPUT --option VALUE ...` or `LOSS --option VALUE ...`.

INPUT, LOSS and option values are Python expressions: they may hold spaces, brackets, strings and
minus signs (`--grad-output torch.ones(3, dtype=torch.long)`). The line is split into words at
whitespace outside brackets and strings; a word `--name` (or a one-letter `-q`) starts an option,
and the words up to the next option are its value. Every option is checked against the magic's
`magic_arguments`, so `--bogus` is reported as an unknown option, never read as part of INPUT.
"""
from __future__ import annotations

import ast
import re

from IPython.core.error import UsageError

from ..errors import InputError

OPTION = re.compile(r"--[A-Za-z][\w-]*(=.*)?|-[A-Za-z]", re.DOTALL)
_CLOSING = {"(": ")", "[": "]", "{": "}"}


def words(text: str) -> list:
    """(start, end) of each word of `text`: whitespace outside brackets and strings separates words."""
    spans, start, depth, index = [], None, [], 0
    while index < len(text):
        char = text[index]
        if start is None and not char.isspace():
            start = index
        if char in "'\"":
            index = _string_end(text, index)
            continue
        if char in _CLOSING:
            depth.append(_CLOSING[char])
        elif depth and char == depth[-1]:
            depth.pop()
        elif char.isspace() and not depth and start is not None:
            spans.append((start, index))
            start = None
        index += 1
    if start is not None:
        spans.append((start, len(text)))
    return spans


def _string_end(text: str, index: int) -> int:
    """The index just after the string literal that opens at `index` (or the end of the text)."""
    quote = text[index] * 3 if text.startswith(text[index] * 3, index) else text[index]
    index += len(quote)
    while index < len(text):
        if text[index] == "\\":
            index += 2
        elif text.startswith(quote, index):
            return index + len(quote)
        else:
            index += 1
    return index


def split_line(text: str, magic, positional: list) -> tuple:
    """(the text before the first option, the parsed options) for `magic`'s line `text`.

    `positional` fills the parser's positional arguments (nbgrad reads them from the text itself)."""
    spans = words(text)
    first = next((i for i, (a, b) in enumerate(spans) if OPTION.fullmatch(text[a:b])), len(spans))
    head = text[:spans[first][0]].strip() if first < len(spans) else text.strip()
    argv, index = list(positional), first
    while index < len(spans):
        start, end = spans[index]
        word = text[start:end]
        name, has_value, inline = word.partition("=")
        action = _action(magic, name)
        following = index + 1
        while following < len(spans) and not OPTION.fullmatch(text[slice(*spans[following])]):
            following += 1
        rest = text[end:spans[following - 1][1]] if following > index + 1 else ""
        value = (inline + rest).strip() if has_value else rest.strip()
        argv.append(_option_word(magic, name, action, value, bool(has_value)))
        index = following
    return head, magic.parser.parse_args(argv)


def _action(magic, name: str):
    actions = magic.parser._option_string_actions
    if name not in actions:
        known = sorted({strings[-1] for strings in (a.option_strings for a in magic.parser._actions) if strings})
        raise UsageError(f"unknown option {name} for %%{_magic_name(magic)}; its options are {', '.join(known)} "
                         f"(see %%{_magic_name(magic)}?)")
    return actions[name]


def _option_word(magic, name: str, action, value: str, has_value: bool) -> str:
    magic_name = _magic_name(magic)
    if action.nargs == 0:
        if value or has_value:
            raise UsageError(f"{name} takes no value, but `{value}` follows it: write INPUT / LOSS before the "
                             f"options (see %%{magic_name}?)")
        return name
    if not value:
        raise UsageError(f"{name} needs a value: {action.help} (see %%{magic_name}?)")
    if action.type is None and not is_expression(value):
        raise UsageError(f"{name} `{value}` is not a Python expression")
    return f"{name}={value}"


def _magic_name(magic) -> str:
    return getattr(magic, "__name__", "magic")


def evaluate(text: str, namespace: dict, what: str):
    """A magic line's expression, evaluated in the notebook; what it raises becomes one InputError line."""
    try:
        return eval(text, namespace)
    except Exception as error:
        raise InputError(f"{what} `{text}` could not be evaluated: {type(error).__name__}: {error}") from error


def is_expression(text: str) -> bool:
    try:
        ast.parse(text, mode="eval")
        return True
    except SyntaxError:
        return False


def split_expression(rest: str, magic, head: str) -> tuple:
    """`EXPR --options` -> (EXPR or None, parsed options); EXPR is Python (quotes, brackets, spaces)."""
    expression, parsed = split_line(rest, magic, [head])
    if expression and not is_expression(expression):
        raise UsageError(f"cannot read `{expression}` as a Python expression; see %{magic.__name__}?")
    return expression or None, parsed
