"""The one place that registers a hook or removes one: every handle of a run, removed together."""
from __future__ import annotations

from typing import Callable, Hashable


class HookSet:
    """Handles by key (a forward event, or a tensor), at most one per key."""

    def __init__(self):
        self._handles: dict = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self._handles

    def add(self, key: Hashable, register: Callable) -> bool:
        """Call `register()` (which returns a RemovableHandle) unless `key` is hooked; True when new."""
        if key in self._handles:
            return False
        self._handles[key] = register()
        return True

    def replace(self, key: Hashable, register: Callable) -> None:
        """Remove `key`'s handle, if any, and register again."""
        handle = self._handles.get(key)
        if handle is not None:
            handle.remove()           # kept until replaced: removing a handle twice does nothing
        self._handles[key] = register()

    def remove_all(self) -> None:
        """Remove every handle; safe to call twice, and after an interrupt at any line of it: a handle leaves
        the set only once it is removed."""
        handles = self._handles
        while handles:
            key = next(reversed(handles))
            handles[key].remove()
            del handles[key]
