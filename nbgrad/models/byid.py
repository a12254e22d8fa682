"""Caches per model (or tokenizer) read before every cell: plain dicts by `id(obj)` whose every entry starts
with a weak reference to obj. A look-up is `entry = table.get(id(obj))` and `entry[0]() is obj`, all in C; a
WeakKeyDictionary's `get` is a Python call of its own and makes a new reference each time."""
from __future__ import annotations

import weakref


def weakly(obj, table: dict) -> weakref.ref:
    """A weak reference to obj that removes obj's entry from `table` when obj goes (only its own entry: a
    later object given the same id keeps the one made for it). TypeError if obj cannot be referenced."""
    key = id(obj)

    def gone(ref):
        entry = table.get(key)
        if entry is not None and entry[0] is ref:
            del table[key]
    return weakref.ref(obj, gone)
