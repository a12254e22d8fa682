"""Pure questions about a cell's syntax tree, and the few nodes the rewrite builds. No state."""
from __future__ import annotations

import ast

from ...errors import NbgradError

MODULE_EVENTS = ("output", "input", "inputs")
EVENT_ATTRS = MODULE_EVENTS + ("grad",)


def is_event_attr(node: ast.AST) -> bool:
    """`X.output`, `X.input`, `X.inputs` or `X.grad`."""
    return isinstance(node, ast.Attribute) and node.attr in EVENT_ATTRS


def event_root(expr: ast.AST):
    """The outermost event attribute (`.output`, `.grad`, ...) a chain like `M.output[0][:, 1]` hangs from."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        if is_event_attr(expr):
            return expr
        expr = expr.value
    return None


def root_name(expr: ast.AST):
    """`outs[0].x` -> the Name `outs`; None when the chain does not start at a name."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        expr = expr.value
    return expr if isinstance(expr, ast.Name) else None


def touches_events(node: ast.AST) -> bool:
    return any(is_event_attr(n) or is_backward_call(n) for n in ast.walk(node))


def is_backward_call(expr: ast.AST) -> bool:
    return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and expr.func.attr == "backward")


def is_backward_block(stmt: ast.AST) -> bool:
    return (isinstance(stmt, ast.With) and len(stmt.items) == 1
            and stmt.items[0].optional_vars is None and is_backward_call(stmt.items[0].context_expr))


def is_invoke_block(stmt: ast.AST) -> bool:
    """`with invoke(INPUT):` or `with invoke(name=value, ...):` (an `as NAME` is allowed and ignored)."""
    if not (isinstance(stmt, ast.With) and len(stmt.items) == 1):
        return False
    call = stmt.items[0].context_expr
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "invoke"


def invoke_value(call: ast.Call, line: int) -> ast.expr:
    """The INPUT of `invoke(INPUT)`; of `invoke(input_ids=ids, **more)`, the dict `{'input_ids': ids, **more}`
    (keyword arguments of the model, as a dict INPUT is), spanning the keywords' text."""
    if len(call.args) + bool(call.keywords) != 1 or any(isinstance(a, ast.Starred) for a in call.args):
        given = ("an INPUT and keyword arguments" if call.args else "keyword arguments") if call.keywords else \
            "no INPUT" if not call.args else f"{len(call.args)} positional arguments"
        raise NbgradError("`with invoke(INPUT):` takes one INPUT (a string, a list of strings, a tensor, a dict or "
                          f"a tuple), or the model's keyword arguments (`invoke(input_ids=ids)`); it has {given}",
                          line)
    if call.args:
        return call.args[0]
    first, last = call.keywords[0], call.keywords[-1]
    value = ast.Dict([ast.Constant(k.arg) if k.arg else None for k in call.keywords], [k.value for k in call.keywords])
    value.lineno, value.col_offset, value.end_lineno, value.end_col_offset = \
        first.lineno, first.col_offset, last.end_lineno, last.end_col_offset
    return value


