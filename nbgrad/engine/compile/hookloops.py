"""Loops that only edit or save what each block returns, compiled to run inside each block's hook (run/hookloops.py).

    for i in range(len(model.transformer.h)):          for block in model.transformer.h:
        model.transformer.h[i].output[:] *= 0.5            block.output[:, -1] += steer

    resid = [block.output[:, -1].save() for block in model.transformer.h]

Run as a statement, such a loop pauses at every block: the block's hook resumes the statement, which edits, moves
on to the next block, finds it and waits again. That is six Python calls at every block, run cold between two
layers of the forward (bench/overhead.py, (c)). Nothing in the loop's body needs that: it only edits the value
of the loop's own event, with operands the cell does not bind (or saves a view of it, for the list). So the body
is also compiled as a plain function of that value, and a run with the fast kinds calls it from each block's event, as a raw
hook would (HookLoop). Pure questions about the syntax tree, as in cellast.py; the run decides whether the loop's
blocks allow it (run/hookloops.py)."""
from __future__ import annotations

import ast
import dataclasses
import types
from dataclasses import dataclass

from .astcopy import copied
from .program import RUNTIME_NAME, TEMP_PREFIX
from .cellast import EVENT_ATTRS, is_save_call
from .keeping import basic_index

VALUE = f"{TEMP_PREFIX}value"
ROWS = f"{TEMP_PREFIX}rows"      # an on-event function's second parameter: its leading `:` (OnEvent.rows)
# What an edit's index and operand may be made of: reads of names and constants, and arithmetic on them; no call
# (which could change grad mode, flags or the model in the middle of the forward), no event, nothing that binds
_OPERAND = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.BinOp, ast.UnaryOp,
            ast.Compare, ast.BoolOp, ast.IfExp, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
_NOT_OPERANDS = frozenset(EVENT_ATTRS + ("source", "skip", "save", "backward"))


@dataclass(frozen=True)
class HookLoop:
    """A loop over the blocks of PATH (`root.attr.attr`, a ModuleList) whose body only edits each block's output, or
    a list of each block's saved output."""
    name: str                     # the loop variable: an index (`by_index`) or the block
    root: str                     # PATH's root name, which the cell does not bind
    attributes: tuple             # the attribute names after it
    by_index: bool                # `for i in range(len(PATH))` (PATH[i] in the body), else `for b in PATH`
    path: str                     # PATH as written
    body: types.CodeType          # `def <cell>(__nbgrad_value): <the body, the event read as __nbgrad_value>`
    use: int = -1                 # the use id of the body's event, once the statement is compiled
    # A list of saved outputs: the name it is bound to, and `body` is `(__nbgrad_value, name) -> the saved element`
    result: str | None = None


def hook_loop(stmt: ast.stmt, builder) -> HookLoop | None:
    """The HookLoop a `for` statement or a list of saved outputs is, before the rewriter edits it; None where it
    does anything more. (`builder`: the compiler's, for the names the cell binds, its file name and text.)"""
    cell_bound, filename, source = builder.cell_bound, builder.filename, builder.source
    if isinstance(stmt, ast.Assign):
        return _hook_list(stmt, cell_bound, filename, source)
    if not (isinstance(stmt, ast.For) and not stmt.orelse and isinstance(stmt.target, ast.Name) and stmt.body):
        return None
    name = stmt.target.id
    container, by_index, path = _loop_path(stmt.iter, name, cell_bound)
    if path is None:
        return None
    body = copied(stmt.body)
    for edit in body:
        target = edit.target if isinstance(edit, ast.AugAssign) else (
            edit.targets[0] if isinstance(edit, ast.Assign) and len(edit.targets) == 1 else None)
        if not isinstance(target, ast.Subscript) or not _is_event(target.value, name, container, by_index):
            return None
        if not (_operand(target.slice, cell_bound, name) and _operand(edit.value, cell_bound, name)):
            return None
        target.value = ast.copy_location(ast.Name(id=VALUE, ctx=ast.Load()), target.value)
    return HookLoop(name, path[0], path[1], by_index, ast.unparse(container), _function(body, stmt.lineno, filename))


