"""Loops over modules: which loop iterables nbgrad may evaluate before the model runs, so that every
module a loop yields is hooked ahead and the loop's reads are answered in whatever order it asks
(`reversed(model.transformer.h)`, `model.named_modules()` with containers before their children)."""
from __future__ import annotations

import ast
import types

from .astcopy import copied
from .cellast import is_path, opens_source
from .dataflow import bound_names

# Calls that only list modules (no side effect, no model run): safe to evaluate early.
MODULE_LISTINGS = frozenset({"named_modules", "modules", "children", "named_children", "values", "items"})
WRAPPERS = frozenset({"reversed", "list", "tuple", "enumerate", "sorted"})


def is_module_iterable(expr: ast.expr, free: frozenset | None = None) -> bool:
    """An iterable of modules (or of tuples holding modules) that can be evaluated before the run from names
    the cell does not bind: a path, `P.named_modules()` and the other listings, `reversed(...)`, `list(...)`,
    `enumerate(...)`, a slice with constant bounds, or a list / tuple of paths."""
    if is_path(expr, free):
        return True
    if isinstance(expr, (ast.List, ast.Tuple)):
        return bool(expr.elts) and all(is_path(element, free) for element in expr.elts)
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Slice):
        bounds = (expr.slice.lower, expr.slice.upper, expr.slice.step)
        return all(b is None or _is_constant(b) for b in bounds) and is_module_iterable(expr.value, free)
    if not isinstance(expr, ast.Call) or expr.keywords and not _constant_keywords(expr):
        return False
    if isinstance(expr.func, ast.Attribute) and expr.func.attr in MODULE_LISTINGS:
        return all(_is_constant(a) for a in expr.args) and is_path(expr.func.value, free)
    if isinstance(expr.func, ast.Name) and expr.func.id in WRAPPERS and (free is None or expr.func.id in free):
        return len(expr.args) == 1 and is_module_iterable(expr.args[0], free)
    return False


def _is_constant(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant)


def _constant_keywords(call: ast.Call) -> bool:
    return all(k.arg is not None and _is_constant(k.value) for k in call.keywords)


# What a loop's condition may use and still be evaluated early, for each element, with no side effect.
_PURE = (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Tuple, ast.List, ast.Set, ast.Attribute,
         ast.Subscript, ast.Slice, ast.Call, ast.expr_context, ast.cmpop, ast.boolop, ast.unaryop)
_PURE_CALLS = frozenset({"startswith", "endswith", "isinstance", "len"})


def loop_filters(stmt: ast.AST, free: frozenset, walk) -> dict:
    """Loop variable -> the code of `keep(element)`, the loop's condition on one element of its iterable,
    where that condition reads only the loop's own variables and names the cell does not bind (and calls
    nothing but `startswith`, `endswith`, `isinstance`, `len`): only the modules it keeps are hooked ahead.
    `[... for n, m in model.named_modules() if n in ("transformer", "transformer.h.0")]` hooks two."""
    found, loops_of = {}, {}
    for node in walk(stmt):
        if isinstance(node, (ast.comprehension, ast.For)):
            for name in {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}:
                loops_of[name] = loops_of.get(name, 0) + 1
        if isinstance(node, ast.comprehension):
            target, conditions = node.target, node.ifs
        elif isinstance(node, ast.For) and len(node.body) == 1 and isinstance(node.body[0], ast.If) \
                and not node.body[0].orelse:
            target, conditions = node.target, [node.body[0].test]
        else:
            continue
        own = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        if conditions and all(_is_pure(c, own | free) for c in conditions):
            code = _keep_code(target, conditions)
            found.update({name: code for name in own})
    # a name two loops of the statement use: which loop a use belongs to is not known here, so no filter
    return {name: code for name, code in found.items() if loops_of.get(name) == 1}


def _is_pure(condition: ast.expr, names: set) -> bool:
    for node in ast.walk(condition):
        if not isinstance(node, _PURE):
            return False
        if isinstance(node, ast.Name) and node.id not in names:
            return False
        if isinstance(node, ast.Attribute) and node.attr in ("output", "input", "inputs", "grad"):
            return False
        if isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if callee not in _PURE_CALLS or node.keywords:
                return False
    return True


