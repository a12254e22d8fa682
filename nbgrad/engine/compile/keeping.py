"""Which cells only keep what they read (Program.quiet): they bind and save the values of events themselves, and
make nothing from them, so nothing they do depends on when it runs. Pure questions about a cell's syntax tree, as
in cellast.py.

A statement that makes something from a value (`h[:, -1]`, `M.output[0]`, `out.logits`, `len(h)`, `a, b = out`)
is not deferred: the model may change that value in place after its event (Falcon adds the attention's output
into its MLP's output; a forward may `t_()` a tensor, set its `.data` or fill a list it returned), and what a view
or an element reads then is no longer what a hook saw. The value itself is the same object at any time, as the one
a raw hook keeps."""
from __future__ import annotations

import ast

from .cellast import LISTING_METHODS, NAME_TESTS, calls_nothing, is_event_attr, is_save_call

# What a cell that only keeps what it reads may be made of (`keeps_only`): no operator, comparison, branch or
# store into an element, and no call but `x.save()`, a listing of modules and the builtins below
_KEEPING = (ast.Module, ast.Expr, ast.Assign, ast.Pass, ast.Name, ast.Constant, ast.Attribute, ast.Subscript,
            ast.Slice, ast.Tuple, ast.List, ast.Dict, ast.expr_context, ast.Call, ast.For, ast.ListComp,
            ast.DictComp, ast.comprehension, ast.UnaryOp, ast.unaryop)
_KEEPING_BUILTINS = frozenset("enumerate len list range reversed tuple zip".split())


def keeps_only(body: list) -> bool:
    """Whether a cell only binds and saves what it reads, whole (`i` in `model.transformer.h[i]` may index a path):
    nothing it does with an event's value depends on when it runs, so its statements may run after the model has
    (the deferred statement kind: run/forward.py's log and replay). `calls_nothing` holds too."""
    if not calls_nothing(body):
        return False
    module = ast.Module(body=body, type_ignores=[])
    in_paths = {id(node) for event in ast.walk(module) if is_event_attr(event) for node in ast.walk(event.value)}
    if _makes_from_values(module, in_paths):
        return False
    for node in ast.walk(module):
        if not isinstance(node, _KEEPING):
            return False
        if isinstance(node, ast.Call) and not _keeping_call(node):
            return False
        if isinstance(node, ast.UnaryOp) and not (isinstance(node.op, ast.USub)
                                                  and isinstance(node.operand, ast.Constant)):
            return False
        if isinstance(node, ast.Subscript) and not (
                _module_index(node.slice) if id(node) in in_paths
                else isinstance(node.ctx, ast.Load) and basic_index(node.slice)):
            return False
    return True


def _makes_from_values(module: ast.Module, in_paths: set) -> bool:
    """Whether the cell uses a value it read (an event, or a name bound to one) other than whole: bound, listed,
    saved or named alone. Module paths (`in_paths`) are no values."""
    bound = _value_names(module, in_paths)
    for parent in ast.walk(module):
        if isinstance(parent, ast.Assign) and not all(isinstance(target, ast.Name) for target in parent.targets):
            return True          # `a, b = M.output` takes elements
        for field, child in ast.iter_fields(parent):
            for node in child if isinstance(child, list) else (child,):
                if id(node) not in in_paths and _is_value(node, bound) and not _whole(parent, field):
                    return True
    return False


def _value_names(module: ast.Module, in_paths: set) -> set:
    """The names the cell binds to values (`h = M.output`, `x` of `for x in outs`), the elements of values included:
    loop variables over modules, their names and indices are none."""
    names: set = set()
    while True:
        found = set(names)
        for node in ast.walk(module):
            pairs = ([(target, node.value) for target in node.targets] if isinstance(node, ast.Assign) else
                     [(node.target, node.iter)] if isinstance(node, (ast.For, ast.comprehension)) else [])
            for target, value in pairs:
                if any(id(part) not in in_paths and _is_value(part, names) for part in ast.walk(value)):
                    found |= {name.id for name in ast.walk(target) if isinstance(name, ast.Name)}
        if found == names:
            return names
        names = found


