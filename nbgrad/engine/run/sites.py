"""`M.source.SITE`: sites inside a forward, hookable like modules. A Site offers `register_forward_pre_hook` /
`register_forward_hook` with nn.Module's signatures, so the runtime hooks it exactly as it hooks a module (same
HookSet, same events, same order and invoke rules). While any site of a module holds a hook, the module's instance
`forward` is a rewritten copy of its forward whose every call and assignment goes through its sites (see
compile/sites.py); the handle that removes the last hook gives the instance its own forward back. No hook, no copy:
runs that name no site run the class's forward untouched."""
from __future__ import annotations

import types
import weakref

from torch import nn

from ...errors import NbgradError
from ...errors.sitenames import callee_has_no_site, calls_a_module, no_site, not_a_call
from .skips import ABSENT, gate_in_place, give_back_forward
from ..compile.sites import NoSourceError, bind, innermost, rewrap, rewritten, site_code


class SiteError(NbgradError, LookupError):
    """A site name the forward does not have, or a site that cannot be used the way the cell asks."""


class SiteNameError(SiteError, AttributeError):
    """`M.source.NAME` for a NAME M's forward has no site of: an AttributeError as well, so that `hasattr` and
    `getattr(..., default)` answer of a source as of any object."""


class _Handle:
    """Removes one site hook; safe to call twice, and again after an interrupt cut it short."""

    def __init__(self, site: "Site", hooks: dict):
        self.site, self.hooks = site, hooks

    def remove(self):
        self.hooks.pop(id(self), None)
        self.site.table.root.release(self)


class Site:
    """One call or assignment in a forward. `.source` opens the function the call calls."""

    def __init__(self, table: "SiteTable", name: str):
        self.table, self.name = table, name
        self.pre: dict = {}            # handle id -> hook(site, args, kwargs)
        self.post: dict = {}           # handle id -> hook(site, args, output)
        self.inner: CalleeSource | None = None

    @property
    def source(self) -> "CalleeSource":
        if self.inner is None:
            self.inner = CalleeSource(self)
        return self.inner

    def __repr__(self):
        return f"<site {self.table.label}.{self.name}>"

    def __getattr__(self, name: str):        # only for a name a Site does not have
        if name.startswith("__") or "table" not in self.__dict__:     # (a copy being made: its fields not set yet)
            raise AttributeError(name)
        raise AttributeError(f"the site {self.table.label}.{self.name} has no attribute {name!r}: a site has .output, "
                             f".input, .inputs, .grad and .source")

    def register_forward_pre_hook(self, hook, *, with_kwargs: bool = False, prepend: bool = False):
        return self._add(self.pre, hook, prepend)

    def register_forward_hook(self, hook, *, prepend: bool = False):
        return self._add(self.post, hook, prepend)

    def _add(self, hooks: dict, hook, prepend: bool):
        handle = _Handle(self, hooks)
        try:
            hooks[id(handle)] = hook
            if prepend:         # first to see the value, as torch's prepend (a cache sees it before edits)
                for key in [k for k in hooks if k != id(handle)]:
                    hooks[key] = hooks.pop(key)
            self.table.root.acquire(handle)
            return handle           # inside the try: an interrupt on this line is still ours to undo
        except BaseException:       # an interrupt before the caller holds the handle: nobody else could remove it
            handle.remove()
            raise

    def busy(self) -> bool:
        return bool(self.pre or self.post or (self.inner is not None and self.inner.sites_busy()))

    def fire(self, callee, args: tuple, kwargs: dict):
        for hook in list(self.pre.values()):
            replaced = hook(self, args, kwargs)
            if replaced is not None:
                args, kwargs = replaced
        if self.inner is not None and self.inner.sites_busy():
            callee = self.inner.opened(callee)
        output = callee(*args, **kwargs)
        for hook in list(self.post.values()):
            replaced = hook(self, args, output)
            if replaced is not None:
                output = replaced
        return output


class SiteTable:
    """The sites of one function, by name; `dispatch` is what its rewritten copy calls at every site."""
    root: "ModuleSource"
    label: str

    def __init__(self):
        self.sites: dict = {}

    def site(self, name: str) -> Site:
        if name not in self.sites:
            self.sites[name] = Site(self, name)
        return self.sites[name]

    def sites_busy(self) -> bool:
        return any(site.busy() for site in self.sites.values())

    def dispatch(self, name, callee, *args, **kwargs):
        self.root.ran.add((id(self), name))
        site = self.sites.get(name)
        if site is None or not site.busy():
            return callee(*args, **kwargs)
        return site.fire(callee, args, kwargs)

    def reached(self, site: Site) -> bool | None:
        """Whether the forward reached `site` while its sites were routed (this run), None when it never ran at
        all: a site in a branch it did not take never fires, however early it is hooked."""
        ran = self.root.ran
        return None if not ran else (id(site.table), site.name) in ran


