"""`for` loops the run cannot take as one statement, unrolled before compiling: a loop that makes invokes
(`for layer in range(n): with invoke(corrupt): ...`, one invoke per block entered, all in one batch) and a
loop that reads `.grad` of a name it binds (each iteration's binding is its own tensor). An `if` around an
invoke block is decided the same way, before the run: the block is entered or not.

The loop's iterable is evaluated before the run, in the notebook's names (`elements_of`), and the body is
copied once per element with the loop variable replaced by that element: a constant (`3`, `"a"`) or the
expression that names it (`model.transformer.h[3]`, `list(pairs)[3][1]`). Names the body binds at its own
level get a name of their own per iteration; after the loop each name holds its last iteration's value, as
in Python. Copies keep their lines; `UNROLLED` marks the nodes whose text is no longer the source's.
"""
from __future__ import annotations

import ast
import itertools

from .astcopy import copied
from .cellast import is_backward_block, is_invoke_block, is_path, walk_cell_level
from .dataflow import bound_names, read_names
from ...errors import NbgradError
from ...errors.naming import LOOP_PREFIX, loop_name      # an iteration's own binding of a name: dropped after the run
UNROLLED = "_nbgrad_unrolled"      # attribute of a node whose text is its unparse, not its source segment
MOST_ELEMENTS = 4096
_CONSTANTS = (int, float, str, bool, type(None))


def misplaced_invoke(line: int) -> NbgradError:
    return NbgradError("`with invoke(...)` must stand at the top level of the cell, in a `for` loop or an `if` "
                       "there (no break, continue or else), or in a function the cell calls, not inside another "
                       "statement (a `while`, a `with`, another invoke)", line)


def source_text(source: str, node: ast.AST) -> str:
    """What the cell wrote for `node`, or (in an unrolled copy) what it stands for."""
    text = None if hasattr(node, UNROLLED) else ast.get_source_segment(source, node)
    return text or ast.unparse(node)


class NeedsElements(Exception):
    """The cell has a loop to unroll, whose elements only the notebook's names can tell."""


def unrolled(body: list, elements: tuple | None) -> list:
    """`body` with every loop to unroll unrolled; `elements` is what `elements_of` found for this cell."""
    if not any(_to_unroll(stmt) for stmt in _loop_level(body)):
        return body
    if elements is None:
        raise NeedsElements()
    found = iter(elements)
    return _Unroller(lambda loop: next(found)).statements(body)


def elements_of(body: list, namespace: dict) -> tuple:
    """Per loop to unroll (in the order the unrolled cell meets them), what each element puts in its place;
    per `if` around an invoke, whether its test holds."""
    found: list = []
    bound = set().union(*(bound_names(stmt)[0] for stmt in body))

    def evaluate(node: ast.For | ast.If):
        described = _described(node, namespace, bound) if isinstance(node, ast.For) else \
            _decided(node, namespace, bound)
        found.append(described)
        return described
    _Unroller(evaluate).statements(copied(body))
    return tuple(found)


def _loop_level(body: list):
    """The statements a loop to unroll may be: the cell's, and those of its top-level invoke and backward blocks."""
    for stmt in body:
        yield stmt
        if is_invoke_block(stmt) or is_backward_block(stmt):
            yield from _loop_level(stmt.body)


def _holds_invoke(stmt: ast.stmt) -> bool:
    return any(isinstance(node, ast.With) and is_invoke_block(node) for node in walk_cell_level(stmt))


def _to_unroll(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.If):
        return _holds_invoke(stmt)
    if not isinstance(stmt, ast.For) or stmt.orelse or not _simple_target(stmt.target):
        return False
    inside = [node for inner in stmt.body for node in walk_cell_level(inner)]
    if any(isinstance(node, (ast.Break, ast.Continue)) for node in inside):
        return False
    if any(isinstance(node, ast.With) and is_invoke_block(node) for node in inside):
        return True
    rebound = _own_names(stmt.body)
    return any(isinstance(node, ast.Attribute) and node.attr == "grad" and isinstance(node.value, ast.Name)
               and node.value.id in rebound for node in inside)


