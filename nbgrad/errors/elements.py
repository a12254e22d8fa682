"""Why an edit that reads an element of a list or dict a loop made came too late, and what to write instead.

Statements are ordered by whole names: a statement that reads `clean[layer]` waits for the statement that binds
`clean`, and one that builds it in a comprehension or a loop finishes only after its last module, though the element
the edit needs existed long before. The remedy names the cell's own texts."""
from __future__ import annotations

import re

_LOOP_INDEX = re.compile(r"\[([A-Za-z_]\w*)\]")      # `h[i]`: a path indexed by a loop's variable
_INDEX = re.compile(r"\[([^\[\]]+)\]")                 # `h[2]`, `h[layer]`


def made_in_a_loop(cause) -> bool:
    """Whether the statement that binds the link reads its events in a loop (`model.transformer.h[i]`)."""
    return _LOOP_INDEX.search(cause.target) is not None


def read_by_element(use, cause, names: str) -> str:
    """The advice, for the edit `use` that waited on the loop of `cause` through `names` (`` `clean` ``)."""
    first = names.split(", ")[0].strip("`")
    index = _INDEX.findall(use.target)
    own = _LOOP_INDEX.sub(f"[{index[-1]}]", cause.target, count=1) if index else cause.target
    advice = (f". nbgrad orders statements by whole names, not elements: an element of {names} is there only once "
              f"line {cause.line} has read every module of its loop, after {use.target} has run. Read the element the "
              f"edit needs in a statement of its own")
    if index and not index[-1].lstrip("-").isdigit():
        return (f"{advice}: the read and the edit in one loop, an invoke each: `for {index[-1]} in ...:`, "
                f"`with invoke(...): {first} = {own}.{cause.kind}...`, then `with invoke(...): "
                f"{use.target}.{use.kind}... = {first}`")
    name = f"{first}_{index[-1].lstrip('-')}" if index else f"{first}_value"
    return (f"{advice}, in the invoke of line {cause.line}: `{name} = {own}.{cause.kind}...`, and edit with "
            f"`{name}`")
