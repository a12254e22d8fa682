"""Every hook handle of a run, removed together: the one place that removes one. The hot paths (a module's
output, a tensor's gradient) register theirs in place and store the handle here, without HookSet.add's
two calls; the rest register through `add` and `replace`."""
from __future__ import annotations

from typing import Callable, Hashable


class HookSet(dict):
    """Handles by key (a forward event, or a tensor), at most one per key. A dict, so that `key in hooks`,
    asked at every event, costs no Python call."""

    def add(self, key: Hashable, register: Callable) -> bool:
        """Call `register()` (which returns a RemovableHandle) unless `key` is hooked; True when new."""
        if key in self:
            return False
        self[key] = register()
        return True

    def replace(self, key: Hashable, register: Callable) -> None:
        """Remove `key`'s handle, if any, and register again."""
        handle = self.get(key)
        if handle is not None:
            handle.remove()           # kept until replaced: removing a handle twice does nothing
        self[key] = register()

    def remove_all(self) -> None:
        """Remove every handle; safe to call twice, and after an interrupt at any line of it: the set is emptied
        only once every handle is removed, and removing a handle again does nothing. Last registered, first
        removed (a site's forward is given back before the skip gate around it)."""
        for handle in list(reversed(self.values())):
            handle.remove()
        self.clear()
