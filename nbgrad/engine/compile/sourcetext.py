"""The cell text an API call was given: a string, or one clear message before anything parses it."""
from __future__ import annotations

from ...errors import ArgumentError
from ...errors.naming import a_or_an


def check_source(source, call: str) -> str:
    """`source` of `nbgrad.trace` / `backward` / `edit` / `scan` is the body of a cell, as text: returned as it is."""
    if not isinstance(source, str):
        text = repr(source)
        shown = f" `{text}`" if len(text) <= 40 else ""
        what = "None" if source is None else f"{a_or_an(type(source).__name__)}{shown}"
        example = "model.transformer.h[0].output[:, -1] = 0" if call == "nbgrad.edit" else \
            "h = model.transformer.h[0].output.save()"
        raise ArgumentError(f"{call}: source is {what}, not a str: give the body of the cell as text (e.g. "
                            f"\"{example}\")")
    return source