def _hook_list(stmt: ast.Assign, cell_bound: set, filename: str, source: str) -> HookLoop | None:
    """`NAME = [PATH[i].output[...].save() for i in range(len(PATH))]` (or `for b in PATH`, `b.output`), constant
    indices only: each block's value saved from its event, the list bound once the last block's is."""
    comprehension = stmt.value
    if not (len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and isinstance(comprehension, ast.ListComp) and len(comprehension.generators) == 1):
        return None
    generator, saved = comprehension.generators[0], comprehension.elt
    if generator.ifs or generator.is_async or not isinstance(generator.target, ast.Name) or not is_save_call(saved):
        return None
    name, result = generator.target.id, stmt.targets[0].id
    container, by_index, path = _loop_path(generator.iter, name, cell_bound)
    kept = copied(saved.func.value)           # `E.output[:, -1]`
    parent, event = None, kept
    while isinstance(event, ast.Subscript) and basic_index(event.slice):
        parent, event = event, event.value
    if path is None or result in (name, path[0]) or not _is_event(event, name, container, by_index):
        return None
    value = ast.copy_location(ast.Name(id=VALUE, ctx=ast.Load()), event)
    if parent is None:
        kept = value
    else:
        parent.value = value
    label = ast.get_source_segment(source, saved.func.value) or ast.unparse(saved.func.value)
    save = ast.Attribute(value=ast.Name(id=RUNTIME_NAME, ctx=ast.Load()), attr="save", ctx=ast.Load())
    body = [ast.copy_location(ast.Return(value=ast.Call(func=save, args=[
        kept, ast.Constant(saved.lineno), ast.Constant(label)], keywords=[])), saved)]
    return HookLoop(name, path[0], path[1], by_index, ast.unparse(container),
                    _function(body, stmt.lineno, filename, (VALUE, name)), result=result)


def _loop_path(iterable: ast.expr, name: str, cell_bound: set) -> tuple:
    """(PATH, by_index, (root, attributes)) of a loop's iterable over a path the cell does not bind; the last None
    where it is none."""
    container, by_index = _container(iterable)
    path = _path(container) if container is not None else None
    if path is None or path[0] in cell_bound or path[0] == name or by_index and {"range", "len"} & cell_bound:
        return container, by_index, None
    return container, by_index, path


def with_use(loop: HookLoop, events: tuple, use: int) -> HookLoop | None:
    """The loop once its statement is compiled: its body's one event is its use `use`."""
    return dataclasses.replace(loop, use=use) if len(events) == 1 and events[0].kind == "output" else None


def _container(iterable: ast.expr) -> tuple:
    """(PATH, by_index) of `range(len(PATH))` or of PATH itself."""
    if (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id == "range"
            and len(iterable.args) == 1 and not iterable.keywords):
        inner = iterable.args[0]
        if (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "len"
                and len(inner.args) == 1 and not inner.keywords):
            return inner.args[0], True
        return None, False
    return iterable, False


def _path(node: ast.expr) -> tuple | None:
    """(root name, attribute names) of `root.a.b` with at least one attribute; else None."""
    attributes = []
    while isinstance(node, ast.Attribute):
        if node.attr in _NOT_OPERANDS:
            return None
        attributes.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or not attributes:
        return None
    return node.id, tuple(reversed(attributes))


def _is_event(node: ast.expr, name: str, container: ast.expr, by_index: bool) -> bool:
    """`PATH[name].output` (by index) or `name.output`."""
    if not (isinstance(node, ast.Attribute) and node.attr == "output"):
        return False
    block = node.value
    if by_index:
        return (isinstance(block, ast.Subscript) and isinstance(block.slice, ast.Name) and block.slice.id == name
                and ast.dump(block.value) == ast.dump(container))
    return isinstance(block, ast.Name) and block.id == name


def _operand(node: ast.expr, cell_bound: set, name: str) -> bool:
    for part in ast.walk(node):
        if not isinstance(part, _OPERAND):
            return False
        if isinstance(part, ast.Attribute) and part.attr in _NOT_OPERANDS:
            return False
        if isinstance(part, ast.Name) and (part.id != name and part.id in cell_bound
                                          or part.id.startswith(TEMP_PREFIX) or part.id == RUNTIME_NAME):
            return False
    return True


def _function(body: list, line: int, filename: str, parameters: tuple = (VALUE,)) -> types.CodeType:
    """The code of `def <cell>(__nbgrad_value, ...): <body>`, every line the cell's."""
    arguments = ast.arguments(posonlyargs=[], args=[ast.arg(arg=parameter) for parameter in parameters],
                              kwonlyargs=[], kw_defaults=[], defaults=[])
    last = max(getattr(edit, "end_lineno", line) or line for edit in body)
    function = ast.FunctionDef(name=f"{TEMP_PREFIX}loop", args=arguments, body=body, decorator_list=[], returns=None,
                               type_params=[], lineno=line, col_offset=0, end_lineno=last, end_col_offset=0)
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    module_code = compile(module, filename, "exec")
    code = next(const for const in module_code.co_consts if isinstance(const, types.CodeType))
    return code.replace(co_name="<cell>", co_qualname="<cell>")     # what a traceback shows, as for a statement


# What an on-event statement may hold, rewritten, beside its one request and its saves: what only reads and computes
# (no call, which could run before the event in a generator and after it here; no branch, which could pass the event by)
_ONE = (ast.Assign, ast.AugAssign, ast.Expr, ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Slice,
        ast.Tuple, ast.List, ast.BinOp, ast.UnaryOp, ast.Compare, ast.expr_context, ast.operator, ast.unaryop,
        ast.cmpop)


