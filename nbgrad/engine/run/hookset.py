"""Every hook handle of a run, removed together: the one place that removes one. A module's output hook and a
tensor's gradient hook go in through `HookSet.forward_hook` and `HookSet.grad_hook`, which cost less than torch's
`register_forward_hook` and `Tensor.register_hook` (see there); the rest register through `add` and `replace`."""
from __future__ import annotations

import itertools
from collections import OrderedDict
from functools import partial
from typing import Callable, Hashable

from torch import Tensor, nn

from .torchcheck import require_private_hooks

require_private_hooks()

_REGISTER = nn.Module.register_forward_hook
# Negative: torch numbers its own handles from 0 up, so an id of ours is never one of its own, nor in the sets
# of hooks it calls with keyword arguments or always
_hook_ids = itertools.count(-1, -1)


class DictHandle(partial):
    """The handle `HookSet.forward_hook` and `HookSet.grad_hook` give: `remove()` is `hooks.pop(id, None)` on the
    module's `_forward_hooks` or the tensor's `_backward_hooks`, run by partial's own call, so that neither making
    nor removing one runs Python code. Removing it twice does nothing, as with torch's RemovableHandle."""
    __slots__ = ()
    remove = partial.__call__


class HookSet(dict):
    """Handles by key (a forward event, or a tensor), at most one per key. A dict, so that `key in hooks`,
    asked at every event, costs no Python call."""

    def add(self, key: Hashable, register: Callable) -> bool:
        """Call `register()` (which returns a RemovableHandle) unless `key` is hooked; True when new."""
        if key in self:
            return False
        self[key] = register()
        return True

    def forward_hook(self, key: Hashable, module, hook: Callable, prepend: bool = False) -> None:
        """`self[key] = module.register_forward_hook(hook, prepend=prepend)`, with the same effect: the hook goes last
        into `module._forward_hooks`, which `Module._call_impl` runs in order. Torch's way makes a RemovableHandle (three
        weak references, a generator: microseconds each, cold), and is kept for a hook that goes first, a module whose
        class registers hooks its own way, and whatever else is hookable (a site, a skip)."""
        if prepend or type(module).register_forward_hook is not _REGISTER:
            self[key] = module.register_forward_hook(hook, prepend=prepend)
            return
        hooks = module._forward_hooks
        hook_id = next(_hook_ids)
        self[key] = DictHandle(hooks.pop, hook_id, None)   # first: an interrupt here leaves no hook behind
        hooks[hook_id] = hook

    def forward_hooks(self, hooks: list) -> None:
        """`forward_hook(key, module, hook)` for each triple whose key is not hooked yet, in one call: a loop of
        on-event functions hooks its every block so as it starts (hookloops.py), a call per block less."""
        for key, module, hook in hooks:
            if key in self:
                continue
            if type(module).register_forward_hook is not _REGISTER:
                self[key] = module.register_forward_hook(hook)
                continue
            hook_id = next(_hook_ids)
            self[key] = DictHandle(module._forward_hooks.pop, hook_id, None)    # first, as in `forward_hook`
            module._forward_hooks[hook_id] = hook

    def grad_hook(self, key: Hashable, tensor: Tensor, hook: Callable) -> None:
        """`self[key] = tensor.register_hook(hook)` with the same effect on the backward pass: the hook goes last into
        the tensor's `_backward_hooks`, as torch's own method puts it, the dict made and given to the tensor's
        grad_fn as torch does on a first hook. Torch's way makes a RemovableHandle, as `forward_hook` says. A tensor
        subclass or Parameter, and a tensor that does not require grad (torch's error), go to torch's way."""
        grad_fn = tensor.grad_fn        # read first: a view edited in place gets its grad_fn anew (register_grad_hook)
        if type(tensor) is not Tensor or not tensor.requires_grad:
            self[key] = tensor.register_hook(hook)
            return
        hooks = tensor._backward_hooks
        if hooks is None:
            hooks = tensor._backward_hooks = OrderedDict()
            if grad_fn is not None:
                grad_fn._register_hook_dict(tensor)
        hook_id = next(_hook_ids)
        self[key] = DictHandle(hooks.pop, hook_id, None)   # first: an interrupt here leaves no hook behind
        hooks[hook_id] = hook

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