def _simple_target(target: ast.expr) -> bool:
    return isinstance(target, ast.Name) or (isinstance(target, ast.Tuple)
                                            and all(isinstance(t, ast.Name) for t in target.elts))


def _target_names(target: ast.expr) -> list:
    return [target.id] if isinstance(target, ast.Name) else [t.id for t in target.elts]


_LOOP_BEFORE = ("a `for` loop that makes invokes (or reads `.grad` of a name it binds) runs over its elements "
                "before the model does")
_IF_BEFORE = "an `if` around `with invoke(...)` is decided before the model runs"


def _before_the_run(expr: ast.expr, namespace: dict, bound: set, what: str, line: int):
    """`expr` evaluated in the notebook's names, before the model runs; an error if the cell binds a name it reads
    (the namespace holds that name's value from before the cell, not the cell's)."""
    text = ast.unparse(expr)
    try:
        value = eval(compile(ast.fix_missing_locations(ast.Expression(body=expr)), "<loop>", "eval"), namespace)
    except Exception as error:
        raise NbgradError(f"{what}: `{text}` could not be evaluated from the notebook's "
                          f"names ({type(error).__name__}: {error}); compute it in an earlier cell", line) from error
    if stale := sorted(read_names(expr) & bound):
        raise NbgradError(f"{what}: `{text}` reads `{stale[0]}`, which this cell binds; "
                          f"compute it in an earlier cell", line)
    return value


def _decided(test: ast.If, namespace: dict, bound: set) -> bool:
    value = _before_the_run(test.test, namespace, bound, _IF_BEFORE, test.lineno)
    try:
        return bool(value)
    except Exception as error:      # a tensor of several values, say
        raise NbgradError(f"{_IF_BEFORE}: `{ast.unparse(test.test)}` has no truth value "
                          f"({type(error).__name__}: {error})", test.lineno) from error


def _described(loop: ast.For, namespace: dict, bound: set) -> tuple:
    """Each element as, per target name, ("c", value) for a constant or ("i", k, j...) for where it sits."""
    iterable = _before_the_run(loop.iter, namespace, bound, _LOOP_BEFORE, loop.lineno)
    try:
        values = list(itertools.islice(iterable, MOST_ELEMENTS + 1))
    except Exception as error:
        raise NbgradError(f"{_LOOP_BEFORE}: `{ast.unparse(loop.iter)}` could not be "
                          f"iterated ({type(error).__name__}: {error})", loop.lineno) from error
    if len(values) > MOST_ELEMENTS:
        raise NbgradError(f"`{ast.unparse(loop.iter)}` has more than {MOST_ELEMENTS} elements: too many "
                          f"invokes or copies for one run", loop.lineno)
    names = _target_names(loop.target)
    described = []
    for k, value in enumerate(values):
        parts = [value] if isinstance(loop.target, ast.Name) else list(value)
        if len(parts) != len(names):
            raise NbgradError(f"element {k} of `{ast.unparse(loop.iter)}` does not unpack into "
                              f"`{ast.unparse(loop.target)}`", loop.lineno)
        described.append(tuple(("c", part) if type(part) in _CONSTANTS else
                               ("i", k) if isinstance(loop.target, ast.Name) else ("i", k, j)
                               for j, part in enumerate(parts)))
    return tuple(described)


def _element_expr(loop: ast.For, described: tuple) -> ast.expr:
    if described[0] == "c":
        return ast.Constant(described[1])
    index = described[1:]
    iterable = loop.iter
    source = copied(iterable)
    if (len(index) == 2 and index[1] == 1 and isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name)
            and iterable.func.id == "enumerate" and len(iterable.args) == 1 and is_path(iterable.args[0])):
        source, index = copied(iterable.args[0]), index[:1]       # `enumerate(blocks)` -> `blocks[k]`
    elif not (len(index) == 1 and is_path(iterable)):
        source = ast.Call(func=ast.Name("list", ast.Load()), args=[source], keywords=[])
    for position in index:
        source = ast.Subscript(value=source, slice=ast.Constant(position), ctx=ast.Load())
    return source