def _keep_code(target: ast.expr, conditions: list):
    """The code of `def keep(element): TARGET = element; return COND and ...`."""
    element = ast.Name(id="__nbgrad_element", ctx=ast.Load())
    body = [ast.Assign(targets=[copied(target)], value=element),
            ast.Return(value=ast.BoolOp(op=ast.And(), values=[copied(c) for c in conditions])
                       if len(conditions) > 1 else copied(conditions[0]))]
    arguments = ast.arguments(posonlyargs=[], args=[ast.arg(arg="__nbgrad_element")], vararg=None, kwonlyargs=[],
                              kw_defaults=[], kwarg=None, defaults=[])
    function = ast.FunctionDef(name="keep", args=arguments, body=body, decorator_list=[], returns=None,
                               type_params=[])
    module = ast.Module(body=[function], type_ignores=[])
    for node in ast.walk(module):
        if "lineno" in node._attributes:
            node.lineno, node.col_offset, node.end_lineno, node.end_col_offset = 1, 0, 1, 0
    code = compile(module, "<nbgrad loop filter>", "exec")
    return next(c for c in code.co_consts if hasattr(c, "co_code"))


def loop_variable(target: ast.expr, loop_sources: dict) -> str | None:
    """The loop variable a module expression is reached through: `b` for `b`, `b.attn`, `b.mlp.c_fc` or
    `b.attn.source.SITE` in a loop over `b`; None for any other expression."""
    for variable in loop_sources:
        if is_path(target, frozenset({variable})):
            return variable
    return None


def element_code(variable: str, target: ast.expr, filename: str) -> types.CodeType | None:
    """`lambda VARIABLE: TARGET`, compiled: the module (or site) a loop's expression names for one element of
    the loop's container (`b.attn` for each block `b`); None when the expression is the variable itself."""
    if isinstance(target, ast.Name):
        return None
    function = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=variable)], kwonlyargs=[],
                                             kw_defaults=[], defaults=[]), body=copied(target))
    return compile(ast.fix_missing_locations(ast.Expression(body=function)), filename, "eval")


ELEMENT = "__nbgrad_element"       # the parameter of an element_code lambda that stands for `P[i]`


def indexed_container(target: ast.expr, free: frozenset, filename: str):
    """For `P[i]`, `P[i].attn` or `P[i].attn.source.SITE` (P a path of names the cell does not bind, i anything
    the cell computes): (P, element_code of what the expression names in each element of P, None for `P[i]`
    itself), so that every element's event is hooked before the run and `i` may come in any order. None
    for any other expression."""
    node, fields = target, []
    while not (isinstance(node, ast.Subscript) and is_path(node.value, free)):
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node, field = node.value, "value"
        elif opens_source(node):
            node, field = node.args[0], "args"
        else:
            return None
        fields.append(field)
    if not fields:
        return node.value, None
    body = parent = copied(target)
    for field in fields[:-1]:
        parent = parent.value if field == "value" else parent.args[0]
    if fields[-1] == "value":
        parent.value = ast.Name(id=ELEMENT, ctx=ast.Load())
    else:
        parent.args[0] = ast.Name(id=ELEMENT, ctx=ast.Load())
    if not is_path(body, frozenset({ELEMENT})):      # one index the cell computes, the rest constant
        return None
    return node.value, element_code(ELEMENT, body, filename)


def aliases(statements: list) -> dict:
    """Names the cell binds once, at its top level, as `NAME = EXPR` and stores nowhere else
    (`layers = model.transformer.h`) -> the indices of that statement and of those that change it in place
    (`layers.reverse()`): an expression that reads the name may be evaluated before the run once they have
    all run (Target.needs), so `reversed(layers)` is hooked ahead like `reversed(model.transformer.h)`."""
    stores, changed_by = {}, {}
    for index, stmt in enumerate(statements):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                stores[node.id] = stores.get(node.id, 0) + 1
        for name in bound_names(stmt)[1]:
            changed_by.setdefault(name, set()).add(index)
    found = {}
    for index, stmt in enumerate(statements):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            if stores[name] == 1:
                found[name] = frozenset({index} | changed_by.get(name, set()))
    return found


def innermost_path(expr: ast.expr) -> ast.expr | None:
    """The path a loop's iterable is made from, when the iterable is made by a call or a slice
    (`model.transformer.h` of `reversed(list(model.transformer.h)[1:])`): evaluating the iterable may iterate
    it, and the runtime must not if it is an iterator of the user's (`it = iter(blocks)`). None for a path."""
    if is_path(expr):
        return None
    while not is_path(expr):
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in MODULE_LISTINGS:
            expr = expr.func.value
        elif isinstance(expr, ast.Call) and expr.args:
            expr = expr.args[0]
        else:
            return None
    return expr