class ModuleSource(SiteTable):
    """`M.source`: the sites of M's forward, known from its source before anything runs."""

    def __init__(self, module: nn.Module, label: str | None = None):
        super().__init__()
        self.module_ref = weakref.ref(module)
        self.label = label or f"{type(module).__name__}.source"
        self.root = self
        self.body = _body(module)
        self.names = site_code(innermost(self.body)[0]).names
        self.holders: set = set()      # ids of live handles on any site below
        self.ran: set = set()          # (id(table), site name) of each site the rewritten forward ran, this run
        self.given: tuple | None = None   # (what the instance dict held under `forward`, what we put there)

    def __getattr__(self, name: str) -> Site:
        if name.startswith("_") and name not in self.names:
            raise AttributeError(name)
        if name not in self.names:
            raise SiteNameError(no_site(self.label, name, self.names))
        return self.site(name)

    def __dir__(self):
        return list(self.names)

    def __iter__(self):
        return (self.site(name) for name in self.names)

    def __reversed__(self):
        return (self.site(name) for name in reversed(self.names))

    def __len__(self):
        return len(self.names)

    def acquire(self, handle) -> None:
        self.holders.add(id(handle))
        module = self.module_ref()
        if self.given is None and module is not None:
            self.ran.clear()                # the sites a run reaches, counted from the run that routes them
            inner, peeled = innermost(self.body)
            bound = types.MethodType(rewrap(peeled, rewritten(inner, self.dispatch)), module)
            gate = gate_in_place(module)
            self.given = (gate or module.__dict__.get("forward", ABSENT), bound)
            if gate is not None:            # M.skip(v) in the same cell: the gate stays outermost
                gate.inner = bound
            else:
                module.__dict__["forward"] = bound

    def release(self, handle) -> None:
        self.holders.discard(id(handle))
        if self.holders or self.given is None:
            return
        before, ours = self.given
        if getattr(before, "inner", None) is ours:     # a skip gate holds our forward inside it
            before.inner = None
        else:
            give_back_forward(self.module_ref(), self.given)
        self.given = None


class CalleeSource(SiteTable):
    """`SITE.source`: the sites of the function a call site calls. The callee is known only when the call
    runs (an attention function picked at run time), so names are checked then."""

    def __init__(self, parent: Site):
        super().__init__()
        self.parent = parent
        self.root = parent.table.root
        self.label = f"{parent.table.label}.{parent.name}.source"
        self.copies: dict = {}          # code object of a callee -> its rewritten copy

    def __getattr__(self, name: str) -> Site:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.site(name)

    def opened(self, callee):
        """The callee with its sites routed through this table (built once per function)."""
        if isinstance(callee, nn.Module):
            error = SiteError(calls_a_module(self.label, self.parent.name, type(callee).__name__))
            error.path = f".{self.parent.name}.source"     # how the cell's line names it
            raise error
        if callee is bind:
            error = SiteError(not_a_call(self.label, self.parent.name, self.parent.table.names))
            error.path = f".{self.parent.name}.source"
            raise error
        receiver = getattr(callee, "__self__", None) if isinstance(callee, types.MethodType) else None
        function = callee.__func__ if receiver is not None else callee
        inner, peeled = innermost(function)
        names = site_code(inner).names
        unknown = [name for name in self.sites if name not in names and self.sites[name].busy()]
        if unknown:
            called = getattr(inner, "__qualname__", type(inner).__name__)
            error = SiteError(callee_has_no_site(self.label, unknown[0], names, self.parent.name, called))
            error.path = f".source.{unknown[0]}"        # how the cell's line names it (after a module or a name)
            raise error
        key = inner.__code__
        if key not in self.copies:
            self.copies[key] = rewrap(peeled, rewritten(inner, self.dispatch))
        made = self.copies[key]
        return types.MethodType(made, receiver) if receiver is not None else made


def _body(module: nn.Module):
    """The forward function M runs: an instance forward that is M's own bound method, else the class's."""
    own = module.__dict__.get("forward")
    if isinstance(own, types.MethodType) and own.__self__ is module and gate_in_place(module) is None:
        return own.__func__
    forward = type(module).forward
    if not isinstance(forward, types.FunctionType):
        raise NoSourceError(f"{type(module).__name__}.forward has no Python source (a builtin or C function): "
                            f"nbgrad can only open the source of a forward written in Python")
    return forward


_tables: "weakref.WeakKeyDictionary[nn.Module, ModuleSource]" = weakref.WeakKeyDictionary()


def source_of(target):
    """`X.source` in a cell: the sites of a module's forward, of a call site's callee, or X's own `.source`."""
    if isinstance(target, nn.Module):
        table = _tables.get(target)
        if table is None or (table.given is None and table.body is not _body(target)):
            table = _tables[target] = ModuleSource(target)
        return table
    if isinstance(target, Site):
        return target.source
    return target.source
