"""Invokes made in a function the cell calls: `def patch(layer): with invoke(corrupt): ...` (defined in the cell
or an earlier one), called at the cell's level, in a `for` loop, under an `if` or in a comprehension.

The invokes are laid out before the model runs, so each call is replaced by the function's body before
compiling, as if the cell had written it there: parameters read what the call passes (an argument with calls in
it is bound to a name of its own first), the function's own names get names of their own per call (dropped after
the run, as an unrolled loop's are: LOOP_PREFIX), and its `return` binds the value the call stands for. A
comprehension that calls such a function becomes the `for` loop it stands for (unroll.py unrolls it: one invoke
per block entered). Any other use of the function (passed to `map`, called by another function) is refused with
an error that names the form and what to write instead.
"""
from __future__ import annotations

import ast

from .astcopy import copied
from .cellast import is_invoke_block, makes_invokes, walk_cell_level
from .unroll import LOOP_PREFIX, _Substitute
from ...errors import NbgradError

CALL_PREFIX = f"{LOOP_PREFIX}call"
MOST_DEPTH = 16            # functions that make invokes calling each other, inlined this deep at most
_PURE = (ast.Call, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda, ast.ListComp, ast.SetComp,
         ast.DictComp, ast.GeneratorExp)


def inlined(body: list, helpers: tuple = ()) -> list:
    """`body` with every call of a function that makes invokes replaced by that function's body. `helpers`:
    (name, source) of functions from earlier cells that the cell calls (helpers.py)."""
    makers = {stmt.name: (stmt, False) for stmt in body if makes_invokes(stmt)}
    for name, text in helpers:
        definition = ast.parse(text).body[0]
        if makes_invokes(definition):
            makers[name] = (definition, True)
    return _Inliner(makers).statements(body) if makers else body


def refused(name: str, form: str, line: int) -> NbgradError:
    return NbgradError(f"`{name}` makes invokes, which nbgrad lays out before the model runs, so it must be called "
                       f"by name at the cell's level, in a `for` loop, under an `if` or in a comprehension "
                       f"(`outs = [{name}(x) for x in xs]`), not {form}", line)