def is_save_call(node: ast.AST) -> bool:
    """`x.save()` with no arguments (a `save(...)` with arguments is someone else's method)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "save"
            and not node.args and not node.keywords)


# What a cell may be made of and still run no code but PyTorch's: names, constants, attribute chains,
# indexing, operators, comparisons, assignments, loops and comprehensions, `x.save()`, `with invoke(...)`
# blocks, tensor methods of traced values, listings of modules, a few builtins and `with LOSS.backward():`.
_PLAIN = (ast.Module, ast.Expr, ast.Assign, ast.AugAssign, ast.Pass, ast.Name, ast.Constant, ast.Attribute,
          ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Dict, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare,
          ast.IfExp, ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.withitem, ast.Call,
          ast.With, ast.keyword, ast.For, ast.If, ast.Break, ast.Continue, ast.ListComp, ast.DictComp,
          ast.GeneratorExp, ast.comprehension)
# Builtins that only count, list or convert (a cell that rebinds one of these names is not plain), the
# methods that list a module's submodules or a dict's entries, and the name tests of a loop's condition.
_PURE_BUILTINS = frozenset("enumerate float int len list range reversed sorted tuple zip".split())
LISTING_METHODS = frozenset("children items keys modules named_children named_modules values".split())
NAME_TESTS = frozenset(("endswith", "startswith"))
# Tensor methods that read or compute and never touch a parameter's flag (`requires_grad_` is not one; nor is
# anything that takes a function, such as `register_hook`, whose function could).
_PURE_METHODS = frozenset("""
    abs add amax amin argmax argmin backward chunk clamp clone contiguous cpu cumsum detach dim div double
    exp expand flatten float gather half index_select item log log_softmax logsumexp masked_fill matmul max
    mean min mul neg norm numel numpy permute pow prod relu repeat reshape sigmoid size softmax sort split
    sqrt square squeeze std sub sum t tanh to tolist topk transpose unbind unsqueeze var view""".split())


def calls_nothing(body: list) -> bool:
    """Whether a cell calls nothing but `x.save()`, `invoke(...)`, tensor methods of traced values, listings
    and a few builtins (see `_PLAIN`), and sets no attribute but an event's. Such a cell cannot change a
    `requires_grad` flag, so its run need not read them all twice."""
    traced = _traced_names(body)
    bound = {n.id for n in ast.walk(ast.Module(body=body, type_ignores=[]))
             if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if not isinstance(node, _PLAIN):
            return False
        if isinstance(node, ast.Call) and not (is_save_call(node) or _is_traced_method(node, traced) or
                                               _is_plain_call(node, bound)):
            return False
        if isinstance(node, ast.With) and not (is_invoke_block(node) or is_backward_block(node)):
            return False
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load) and node.attr not in EVENT_ATTRS:
            return False
    return True


def _is_plain_call(call: ast.Call, bound: set) -> bool:
    """`invoke(...)`, one of `_PURE_BUILTINS` (not rebound by the cell), `X.modules()` and the like, or
    `name.startswith(...)`."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "invoke" or (func.id in _PURE_BUILTINS and func.id not in bound)
    if not isinstance(func, ast.Attribute):
        return False
    return (func.attr in LISTING_METHODS and not call.args) or func.attr in NAME_TESTS


def _derives_from_events(expr: ast.AST, traced: set) -> bool:
    return any(is_event_attr(n) or (isinstance(n, ast.Name) and n.id in traced) for n in ast.walk(expr))


def _traced_names(body: list) -> set:
    """Names the cell binds, by plain assignment, to values made from module events (`hs = M.output`,
    `loss = hs.sum()`)."""
    assigns = [node for node in ast.walk(ast.Module(body=body, type_ignores=[])) if isinstance(node, ast.Assign)]
    traced: set = set()
    grown = True
    while grown:
        grown = False
        for node in assigns:
            if _derives_from_events(node.value, traced):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id not in traced:
                        traced.add(target.id)
                        grown = True
    return traced


