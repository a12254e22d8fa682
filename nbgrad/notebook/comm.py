"""The kernel side of the sidebar: a comm target that answers requests for the model tree.

Every message is validated; anything unexpected gets an error reply. Nothing from a message is ever
evaluated: it only selects which of a few fixed answers to send."""
from __future__ import annotations

import weakref

from torch import nn
from torch.nn.parameter import is_lazy

from ..engine.edit.edits import active_edits, skipped_modules
from ..errors.naming import module_path
from ..names.tree import canonical_tree
from .comm_sites import sites_reply

TARGET = "nbgrad"
REQUESTS = ("models", "ping", "sites")
MAX_NODES = 5000
MAX_KEYS_SHOWN, MAX_KEY_CHARS = 5, 40     # an error reply names a few unknown keys, each cut short

_last_shapes: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()
_comms: list = []


def register(ipython) -> None:
    """Open the comm target when the extension loads inside a kernel (not in a plain IPython)."""
    if getattr(ipython, "kernel", None) is None:
        return
    from comm import get_comm_manager
    get_comm_manager().register_target(TARGET, lambda comm, msg: _open(ipython, comm, msg))


def _open(ipython, comm, open_msg) -> None:
    _comms.append(comm)
    comm.on_msg(lambda msg: comm.send(reply_to(_data_of(msg), ipython.user_ns)))
    comm.on_close(lambda msg: _comms.remove(comm) if comm in _comms else None)
    data = _data_of(open_msg)
    if data:
        comm.send(reply_to(data, ipython.user_ns))


def reply_to(data, namespace: dict) -> dict:
    """`answer`, or an error reply when answering fails: the sidebar always hears back."""
    try:
        return answer(data, namespace)
    except Exception as error:    # anything from a module in the namespace; never out of the comm handler
        return {"error": f"nbgrad could not list the models: {_brief(error)}"}


def _brief(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:200]}{'…' if len(text) > 200 else ''}"


def _data_of(msg):
    try:
        return msg["content"]["data"]
    except (KeyError, TypeError):
        return None


def answer(data, namespace: dict) -> dict:
    """The reply to one message: the model tree, a pong, or an error that says what was wrong."""
    if not isinstance(data, dict):
        return {"error": "a message must be a JSON object like {\"request\": \"models\"}"}
    unknown = sorted(str(key)[:MAX_KEY_CHARS] for key in set(data) - {"request", "id", "path"})
    if unknown:
        more = f" and {len(unknown) - MAX_KEYS_SHOWN} more" if len(unknown) > MAX_KEYS_SHOWN else ""
        return {"error": f"unknown keys: {', '.join(unknown[:MAX_KEYS_SHOWN])}{more}"}
    request, ident = data.get("request"), data.get("id")
    if not isinstance(request, str) or request not in REQUESTS:
        return {"error": f"unknown request; expected one of: {', '.join(REQUESTS)}"}
    if ident is not None and not (isinstance(ident, (int, str)) and len(str(ident)) <= 64):
        return {"error": "id must be a short string or number"}
    if request == "ping":
        return {"reply": "pong", "id": ident}
    if request == "sites":          # the sites of one module's forward, when the sidebar is asked for them
        return sites_reply(data.get("path"), ident, namespace)
    return {"reply": "models", "id": ident, "models": models_in(namespace)}


def after_cell(shell, model, result) -> None:
    """Remember the shapes a trace saw, for the sidebar: a remote model's under its skeleton, whose tree the sidebar
    draws (the actor's Result gives them by module path; the notebook's Result by the skeleton's modules)."""
    tree = _tree_of(model) if model is not None else None
    if tree is not None and result is not None:
        _last_shapes[tree] = dict(result.shapes)


def models_in(namespace: dict) -> list:
    """The tree of each module in the namespace, and of each remote model (`nbgrad.remote`'s handle: its tree is the
    skeleton's, drawn here without asking the actor); one that cannot be walked says why instead. A name bound to a
    submodule of another module there (a loop's leftover `module`, `attn_module = model...attn`) is no model
    of its own: it is in that model's tree already."""
    models = []
    found = [(name, value, _tree_of(value)) for name, value in list(namespace.items())
             if isinstance(name, str) and not name.startswith("_")]
    found = [(name, value, tree) for name, value, tree in found if tree is not None]
    inside = _submodules_of([tree for _, _, tree in found])
    for name, value, tree in found:
        if id(tree) not in inside:
            try:
                models.append(_remote_entry(module_tree(name, tree), value))
            except Exception as error:
                models.append({"name": name, "path": name, "type": type(tree).__name__, "params": 0,
                               "total": 0, "output": None, "grad": None, "children": [],
                               "error": _brief(error)})
    return models