class _Inliner:
    def __init__(self, makers: dict):
        self.makers = makers           # name -> (its `def`, whether it comes from an earlier cell)
        self.serial = 0
        self.depth = 0

    def mentioned(self, node: ast.AST):
        return next((n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in self.makers), None)

    def statements(self, body: list) -> list:
        result = []
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name in self.makers and not self.makers[stmt.name][1]:
                result.append(stmt)      # stays as written: the name is bound for later cells
            elif isinstance(stmt, (ast.For, ast.If, ast.With, ast.While)):
                self._plain_header(stmt)
                stmt.body = self.statements(stmt.body)
                if not isinstance(stmt, ast.With):
                    stmt.orelse = self.statements(stmt.orelse)
                result.append(stmt)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Try)) \
                    and (found := self.mentioned(stmt)) is not None:
                raise refused(found.id, "inside another function, class or `try`", found.lineno)
            else:
                before: list = []
                stmt = _Calls(self, before).visit(stmt)
                result.extend(before)
                if not (before and isinstance(stmt, ast.Expr) and isinstance(stmt.value, (ast.Name, ast.Constant))):
                    result.append(stmt)
        return result

    def _plain_header(self, stmt: ast.stmt) -> None:
        headers = {ast.For: lambda: [stmt.target, stmt.iter], ast.If: lambda: [stmt.test],
                   ast.While: lambda: [stmt.test], ast.With: lambda: stmt.items}[type(stmt)]()
        for header in headers:
            if (found := self.mentioned(header)) is not None:
                raise refused(found.id, "in the header of a `for`, `if`, `while` or `with`", found.lineno)

    def call(self, node: ast.Call, before: list) -> ast.expr:
        """The statements of one call, added to `before`; the expression the call's value is then."""
        name = node.func.id
        definition, earlier = self.makers[name]
        if self.depth >= MOST_DEPTH:
            raise refused(name, f"in calls nested more than {MOST_DEPTH} deep (does it call itself?)", node.lineno)
        self.serial += 1
        tag = f"{CALL_PREFIX}{self.serial}_"
        body = copied(definition.body)
        if earlier:      # its lines are another cell's: its statements stand on the calling line
            for child in (n for stmt in body for n in ast.walk(stmt) if "lineno" in n._attributes):
                child.lineno, child.end_lineno, child.col_offset, child.end_col_offset = node.lineno, node.lineno, 0, 0
        bindings = self._arguments(definition, node, tag, before)
        own = _local_names(definition) - set(bindings)      # the parameters bound first among them
        body = [_Rename({n: tag + n for n in own}).visit(stmt) for stmt in body if not isinstance(stmt, ast.Global)]
        body = [ast.fix_missing_locations(_Substitute(bindings).visit(stmt)) for stmt in body]
        returned = _returns_bound(body, name, tag + "return")
        self.depth += 1
        try:
            before.extend(self.statements(body))
        finally:
            self.depth -= 1
        return ast.Name(tag + "return", ast.Load()) if returned else ast.Constant(None)

    def _arguments(self, definition: ast.FunctionDef, node: ast.Call, tag: str, before: list) -> dict:
        """Parameter -> the expression its reads become: what the call passes (or the default). A parameter the
        function assigns, or given an expression that calls something, is bound to its own name first instead."""
        args, name = definition.args, definition.name
        if args.vararg or args.kwarg or any(isinstance(a, ast.Starred) for a in node.args) or \
                any(k.arg is None for k in node.keywords):
            raise refused(name, "with `*args` or `**kwargs` (give each argument by name or position)", node.lineno)
        positional = args.posonlyargs + args.args
        if len(node.args) > len(positional):
            raise NbgradError(f"`{name}` takes {len(positional)} positional arguments; the call passes "
                              f"{len(node.args)}", node.lineno)
        given = dict(zip((a.arg for a in positional), node.args)) | {k.arg: k.value for k in node.keywords}
        defaults = dict(zip((a.arg for a in positional[len(positional) - len(args.defaults):]), args.defaults))
        defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
        assigned = _local_names(definition, parameters=False)
        inputs = {n.id for w in walk_cell_level(definition) if isinstance(w, ast.With) and is_invoke_block(w)
                  for n in ast.walk(w.items[0].context_expr) if isinstance(n, ast.Name)}
        bindings = {}
        for parameter in (a.arg for a in positional + args.kwonlyargs):
            value = given.get(parameter, defaults.get(parameter))
            if value is None:
                raise NbgradError(f"`{name}(...)` is called without its argument `{parameter}`", node.lineno)
            if parameter in assigned or any(isinstance(n, _PURE) for n in ast.walk(value)):
                if parameter in inputs:
                    raise _input_error(name, parameter, None if parameter in assigned else value, node.lineno)
                before.append(ast.copy_location(ast.Assign(targets=[ast.Name(tag + parameter, ast.Store())],
                                                           value=value), node))
            else:
                bindings[parameter] = value
        unknown = set(given) - {a.arg for a in positional + args.kwonlyargs}
        if unknown:
            raise NbgradError(f"`{name}(...)` has no parameter `{sorted(unknown)[0]}`", node.lineno)
        return bindings

    def comprehension(self, node: ast.expr, before: list) -> ast.expr:
        """`[patch(x) for x in xs if ...]` -> the `for` loop it stands for, its variables named per comprehension."""
        self.serial += 1
        tag = f"{CALL_PREFIX}{self.serial}_"
        variables = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        node = _Rename({v: tag + v for v in variables}).visit(copied(node))
        result = ast.Name(tag + "result", ast.Load())
        if isinstance(node, ast.DictComp):
            initial = ast.Dict(keys=[], values=[])
            add = ast.Assign(targets=[ast.Subscript(value=result, slice=node.key, ctx=ast.Store())], value=node.value)
        else:
            method = "add" if isinstance(node, ast.SetComp) else "append"
            initial = ast.Call(func=ast.Name("set", ast.Load()), args=[], keywords=[]) \
                if isinstance(node, ast.SetComp) else ast.List(elts=[], ctx=ast.Load())
            add = ast.Expr(ast.Call(func=ast.Attribute(value=result, attr=method, ctx=ast.Load()), args=[node.elt],
                                    keywords=[]))
        loop = add
        for generator in reversed(node.generators):
            if generator.is_async:
                raise refused(self.mentioned(node).id, "in an `async` comprehension", node.lineno)
            for condition in reversed(generator.ifs):
                loop = ast.If(test=condition, body=[loop], orelse=[])
            loop = ast.For(target=generator.target, iter=generator.iter, body=[loop], orelse=[])
        start = ast.Assign(targets=[ast.Name(tag + "result", ast.Store())], value=initial)
        before.extend(ast.fix_missing_locations(ast.copy_location(s, node)) for s in [start, loop])
        before[-1:] = self.statements(before[-1:])
        if isinstance(node, ast.GeneratorExp):
            return ast.Call(func=ast.Name("iter", ast.Load()), args=[result], keywords=[])
        return result