class _Unroller:
    def __init__(self, elements_for):
        self.elements_for = elements_for     # loop -> its described elements; `if` -> whether it holds
        self.serial = 0

    def statements(self, body: list) -> list:
        result = []
        for stmt in body:
            if isinstance(stmt, ast.If) and _to_unroll(stmt):      # entered or not, as its test says now
                result.extend(self.statements(stmt.body if self.elements_for(stmt) else stmt.orelse))
            elif _to_unroll(stmt):
                result.extend(self.loop(stmt))
            elif is_invoke_block(stmt) or is_backward_block(stmt):
                stmt.body = self.statements(stmt.body)
                result.append(stmt)
            else:
                result.append(stmt)
        return result

    def loop(self, loop: ast.For) -> list:
        described = self.elements_for(loop)
        names = _target_names(loop.target)
        copies, versions, last = [], {}, None
        for iteration, element in enumerate(described):
            last = {name: _element_expr(loop, part) for name, part in zip(names, element)}
            body = self._decided([ast.fix_missing_locations(_Substitute(last).visit(copied(stmt)))
                                  for stmt in loop.body])
            copies.extend(self.statements(self._renamed(body, _own_names(body), versions, iteration)))
        if last is not None:
            for name, value in {**last, **{n: ast.Name(v, ast.Load()) for n, v in versions.items()}}.items():
                assign = ast.Assign(targets=[ast.Name(name, ast.Store())], value=_marked(value))
                copies.append(ast.fix_missing_locations(ast.copy_location(_marked(assign), loop)))
        return copies

    def _decided(self, body: list) -> list:
        """A copy's `if`s around invokes replaced by the branch taken: what it binds is the copy's own."""
        result = []
        for stmt in body:
            chosen = isinstance(stmt, ast.If) and _to_unroll(stmt)
            result.extend(self._decided(stmt.body if self.elements_for(stmt) else stmt.orelse) if chosen else [stmt])
        return result

    def _renamed(self, body: list, own: set, versions: dict, iteration: int) -> list:
        """Each name of `own` bound in this copy gets a name of its own; reads see the latest one."""
        for stmt in body:
            if is_invoke_block(stmt):
                self._renamed(stmt.body, own, versions, iteration)
                continue
            _Rename(versions).visit(stmt)
            for target in (stmt.targets if isinstance(stmt, ast.Assign) else
                           [stmt.target] if isinstance(stmt, ast.AnnAssign) else []):
                if isinstance(target, ast.Name) and target.id in own:
                    self.serial += 1
                    versions[target.id] = loop_name(self.serial, iteration, target.id)
                    target.id = versions[target.id]
        return body


def _own_names(body: list) -> set:
    """Names the loop body binds only by `NAME = ...` at its own level (or an invoke block's in it)."""
    flat, elsewhere = set(), set()
    for stmt in body:
        if is_invoke_block(stmt):
            inner = _own_names(stmt.body)
            flat |= inner
            elsewhere |= {n.id for s in stmt.body for n in walk_cell_level(s) if isinstance(n, ast.Name)
                          and isinstance(n.ctx, ast.Store)} - inner
            continue
        simple = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) \
            else []
        direct = {t.id for t in simple if isinstance(t, ast.Name)}
        flat |= direct
        stores = {n.id for n in walk_cell_level(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        elsewhere |= stores - direct
    return flat - elsewhere


def _marked(node: ast.AST) -> ast.AST:
    setattr(node, UNROLLED, True)
    return node


class _Substitute(ast.NodeTransformer):
    """Reads of the loop's names -> the element's expression; every node around one is marked UNROLLED."""

    def __init__(self, values: dict):
        self.values = values

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in self.values:
            return ast.copy_location(_marked(copied(self.values[node.id])), node)
        return node

    def generic_visit(self, node):
        super().generic_visit(node)
        if any(getattr(child, UNROLLED, False) for child in ast.iter_child_nodes(node)):
            _marked(node)
        return node


class _Rename(_Substitute):
    def __init__(self, versions: dict):
        super().__init__({name: ast.Name(version, ast.Load()) for name, version in versions.items()})
