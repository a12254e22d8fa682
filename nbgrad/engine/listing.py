"""`nbgrad.source(M)` / `%source M`: a forward's source with each site's name beside its line."""
from __future__ import annotations

import types

from torch import nn

from ..errors.naming import a_or_an
from .compile.sites import innermost, site_code
from .run.sites import ModuleSource, NbgradError, Site, source_of


class SourceListing(str):
    """The listing as text; `.names` holds the site names in source order (what `M.source.NAME` takes)."""
    names: tuple

    def __repr__(self):
        return str(self)


def listing(target) -> SourceListing:
    """The listing of a module's forward, or of a plain Python function."""
    if isinstance(target, Site):
        raise NbgradError(f"{target!r}: the function a call site calls is known only while the model runs; "
                          f"list it with nbgrad.source(function) or from the module that defines it")
    if isinstance(target, nn.Module):
        table: ModuleSource = source_of(target)
        function, title = table.body, f"{type(target).__name__}.forward"
    elif isinstance(target, types.MethodType):
        function, title = target.__func__, target.__qualname__
    elif isinstance(target, (types.FunctionType, types.BuiltinFunctionType)):
        function, title = target, target.__qualname__      # a builtin: site_code says it has no source
    else:
        raise NbgradError(f"nbgrad.source takes a module or a Python function, not {a_or_an(type(target).__name__)}: "
                          f"give the module whose forward to list (model.transformer.h[0].attn)")
    found = site_code(innermost(function)[0])
    beside: dict = {}
    for name in found.names:
        beside.setdefault(found.lines[name] - found.first_line, []).append(name)
    labels = [", ".join(beside.get(index, ())) for index in range(len(found.source.splitlines()))]
    width = min(max(map(len, labels), default=0), 48)
    rows = [f"{label:>{width}}  {line}" for label, line in zip(labels, found.source.splitlines())]
    text = SourceListing("\n".join([f"{title} (sites: {len(found.names)})"] + rows))
    text.names = found.names
    return text
