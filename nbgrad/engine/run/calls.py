"""`M.calls[k]`, the k-th call of a module run several times in one forward, the home of that event kind: the `output`
event of `__nbgrad__.call_of(M, k)` (compile/siteaccess.py), a CallOf, hookable like a module (forward.py answers it).
Here: the hook that counts M's calls and passes on the k-th one's event as the CallOf's (key `(id(CallOf), kind)`),
for a loop's k every call's; the error for a k past M's last call. `M.output` stays M's first call. One pre-hook on M,
put first, counts from 0 while any CallOf of M is hooked (removed with the run's hooks: each run counts from 0)."""
from __future__ import annotations

import sys
import weakref
from functools import partial

from torch import nn

from ...errors import NbgradError
from .targets import target_elements


class Calls:
    """Counts the calls of one module while some event of one of them is hooked."""
    __slots__ = ("module_ref", "current", "holders", "handle", "by_index", "__weakref__")

    def __init__(self, module: nn.Module):
        self.module_ref = weakref.ref(module)
        self.current = -1                 # the index of M's latest call in this run (-1: none yet)
        self.holders: set = set()         # the handles of CallOf hooks on M now
        self.handle = None                # the counting pre-hook's, while there are holders
        self.by_index: dict = {}          # k -> CallOf, so that a run finds the same event for the same k

    def _count(self, module, args):
        self.current += 1

    def at(self, index: int) -> "CallOf":
        """The CallOf of M's call `index`: the same one for the same index, so that a run finds the same event."""
        return self.by_index.get(index) or self.by_index.setdefault(index, CallOf(self, index))

    @classmethod
    def of(cls, module: nn.Module) -> "Calls":     # M's, made on first use and kept while M lives
        return _calls.get(module) or _calls.setdefault(module, cls(module))

    def hold(self, register) -> "CallHandle":
        """`register()` (a hook on M, which returns torch's handle) with M's calls counted while it is held. An
        interrupt at any line leaves nothing behind: the handle is a holder before anything is registered."""
        handle = CallHandle(self)
        try:
            self.holders.add(handle)
            if self.handle is None:
                self.current = -1
                self.handle = self.module_ref().register_forward_pre_hook(self._count, prepend=True)
            handle.inner = register()
            return handle
        except BaseException:
            handle.remove()
            raise

    def drop(self, handle) -> None:
        """Let go of one holder; the last one takes the counting hook away. Safe to call twice."""
        self.holders.discard(handle)
        if not self.holders and self.handle is not None:
            self.handle.remove()          # torch's handle: removing it twice does nothing
            self.handle = None


class CallHandle:
    __slots__ = ("calls", "inner")

    def __init__(self, calls: Calls):
        self.calls, self.inner = calls, None

    def remove(self) -> None:
        if self.inner is not None:
            self.inner.remove()
        self.calls.drop(self)


class CallOf:
    """`M.calls[k]`: the events of M's k-th call. Hookable as a module is (HookSet and forward.py register its hooks
    through torch's names), each hook called at that call only, with the CallOf as its module."""
    __slots__ = ("calls", "index", "__weakref__")

    def __init__(self, calls: Calls, index: int):
        self.calls, self.index = calls, index

    def __repr__(self):
        return f"<call {self.index} of {type(self.calls.module_ref()).__name__}>"

    @property
    def module(self) -> nn.Module | None:
        return self.calls.module_ref()

    def register_forward_hook(self, hook, *, prepend: bool = False):
        calls, index = self.calls, self.index

        def at_call(module, args, output):
            if calls.current == index:
                return hook(self, args, output)
        return calls.hold(lambda: calls.module_ref().register_forward_hook(at_call, prepend=prepend))

    def register_forward_pre_hook(self, hook, *, with_kwargs: bool = False, prepend: bool = False):
        """After the counting hook, whatever `prepend` says: the count must be this call's when the hook asks."""
        calls, index = self.calls, self.index
        if with_kwargs:
            def at_call(module, args, kwargs):
                if calls.current == index:
                    return hook(self, args, kwargs)
        else:
            def at_call(module, args):
                if calls.current == index:
                    return hook(self, args)
        return calls.hold(lambda: calls.module_ref().register_forward_pre_hook(at_call, with_kwargs=with_kwargs))

    def past_last(self, use) -> str | None:
        """The message for an event of this call that never came because M ran fewer times (diagnose.never_ran)."""
        ran = self.calls.current + 1
        if ran > self.index or self.calls.module_ref() is None:
            return None
        module = use.target.rsplit(".calls[", 1)[0]
        times = "once" if ran == 1 else f"{ran} times"
        return (f"{use.target}.{use.kind} never came: {module} ran {times} in this forward, so it has no call "
                f"{self.index} (calls[k] counts from 0: k is at most {ran - 1})" if ran else
                f"{use.target}.{use.kind} never came: {module} did not run in this forward")


_calls: "weakref.WeakKeyDictionary[nn.Module, Calls]" = weakref.WeakKeyDictionary()


def call_of(target, index) -> CallOf:
    """`M.calls[k]` in a cell: the event of M's k-th call."""
    if not isinstance(target, nn.Module):
        raise NbgradError(f"`.calls[k]` takes the calls of a module; {type(target).__name__} is not one")
    if type(index) is not int and not (hasattr(index, "__index__") and not isinstance(index, bool)):
        raise NbgradError(f"`.calls[k]` takes an int k (the k-th call, from 0), not {type(index).__name__}")
    index = int(index.__index__())
    if index < 0:
        raise NbgradError(f"`.calls[{index}]`: k counts M's calls from 0; a negative k would count from the last "
                          f"call, and the number of calls is not known before the forward ends")
    return Calls.of(target).at(index)


def hook_every_call(events, module, kind: str) -> None:
    """`M.calls[k].EVENT` in a loop whose k is known only as it runs: every call of M hooked ahead, each delivered as
    its CallOf's event, so the loop may read them in any order; a call with a hook of its own is passed by."""
    hooks, kind = events.runtime.hooks, "input" if kind == "inputs" else kind
    if not isinstance(module, nn.Module) or (id(module), "calls", kind) in hooks:
        return
    calls = Calls.of(module)
    if kind == "output":
        def every(mod, args, output):
            key = (id(calls.at(calls.current)), "output")
            return None if key in hooks else events._on_event(key, None, args, output)
        register = partial(module.register_forward_hook, every)
    else:
        def every(mod, args, kwargs):
            call_id = id(calls.at(calls.current))
            return None if (call_id, "input") in hooks else events._on_input(call_id, args, kwargs)
        register = partial(module.register_forward_pre_hook, every, with_kwargs=True)
    hooks.add((id(module), "calls", kind), partial(calls.hold, register))


def note_called_again(events, key) -> None:
    """An event of a module came a second time in one forward (forward.py): where a statement reads it as
    `M.output` (M's first call), say once per run that `M.calls[k]` reads the k-th."""
    runtime = events.runtime
    told = runtime.__dict__.setdefault("told_calls", set())
    if key[0] in told or runtime.in_statement or not events.model_running:
        return
    told.add(key[0])
    for target in runtime.program.forward_targets:
        if target.kind == key[1] and target.uses and any(id(m) == key[0] for m in target_elements(target, runtime.ns)):
            use = events.uses[min(target.uses)]
            print(f"nbgrad: line {use.line}: {use.target} ran more than once in this forward; {use.target}.{use.kind} "
                  f"is its first call. Read the k-th call (k from 0) as {use.target}.calls[k].{use.kind}",
                  file=sys.stderr)
            return