def _input_error(name: str, parameter: str, value, line: int) -> NbgradError:
    """A parameter given to `invoke(...)` that cannot be known before the run: assigned in the function, or passed
    an expression that calls something (`value`)."""
    why = (f"the call passes `{ast.unparse(value)}`, which calls something" if value is not None else
           f"`{name}` assigns `{parameter}`")
    return NbgradError(f"`{name}` gives its parameter `{parameter}` to `invoke(...)`, whose INPUT is evaluated before "
                       f"the model runs, but {why}: pass the input itself (a name, a value, an element of a list), "
                       f"computed before the cell if it needs a call", line)


class _Calls(ast.NodeTransformer):
    """In one statement: calls of the functions that make invokes, and comprehensions that hold one, replaced."""

    def __init__(self, inliner: _Inliner, before: list):
        self.inliner, self.before = inliner, before

    def visit_Call(self, node):
        if not (isinstance(node.func, ast.Name) and node.func.id in self.inliner.makers):
            return self.generic_visit(node)
        node.args = [self.visit(a) for a in node.args]          # inner calls first, as Python evaluates them
        node.keywords = [self.visit(k) for k in node.keywords]
        return self.inliner.call(node, self.before)

    def visit_Name(self, node):
        if node.id in self.inliner.makers:
            raise refused(node.id, "used as a value (passed to another function, stored or bound)", node.lineno)
        return node

    def _comprehension(self, node):
        return node if self.inliner.mentioned(node) is None else self.inliner.comprehension(node, self.before)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def _conditional(self, node):
        if (found := self.inliner.mentioned(node)) is not None:
            raise refused(found.id, "inside a lambda, a conditional expression or `and` / `or` (write an `if` "
                                    "statement)", found.lineno)
        return node

    visit_Lambda = visit_IfExp = visit_BoolOp = _conditional


def _local_names(definition: ast.FunctionDef, parameters: bool = True) -> set:
    """The names a function binds in its own scope (its parameters too, with `parameters`), less its globals."""
    stored = {n.id for stmt in definition.body for n in walk_cell_level(stmt)
              if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    stored |= {n.name for stmt in definition.body for n in walk_cell_level(stmt)
               if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n is not definition}
    declared = {name for stmt in definition.body for n in walk_cell_level(stmt)
                if isinstance(n, ast.Global) for name in n.names}
    if any(isinstance(n, ast.Nonlocal) for stmt in definition.body for n in walk_cell_level(stmt)):
        raise refused(definition.name, "with a `nonlocal` name", definition.lineno)
    arguments = definition.args
    names = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs} if parameters else set()
    return (stored | names) - declared


def _returns_bound(body: list, name: str, target: str) -> bool:
    """Replace the function's `return` (its last statement, or the last of its last invoke block) by a binding of
    `target`; whether it has one."""
    last = body[-1] if body else None
    if last is not None and is_invoke_block(last) and last.body and isinstance(last.body[-1], ast.Return):
        holder = last.body
    else:
        holder = body
    returns = [n for stmt in body for n in walk_cell_level(stmt) if isinstance(n, ast.Return)]
    if not returns:
        return False
    if len(returns) > 1 or not holder or holder[-1] is not returns[0]:
        raise refused(name, "with a `return` before its end (a function that makes invokes returns only as its "
                            "last statement, or the last of its last invoke block)", returns[0].lineno)
    value = returns[0].value or ast.Constant(None)
    holder[-1] = ast.copy_location(ast.Assign(targets=[ast.Name(target, ast.Store())], value=value), returns[0])
    return True


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict):
        self.names = names

    def visit_Name(self, node):
        if node.id in self.names:
            node.id = self.names[node.id]
        return node