def _is_traced_method(call: ast.Call, traced: set) -> bool:
    """`X.method(...)` with a method of `_PURE_METHODS` and X a chain made from a module event."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in _PURE_METHODS):
        return False
    receiver = func.value
    while isinstance(receiver, (ast.Attribute, ast.Subscript, ast.Call)):
        if is_event_attr(receiver):
            return True
        receiver = receiver.func if isinstance(receiver, ast.Call) else receiver.value
    return isinstance(receiver, ast.Name) and receiver.id in traced


def makes_invokes(stmt: ast.AST) -> bool:
    """A `def` with a `with invoke(...)` block in its own body: its calls are inlined before compiling (inline.py)."""
    return isinstance(stmt, ast.FunctionDef) and any(isinstance(n, ast.With) and is_invoke_block(n)
                                                     for n in walk_cell_level(stmt))


def can_pause_in(stmt: ast.AST) -> bool:
    """A plain `def` (no decorators, not a generator: its twin's pauses are yields of its own) whose body
    uses module events: the cell's direct calls of it pause at those events like the cell's own statements."""
    return (isinstance(stmt, ast.FunctionDef) and not stmt.decorator_list and not makes_invokes(stmt)
            and any(isinstance(n, ast.Attribute) and n.attr in MODULE_EVENTS for n in ast.walk(stmt))
            and not any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in walk_cell_level(stmt)))


def walk_cell_level(node: ast.AST):
    """ast.walk, but not into the bodies of functions and classes the cell defines: those run as plain
    Python when called, not as part of the cell's hook graph."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current is not node and isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                                          ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(current))


def position(node: ast.AST) -> tuple:
    return (node.lineno, node.col_offset)


def is_path(expr: ast.expr, names: frozenset | None = None) -> bool:
    """A name followed by attributes and subscripts, safe to evaluate early. With `names`, the root and
    any name used as an index must be among them (names the cell does not bind); without, any root name
    and constant indices only."""
    if isinstance(expr, ast.Name):
        return names is None or expr.id in names
    if isinstance(expr, ast.Attribute):
        return expr.attr not in EVENT_ATTRS and is_path(expr.value, names)
    if opens_source(expr):           # `M.source` (compile/siteaccess.py): a site is hooked early like a module
        return is_path(expr.args[0], names) and all(_plain_index(index, names) for index in expr.args[1:])
    if isinstance(expr, ast.Subscript):
        return _plain_index(expr.slice, names) and is_path(expr.value, names)
    return False


def _plain_index(index: ast.expr, names: frozenset | None) -> bool:
    """A constant, or with `names` one of them, as an index of a path (`M.calls[k]`'s k too)."""
    if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
        index = index.operand
    return isinstance(index, ast.Constant) or (names is not None and isinstance(index, ast.Name) and index.id in names)


def opens_source(expr: ast.expr) -> bool:
    """`__nbgrad__.source_of(X)` / `__nbgrad__.skip_of(X)` / `__nbgrad__.call_of(X, k)`, what `X.source`,
    `X.skip(v)` and `X.calls[k]` compile to."""
    return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and isinstance(expr.func.value, ast.Name) and expr.func.value.id == "__nbgrad__"
            and len(expr.args) == (2 if expr.func.attr == "call_of" else 1)
            and expr.func.attr in ("source_of", "skip_of", "call_of"))


# --- nodes the rewrite builds -----------------------------------------------------------------

def const(value) -> ast.Constant:
    return ast.Constant(value=value)


def name(identifier: str, store: bool = False) -> ast.Name:
    return ast.Name(id=identifier, ctx=ast.Store() if store else ast.Load())


def no_arguments() -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[],
                         kwarg=None, defaults=[])


def thunk(expr: ast.expr) -> ast.Lambda:
    """`lambda: expr`: evaluated by the runtime when it handles the request, not before."""
    return ast.Lambda(args=no_arguments(), body=expr)


def never_runs_yield() -> ast.If:
    """`if False: yield` makes any function body a generator without changing what it does."""
    return ast.If(test=const(False), body=[ast.Expr(value=ast.Yield(value=None))], orelse=[])


def generator_function(function_name: str, body: list) -> ast.FunctionDef:
    return ast.FunctionDef(name=function_name, args=no_arguments(), body=body + [never_runs_yield()],
                           decorator_list=[], returns=None, type_params=[])


def loop_sources(stmt: ast.AST) -> dict:
    """Loop and comprehension variables -> the container each takes its elements from:
    `for h in refs` and `[... for h in refs]` give h -> refs; `enumerate(refs)` and `zip(a, b)` unpack."""
    sources = {}
    for node in walk_cell_level(stmt):
        if isinstance(node, (ast.For, ast.comprehension)):
            sources.update(_unpacked(node.target, node.iter))
    return sources


def _unpacked(target: ast.expr, iterable: ast.expr) -> dict:
    if isinstance(target, ast.Name):
        return {target.id: iterable}
    if not isinstance(target, ast.Tuple):
        return {}
    if not (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and not iterable.keywords
            and iterable.func.id in ("enumerate", "zip")):
        # `for name, module in model.named_modules()`: each name takes its values from the pairs
        return {n.id: iterable for n in ast.walk(target) if isinstance(n, ast.Name)}
    if iterable.func.id == "enumerate" and len(target.elts) == 2 and len(iterable.args) >= 1:
        return _unpacked(target.elts[1], iterable.args[0])
    if iterable.func.id == "zip" and len(target.elts) == len(iterable.args):
        found = {}
        for element, source in zip(target.elts, iterable.args):
            found.update(_unpacked(element, source))
        return found
    return {}
