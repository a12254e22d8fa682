"""A misspelled event of a remote model's module (`big.transformer.h[0].outptu`, `.skp(v)`, `.inptu`) or of a site
(`M.source.SITE.outptu`), found on the skeleton before the cell is sent: the AttributeError the local run raises at
that line, with the same note ("did you mean `.output`?"; a site's error says what a site has).

Only what a run surely reaches is checked (the cell's statements, `with` blocks and loops over modules, not an `if`
or a function's body), and only an attribute near an event's name that the module does not have and the cell
never sets: what a run would also have found, and nothing a run would not."""
from __future__ import annotations

import ast
import copy
import difflib

from torch import nn

from ..engine.compile.program import RUNTIME_NAME
from ..engine.compile.siteaccess import open_sources
from ..engine.run.runtime import Runtime
from ..engine.run.sites import Site
from ..errors import cell_traceback
from ..errors.hints import EVENT_LIKE, note_misspelled_event

SITE_EVENTS = (*EVENT_LIKE, "grad")        # a site's: `M.source.SITE.grad` is its value's gradient

# The nodes of a plain path (`big.transformer.h[0]`, `blocks[-1]`): evaluating one runs no code of the notebook's
_PATH_NODES = (ast.Name, ast.Attribute, ast.Subscript, ast.Constant, ast.UnaryOp, ast.USub, ast.Slice, ast.Tuple,
               ast.List, ast.Load)
_EAGER_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp)


def check_event_names(text: str, names: dict, filename: str, skeleton: nn.Module) -> None:
    """Raise the local run's AttributeError for the first misspelled event of a module of `skeleton` in the cell
    `text` (compiled as `filename`, whose lines the error's frame shows); `names`: the cell's names, its remote
    modules on the skeleton."""
    tree = ast.parse(text, filename=filename)
    bound, set_attributes = bindings(tree)
    modules = {id(module) for module in skeleton.modules()}
    known = {name: value for name, value in names.items() if bound.get(name, 0) == 0}
    for node, scope in sorted(reached(tree.body, known, bound), key=lambda found: (found[0].lineno,
                                                                                    found[0].col_offset)):
        if node.attr in set_attributes or node.attr in SITE_EVENTS or \
                not difflib.get_close_matches(node.attr, SITE_EVENTS, n=1, cutoff=0.6):
            continue
        value = value_of(node.value, scope)
        site = isinstance(value, Site)          # `M.source.SITE.outptu`: the site's own error
        owner, events = (value.table.root.module_ref(), SITE_EVENTS) if site else (value, EVENT_LIKE)
        if id(owner) in modules and difflib.get_close_matches(node.attr, events, n=1, cutoff=0.6) and \
                not hasattr(value, node.attr):
            raise _raised(node, scope, filename)


def bindings(tree: ast.AST) -> tuple:
    """({name: how many times the cell binds it}, attribute names the cell sets)."""
    bound: dict = {}
    set_attributes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound[node.id] = bound.get(node.id, 0) + 1
        elif isinstance(node, ast.arg):
            bound[node.arg] = bound.get(node.arg, 0) + 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = bound.get(node.name, 0) + 1
        elif isinstance(node, ast.alias):
            name = (node.asname or node.name).split(".")[0]
            bound[name] = bound.get(name, 0) + 1
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            set_attributes.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            set_attributes.update(arg.value for arg in node.args[1:2] if isinstance(arg, ast.Constant))
    return bound, set_attributes


def reached(body: list, scope: dict, bound: dict, wanted: type = ast.Attribute):
    """(node, the names it is read with) of every `wanted` node (an attribute read, a call) that a run of `body`
    reaches."""
    for statement in body:
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            for item in statement.items:
                yield from _reads(item.context_expr, scope, bound, wanted)
            yield from reached(statement.body, scope, bound, wanted)
        elif isinstance(statement, ast.For):
            yield from _reads(statement.iter, scope, bound, wanted)
            inner = _loop_scope(statement.target, statement.iter, scope, bound)
            if inner is not None:
                yield from reached(statement.body, inner, bound, wanted)
        elif isinstance(statement, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)):
            yield from _reads(statement, scope, bound, wanted)


def _reads(tree: ast.AST, scope: dict, bound: dict, wanted: type):
    """The `wanted` nodes (attribute reads, calls) of one expression (or simple statement), an eager comprehension over modules included
    (its first element stands for the rest); lambdas and generators, which may never run, left out."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Lambda, ast.GeneratorExp)):
            continue
        if isinstance(node, _EAGER_COMPREHENSIONS):
            yield from _comprehension(node, scope, bound, wanted)
            continue
        if isinstance(node, wanted) and isinstance(getattr(node, "ctx", ast.Load()), ast.Load):
            yield node, scope
        todo.extend(ast.iter_child_nodes(node))


def _comprehension(node, scope: dict, bound: dict, wanted: type):
    [generator, *more] = node.generators
    yield from _reads(generator.iter, scope, bound, wanted)
    inner = None if more or generator.ifs else _loop_scope(generator.target, generator.iter, scope, bound)
    if inner is not None:
        for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
            yield from _reads(part, inner, bound, wanted)


def _loop_scope(target: ast.AST, iterable: ast.AST, scope: dict, bound: dict) -> dict | None:
    """The names a loop's body is read with when it walks modules (`for b in big.transformer.h`): its variable as
    the first module; None when the loop may not run, or not over modules."""
    if not isinstance(target, ast.Name) or bound.get(target.id) != 1:
        return None
    container = value_of(iterable, scope)
    if not isinstance(container, (nn.ModuleList, nn.Sequential)) or len(container) == 0:
        return None
    return {**scope, target.id: container[0]}


def value_of(node: ast.AST, scope: dict, unknown=None):
    """What a plain path (or a constant, a list of them) names in `scope`; `unknown` for anything else (a call, a
    name the cell binds)."""
    if not all(isinstance(part, _PATH_NODES) for part in ast.walk(node)):
        return unknown
    try:
        return eval(compile(ast.Expression(_opened(node)), "<path>", "eval"), {**scope, RUNTIME_NAME: Runtime})
    except Exception:
        return unknown


def _opened(node: ast.expr) -> ast.expr:
    """The expression as a run evaluates it: `X.source` is `__nbgrad__.source_of(X)` (compile/siteaccess.py)."""
    return open_sources(ast.Module(body=[ast.Expr(copy.deepcopy(node))], type_ignores=[])).body[0].value


def _raised(node: ast.Attribute, scope: dict, filename: str) -> AttributeError:
    """The module's own AttributeError, raised at the cell's line (a frame of `filename`), with the run's note."""
    try:
        eval(compile(ast.Expression(_opened(node)), filename, "eval"), {**scope, RUNTIME_NAME: Runtime})
    except AttributeError as error:
        note_misspelled_event(error)
        return error.with_traceback(cell_traceback(error.__traceback__))
    raise AssertionError(f"{ast.unparse(node)} was found on the skeleton")    # _value said it is not there
