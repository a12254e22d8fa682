"""The sidebar's "sites" request: the sites of one module's forward (`M.source.NAME`), by the module's path
as the tree gives it (`model.transformer.h[0].attn`). The path is walked, never evaluated."""
from __future__ import annotations

import re

from torch import nn

from ..api import source as listing
from ..models.skeleton import on_skeleton

MAX_SITES = 500
_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+)\]")


def module_at(path: str, namespace: dict) -> nn.Module:
    """The module a tree path names: a namespace name, then `.child` and `[index]` steps."""
    root = re.match(r"[A-Za-z_]\w*", path)
    module = _skeleton_or_module(namespace.get(root.group())) if root is not None else None
    if not isinstance(module, nn.Module):
        raise LookupError(f"no model named {path.split('.')[0][:40]!r} in the kernel")
    rest = path[root.end():]
    steps = list(_STEP.finditer(rest))
    if "".join(step.group() for step in steps) != rest:
        raise LookupError("a module path is names and [indices] only")
    for step in steps:
        name = step.group(1) or step.group(2)
        child = module._modules.get(name)
        if not isinstance(child, nn.Module):
            raise LookupError(f"{type(module).__name__} has no submodule {name!r}")
        module = child
    return module


def _skeleton_or_module(value):
    """A remote model's skeleton (its forwards are the actor's model's), or the value itself."""
    try:
        return on_skeleton(value)
    except Exception:          # a handle that cannot say: no model
        return None


def sites_reply(path, ident, namespace: dict) -> dict:
    if not isinstance(path, str) or len(path) > 400:
        return {"error": "a sites request needs a module path (a short string)"}
    try:
        names = listing(module_at(path, namespace)).names
    except Exception as error:          # no source, a path that is not there: said in the sidebar
        return {"reply": "sites", "id": ident, "path": path, "sites": [], "error": " ".join(str(error).split())[:300]}
    return {"reply": "sites", "id": ident, "path": path, "sites": list(names[:MAX_SITES]),
            "truncated": len(names) > MAX_SITES}