def _tree_of(value) -> nn.Module | None:
    """The module whose tree the sidebar draws for a namespace value: a module itself, a remote model's skeleton."""
    if _is_module(value):
        return value
    try:
        remote = getattr(type(value), "nbgrad_remote", False) is True
        skeleton = value.skeleton if remote else None
    except Exception:       # a proxy that raises when asked is no model
        return None
    return skeleton if _is_module(skeleton) else None


def _remote_entry(entry: dict, value) -> dict:
    """A remote model's entry says so, and where it lives."""
    if _is_module(value):
        return entry
    entry["remote"] = True
    try:
        entry["where"] = str(value.where)
    except Exception:       # a handle without that fact: "remote" alone
        entry["where"] = None
    return entry


def _submodules_of(modules: list) -> set:
    """ids of every module strictly inside one of `modules` (not the modules themselves, unless one holds another)."""
    inside = set()
    for module in modules:
        try:
            inside.update(id(sub) for sub in module.modules() if sub is not module)
        except Exception:       # a module that cannot be walked is listed with its error, not used to hide others
            continue
    return inside


def _is_module(value) -> bool:
    """Whether a namespace value is a module; an object that raises when asked (a proxy whose `__class__`
    raises, say) is not one, and the other models are still listed."""
    try:
        return isinstance(value, nn.Module)
    except Exception:
        return False


def module_tree(name: str, model: nn.Module) -> dict:
    shapes = _last_shapes.get(model, {})
    canonical = _canonical_tree(model, name)
    skipped = _skipped_by_edits(model)
    budget = [MAX_NODES]

    def node(label: str, path: str, module: nn.Module) -> dict:
        budget[0] -= 1
        own = _numel(module._parameters.values())
        entry = {"name": label, "path": path, "type": type(module).__name__, "params": own,
                 "output": _shape(shapes.get((id(module), "output"))),
                 "grad": _shape(shapes.get((id(module), "grad"))), "children": []}
        _canonical_names(entry, canonical)
        if id(module) in skipped:
            entry["skipped"] = skipped[id(module)]
        for child_name, child in module.named_children():
            if budget[0] <= 0:
                entry["truncated"] = True
                break
            entry["children"].append(node(child_name, module_path(path, child_name), child))
        entry["total"] = _numel(module.parameters())   # shared (tied) weights once
        if any(is_lazy(p) for p in module._parameters.values() if p is not None):
            entry["lazy"] = True      # its shapes come with the first call (nn.LazyLinear, ...)
        return entry
    tree = node(name, name, model)
    if canonical is not None:
        tree["family"] = canonical.family
    tree["edits"] = [{"source": edit.summary(), "label": edit.label} for edit in active_edits(model)]
    return tree


def _skipped_by_edits(model: nn.Module) -> dict:
    """id of each module an active edit skips (`M.skip(v)`) -> the labels of the edits that skip it."""
    skipped: dict = {}
    for edit in active_edits(model):
        for module in skipped_modules(edit):
            skipped.setdefault(id(module), []).append(edit.label)
    return skipped


def _canonical_tree(model: nn.Module, name: str):
    """The model's canonical names, or None: a family entry that cannot be read (one registered with a wrong path)
    leaves the tree as it is without them, rather than in place of it."""
    try:
        return canonical_tree(model, name)
    except Exception:
        return None


def _canonical_names(entry: dict, canonical) -> None:
    """A module of a known family: its canonical path (what a click inserts) and the canonical values read there."""
    if canonical is None:
        return
    path = entry["path"]
    if path in canonical.names:
        entry["canonical"] = canonical.names[path]
    if path in canonical.values:
        entry["values"] = list(canonical.values[path])


def _numel(params) -> int:
    """Elements of the parameters whose shape is known (a lazy module's are not, until its first call)."""
    return sum(p.numel() for p in params if p is not None and not is_lazy(p))


def _shape(value):
    return list(value) if isinstance(value, tuple) else None