def _is_value(node, bound: set) -> bool:
    return is_event_attr(node) or isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in bound


def _whole(parent: ast.AST, field: str) -> bool:
    """Where a value is used whole: bound (`x = v`), saved (`v.save()`), an element of a display or of what a
    comprehension makes, or a statement of its own."""
    return (isinstance(parent, (ast.Assign, ast.Expr)) and field == "value"
            or isinstance(parent, ast.Attribute) and parent.attr == "save"
            or isinstance(parent, (ast.List, ast.Tuple)) and field == "elts"
            or isinstance(parent, ast.Dict) and field in ("keys", "values")
            or isinstance(parent, (ast.ListComp, ast.DictComp)) and field in ("elt", "key", "value"))


def _keeping_call(call: ast.Call) -> bool:
    """`x.save()`, a listing (`model.named_modules()`, `d.items()`), a name test of a loop's condition or one of
    `_KEEPING_BUILTINS`; never a tensor method, which computes."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in _KEEPING_BUILTINS
    return isinstance(func, ast.Attribute) and (is_save_call(call) or func.attr in NAME_TESTS
                                                or (func.attr in LISTING_METHODS and not call.args))


def _module_index(index: ast.expr) -> bool:
    """An index in a module path: a name, a whole number or an attribute of a name (`cfg.layer`)."""
    return isinstance(index, (ast.Name, ast.Constant)) or basic_index(index) or (
        isinstance(index, ast.Attribute) and isinstance(index.value, ast.Name))


def basic_index(index: ast.expr) -> bool:
    """Constants, slices of constants and tuples of them: indexing that makes a view, never a copy."""
    if isinstance(index, ast.Tuple):
        return all(basic_index(element) for element in index.elts)
    if isinstance(index, ast.Slice):
        return all(part is None or basic_index(part) for part in (index.lower, index.upper, index.step))
    if isinstance(index, ast.UnaryOp):
        return isinstance(index.op, ast.USub) and isinstance(index.operand, ast.Constant)
    return isinstance(index, ast.Constant) and (index.value is None or index.value is ... or type(index.value) is int)


def one_save(body: list, source: str) -> tuple | None:
    """The cell of one-reads: every statement `NAME = ROOT.A[i].B.output.save()`, each NAME its own and no ROOT a NAME
    of the cell, the steps of a path attribute names and constant integer indices (`("A", i, "B")`). A tuple of
    (name, root, steps, label, line), one per statement: the cell a run answers from hooks alone (Program.one_save,
    run/onesave.py); else None. The label and line are those the rewritten `.save()` is given (rewrite.py)."""
    reads = tuple(_one_read(statement, source) for statement in body)
    names = {read[0] for read in reads if read is not None}
    if not reads or None in reads or len(names) != len(reads) or any(read[1] in names for read in reads):
        return None
    return reads


def _one_read(statement: ast.stmt, source: str) -> tuple | None:
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return None
    target, call = statement.targets[0], statement.value
    if not (isinstance(target, ast.Name) and is_save_call(call) and isinstance(call.func.value, ast.Attribute)
            and call.func.value.attr == "output"):
        return None
    path, steps = call.func.value.value, []
    while True:
        if isinstance(path, ast.Attribute) and not is_event_attr(path) and path.attr != "source":
            steps.append(path.attr)
        elif isinstance(path, ast.Subscript) and (index := _constant_index(path.slice)) is not None:
            steps.append(index)
        else:
            break
        path = path.value
    if not isinstance(path, ast.Name) or path.id == target.id:
        return None
    label = ast.get_source_segment(source, call.func.value) or ast.unparse(call.func.value)
    return target.id, path.id, tuple(reversed(steps)), label, call.lineno


def _constant_index(index: ast.expr) -> int | None:
    """`3` or `-1` as an int; None for anything else."""
    sign = 1
    if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
        sign, index = -1, index.operand
    return sign * index.value if isinstance(index, ast.Constant) and type(index.value) is int else None