@dataclass(frozen=True)
class OnEvent:
    """The statement kind "on-event function": a statement whose one event is the output of a module at a path of
    attributes and constant indices (`clean = model.transformer.h[3].output[:, -1].save()`), also compiled as a plain
    function of that value, which a run calls from the event (run/hookloops.py, start_one) instead of starting a
    generator, parking it and resuming it there."""
    root: str                     # the path's root name, and its steps: attribute names and int indices (elements.walk)
    steps: tuple
    use: int                      # the use id of its event
    body: types.CodeType          # `def <cell>(__nbgrad_value, __nbgrad_rows): global ...; <the statement, the event
    #                               read as the value>`
    # The value indexed with a leading `:` (`h3.output[:, -1]`): that `:` is `__nbgrad_rows`. In an invoke, the run
    # passes the invoke's rows there and the whole batch value as the value (`value[start:stop, -1]`, one view, not
    # the rows' view and then its `[:, -1]`: a tensor operation less, run cold inside the hook); else `slice(None)`
    rows: bool


def on_event(rewritten: list, global_names: list, line: int, filename: str) -> OnEvent | None:
    """The OnEvent a rewritten statement is (one request, a Read of a static path's output, nothing that calls or
    branches); else None."""
    body, found = copied(rewritten), []
    if not all(isinstance(statement, (ast.Assign, ast.AugAssign, ast.Expr)) and _only_reads(statement, found)
               for statement in body) or len(found) != 1:
        return None
    read = _static_read(found[0].value)
    if read is None:
        return None
    as_value = _AsValue(found[0])
    body = [as_value.visit(statement) for statement in body]
    statements = ([ast.Global(names=list(global_names))] if global_names else []) + body
    return OnEvent(*read, _function(statements, line, filename, (VALUE, ROWS)), as_value.rows)


class _AsValue(ast.NodeTransformer):
    """The request read as the function's parameter."""
    def __init__(self, request: ast.Yield):
        self.request, self.rows = request, False

    def visit_Yield(self, node: ast.Yield) -> ast.expr:
        return ast.copy_location(ast.Name(id=VALUE, ctx=ast.Load()), node) if node is self.request else node

    def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
        """`(request)[:, ...]`: its `:` read as ROWS (OnEvent.rows)."""
        if node.value is self.request:
            index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if isinstance(index[0], ast.Slice) and index[0].lower is index[0].upper is index[0].step is None:
                index[0] = ast.copy_location(ast.Name(id=ROWS, ctx=ast.Load()), index[0])
                if not isinstance(node.slice, ast.Tuple):
                    node.slice = index[0]
                self.rows = True
        return self.generic_visit(node)


def _only_reads(node: ast.AST, found: list) -> bool:
    """Whether `node` holds only what _ONE allows, saves and requests (into `found`, not looked inside)."""
    if isinstance(node, ast.Yield):
        found.append(node)
        return True
    if isinstance(node, ast.Call) and not node.keywords and _is_runtime(node.func, "save") or isinstance(node, _ONE):
        return all(_only_reads(child, found) for child in ast.iter_child_nodes(node))
    return False


def _is_runtime(node: ast.expr, attribute: str) -> bool:
    """`__nbgrad__.attribute`."""
    return (isinstance(node, ast.Attribute) and node.attr == attribute and isinstance(node.value, ast.Name)
            and node.value.id == RUNTIME_NAME)


def _static_read(request: ast.expr) -> tuple | None:
    """(root, steps, use) of `__nbgrad__.new(__nbgrad__.Read, (lambda: PATH, use, at))`, PATH's steps attribute names
    and int constants; else None."""
    if not (isinstance(request, ast.Call) and _is_runtime(request.func, "new") and len(request.args) == 2
            and _is_runtime(request.args[0], "Read") and isinstance(request.args[1], ast.Tuple)):
        return None
    parts = request.args[1].elts
    if not (len(parts) == 3 and isinstance(parts[0], ast.Lambda) and isinstance(parts[1], ast.Constant)):
        return None
    node, steps = parts[0].body, []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            if node.attr in _NOT_OPERANDS:
                return None
            steps.append(node.attr)
        else:
            index = node.slice
            if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and isinstance(
                    index.operand, ast.Constant) and type(index.operand.value) is int:
                index = ast.Constant(-index.operand.value)
            if not (isinstance(index, ast.Constant) and type(index.value) is int):
                return None
            steps.append(index.value)
        node = node.value
    if not isinstance(node, ast.Name) or not steps:
        return None
    return node.id, tuple(reversed(steps)), parts[1].value
