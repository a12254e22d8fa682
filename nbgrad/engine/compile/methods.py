"""Methods of the notebook's objects that read or edit events: `lora()` (its class's `__call__`, or `forward` of
an `nn.Module`), `obj.patch(...)`, for an object of a class defined in the notebook (in this cell or an earlier
one). The cell's direct calls of such a method pause at its events like a helper function's (helpers.py), with
the object passed for `self`.

A called method is named by a key: `OWNER()` for what calling the object runs, `OWNER.name` for a method, where
OWNER is the object's name (`lora()`, `lora.patch`), or `CLASS()` when the cell makes the object itself
(`lora = LoRA(...)`: `LoRA()()`, `LoRA().patch`).
"""
from __future__ import annotations

import ast
import types

from torch import nn

from .cellast import can_pause_in, walk_cell_level


def instances(statements: list) -> dict:
    """Object name -> class name, for each name the statements bind only by `NAME = CLASS(...)` at their level."""
    found, other, targets = {}, set(), set()
    for stmt in statements:
        for node in walk_cell_level(stmt):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)):
                name, made = node.targets[0].id, node.value.func.id
                targets.add(id(node.targets[0]))
                if found.setdefault(name, made) != made:
                    other.add(name)
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load) and id(node) not in targets:
                other.add(node.id)
    return {name: made for name, made in found.items() if name not in other}


def method_key(call: ast.Call, made: dict, bound: set) -> tuple:
    """(key, receiver) of a call that may run a notebook object's method (`lora(...)`, `obj.patch(...)`),
    else (None, None). `made`: `instances` of the cell; `bound`: every name it binds."""
    func = call.func
    if isinstance(func, ast.Name) and (func.id in made or func.id not in bound):
        return f"{_owner(func.id, made)}()", func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
            and (func.value.id in made or func.value.id not in bound):
        return f"{_owner(func.value.id, made)}.{func.attr}", func.value
    return None, None


def _owner(name: str, made: dict) -> str:
    return f"{made[name]}()" if name in made else name


def called_methods(statements: list, bound: set) -> set:
    """The keys of the calls that may run a method of a notebook object: looked up in the namespace."""
    made = instances(statements)
    keys = {method_key(n, made, bound)[0] for stmt in statements for n in walk_cell_level(stmt)
            if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id not in made)}
    return {key for key in keys if key is not None and key.split("(")[0].split(".")[0] not in bound}


def cell_methods(statements: list) -> dict:
    """Key -> `def`, for the methods that read events of the classes the cell defines, called on an object the cell
    makes (`lora = LoRA(...)`; `lora()`)."""
    classes = {stmt.name: stmt for stmt in statements if isinstance(stmt, ast.ClassDef)}
    found = {}
    for made in set(instances(statements).values()) & classes.keys():
        defs = {d.name: d for d in classes[made].body if isinstance(d, ast.FunctionDef) and plain_method(d)}
        found |= {f"{made}().{name}": d for name, d in defs.items()}
        called = defs.get("__call__") or (defs.get("forward") if classes[made].bases else None)
        if called is not None:
            found[f"{made}()()"] = called
    return found


def method_of(key: str, namespace: dict):
    """The function a key names in the namespace, when it is a method of a class defined in the notebook (its
    globals are the namespace): `__call__`, or an `nn.Module`'s `forward`, for `OWNER()`. Else None."""
    call = key.endswith("()")
    owner, _, name = (key[:-2] if call else key).partition(".")
    value = namespace.get(owner.removesuffix("()"))
    if owner.endswith("()"):         # an object the cell makes: `owner` names its class
        if not isinstance(value, type):
            return None
        cls = value
    elif value is None or isinstance(value, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
        return None
    else:
        cls = type(value)
    if call:
        name = "__call__"
        if not _notebook_function(getattr(cls, name, None), namespace) and issubclass(cls, nn.Module):
            name = "forward"
    function = getattr(cls, name, None)
    return function if _notebook_function(function, namespace) else None


def _notebook_function(function, namespace: dict) -> bool:
    return (isinstance(function, types.FunctionType) and function.__globals__ is namespace
            and not function.__code__.co_freevars and "<locals>" not in function.__qualname__)


def plain_method(definition: ast.FunctionDef) -> bool:
    """A method that reads events and can run outside its class: no `super()` and no private (mangled) names."""
    return can_pause_in(definition) and bool(definition.args.args) and not any(
        (isinstance(n, ast.Name) and n.id == "super")
        or (isinstance(n, ast.Attribute) and n.attr.startswith("__") and not n.attr.endswith("__"))
        for n in ast.walk(definition))

