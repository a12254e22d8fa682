"""What a Target names before the run (compile/program.py): the modules and sites to hook ahead, so that a
statement may read them in any order."""
from __future__ import annotations

import types
from collections.abc import Iterator, MappingView

from torch import nn

# What a loop over modules may take its elements from (never a tensor, whose rows are not modules)
LISTINGS = (list, tuple, nn.ModuleList, nn.Sequential, Iterator, MappingView)


def target_elements(target, namespace: dict) -> tuple | list:
    """What a Target names now: the module (or tensor) of a path, or what a loop's expression names in each
    element of its container. Nothing when it cannot be evaluated yet (the statement itself will report it, on
    its own line), or when evaluating it would iterate an iterator of the user's (`it = iter(blocks)`), which
    the loop itself is to consume: that loop's reads are then answered in forward order only."""
    try:
        text = target.text
        if target.base is None and text in namespace and text.isidentifier():      # a name: no code to run
            found = namespace[text]
        else:
            found = eval(target.code if target.base is None else target.base, namespace)
        if target.every_element and isinstance(found, Iterator):
            return ()
        if target.base is not None:
            found = eval(target.code, namespace)
        if target.keep is not None and not isinstance(found, (dict, nn.ModuleDict)):
            found = kept_elements(found, types.FunctionType(target.keep, namespace))
        found = elements(found) if target.every_element else (found,)
        return found if target.each is None else derived(found, eval(target.each, namespace))
    except Exception:
        return ()


def kept_elements(container, keep):
    """The elements of an iterable that a loop's condition keeps (an element it cannot judge is kept)."""
    if not isinstance(container, LISTINGS):
        return container
    kept = []
    for item in container:
        try:
            wanted = keep(item)
        except Exception:
            wanted = True
        if wanted:
            kept.append(item)
    return kept


def derived(found, each) -> list:
    """`each(element)` for every element it can be asked of (`b.attn` of each block; a name from
    `named_modules()`, or a module without `attn`, is passed over)."""
    parts = []
    for element in found:
        try:
            parts.append(each(element))
        except Exception:
            continue
    return parts


def elements(container) -> list:
    """What a Target with `every_element` names: the elements of a list, tuple or dict, the modules of a
    ModuleList, Sequential or ModuleDict, or what a listing such as `reversed(...)` or `named_modules()`
    yields, with the module taken out of each `(name, module)` pair (never the rows of a tensor)."""
    if isinstance(container, (dict, nn.ModuleDict)):
        return list(container.values())
    if not isinstance(container, LISTINGS):
        return []
    parts = []                  # a loop, not a comprehension: one call less, before every loop cell
    for item in container:
        if type(item) is tuple:
            parts.extend(item)
        else:
            parts.append(item)
    return parts
