"""Compile a cell into a Program: nodes (generator functions) plus the hook graph they form.

Every top-level statement is a node; the body of `with LOSS.backward():` is flattened into nodes
of that pass. Inside a node, event accesses become `yield` requests that the runtime answers:

    M.output            -> (yield ("read", lambda: M, use))
    M.output = v        -> (yield ("write", lambda: M, use, v))
    T.grad              -> (yield ("grad", T, use, pass))
    T.grad = g          -> (yield ("set_grad", T, use, pass, g))
    L.backward(...)     -> (yield ("backward", L, pass, [args], {kwargs}))
    x.save()            -> __nbgrad__.save(x, line)

Names bound by a node are declared `global`, so they land in the cell's namespace.
"""
from __future__ import annotations

import ast
import textwrap
import types
from dataclasses import dataclass, field
from functools import lru_cache

from .errors import NbgradError, register_cell_source
from .graph import BackwardPass, EventUse, HookGraph, Node

RUNTIME_NAME = "__nbgrad__"
TEMP_PREFIX = "__nbgrad_"
MODULE_EVENTS = ("output", "input", "inputs")


@dataclass
class CompiledNode:
    spec: Node
    code: types.CodeType


@dataclass
class Program:
    source: str
    mode: str                       # "trace" or "backward"
    filename: str
    graph: HookGraph
    nodes: list
    uses: list                      # EventUse by use id
    static_targets: list            # (kind, target source, eval code) known before the run
    candidate_targets: list         # (kind, container source, eval code): hook every child
    bound_names: frozenset = field(default_factory=frozenset)
    grad_targets: list = field(default_factory=list)   # (pass, event kind, every element?, eval code)


_serial = 0


@lru_cache(maxsize=256)
def compile_cell(source: str, mode: str = "trace") -> Program:
    """Compile (cached by text): the same cell run again pays no compile cost."""
    global _serial
    source = textwrap.dedent(source)
    _serial += 1
    filename = register_cell_source(source, _serial)
    try:
        module = ast.parse(source, filename=filename)
    except SyntaxError as error:
        error.filename = filename
        raise
    return _Builder(source, mode, filename).build(module.body)


# --- small AST helpers -------------------------------------------------------------------------

def event_root(expr: ast.AST):
    """The outermost event attribute (`.output`, `.grad`, ...) a chain like `M.output[0][:, 1]` hangs from."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        if isinstance(expr, ast.Attribute) and (expr.attr in MODULE_EVENTS or expr.attr == "grad"):
            return expr
        expr = expr.value
    return None


def is_backward_call(expr: ast.AST) -> bool:
    return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and expr.func.attr == "backward")


def is_backward_block(stmt: ast.AST) -> bool:
    return (isinstance(stmt, ast.With) and len(stmt.items) == 1
            and stmt.items[0].optional_vars is None and is_backward_call(stmt.items[0].context_expr))


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


def _position(node: ast.AST) -> tuple:
    return (node.lineno, node.col_offset)


def _yield(*parts: ast.expr) -> ast.Yield:
    return ast.Yield(value=ast.Tuple(elts=list(parts), ctx=ast.Load()))


def _const(value) -> ast.Constant:
    return ast.Constant(value=value)


def _thunk(expr: ast.expr) -> ast.Lambda:
    args = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[],
                         kwarg=None, defaults=[])
    return ast.Lambda(args=args, body=expr)


class _BoundNames(ast.NodeVisitor):
    """Names a statement binds at its own level (not inside functions, classes, comprehensions)."""

    def __init__(self):
        self.names: set = set()
        self.mutated: set = set()

    def visit_Name(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.names.add(node.id)

    def visit_FunctionDef(self, node):
        self.names.add(node.name)
        for decorator in node.decorator_list:
            self.visit(decorator)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.names.add(node.name)

    def visit_Lambda(self, node):
        pass

    def _comprehension(self, node):
        for walrus in (n for n in ast.walk(node) if isinstance(n, ast.NamedExpr)):
            self.names.add(walrus.target.id)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node):
        for alias in node.names:
            self.names.add((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node):
        if node.name:
            self.names.add(node.name)
        self.generic_visit(node)

    def visit_Expr(self, node):
        # `outs.append(x)` changes `outs`: order it like a binding.
        call = node.value
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and event_root(call.func.value) is None):
            root = call.func.value
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if isinstance(root, ast.Name):
                self.mutated.add(root.id)
        self.generic_visit(node)

    def _store_target(self, target):
        if event_root(target) is not None or _is_event_attr(target):
            return          # an edit of an event value, not of the name it hangs from
        root = target
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if root is not target and isinstance(root, ast.Name):
            self.mutated.add(root.id)

    def visit_Assign(self, node):
        for target in node.targets:
            self._store_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._store_target(node.target)
        self.generic_visit(node)


def bound_names(stmt: ast.stmt) -> tuple:
    finder = _BoundNames()
    finder.visit(stmt)
    return finder.names, finder.mutated


def read_names(stmt: ast.stmt) -> set:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def written_events(stmt: ast.stmt) -> set:
    """ids of event attributes that a statement edits in place (subscript stores, `x_()` calls)."""
    written = set()
    for node in ast.walk(stmt):
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t for t in node.targets if isinstance(t, ast.Subscript)]
        elif isinstance(node, ast.AugAssign):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr.endswith("_") and not node.func.attr.startswith("_")
              and node.func.attr != "requires_grad_"):
            targets = [node.func.value]
        for target in targets:
            root = event_root(target.value if isinstance(target, ast.Attribute)
                              and target.attr in MODULE_EVENTS + ("grad",) else target)
            if root is not None:
                written.add(id(root))
    return written


# --- the rewrite -------------------------------------------------------------------------------

def _touches_events(expr: ast.AST) -> bool:
    return any(_is_event_attr(n) or is_backward_call(n) for n in ast.walk(expr))


class _Rewriter(ast.NodeTransformer):
    def __init__(self, builder: "_Builder", written: set):
        self.builder = builder
        self.written = written
        self.hoisted: list = []          # nested generator functions that replace comprehensions

    def _comprehension(self, node):
        """`[f(h.output) for h in hs]` -> `(yield from __nbgrad_comp_K())`, a generator that builds the list."""
        if not _touches_events(node):
            return node
        result = ast.Name(id=f"{TEMP_PREFIX}result", ctx=ast.Load())
        if isinstance(node, ast.DictComp):
            initial = ast.Dict(keys=[], values=[])
            innermost = ast.Assign(targets=[ast.Subscript(value=result, slice=node.key, ctx=ast.Store())],
                                   value=node.value)
        else:
            initial = ast.Set(elts=[]) if isinstance(node, ast.SetComp) else ast.List(elts=[], ctx=ast.Load())
            if isinstance(node, ast.SetComp):
                initial = ast.Call(func=ast.Name(id="set", ctx=ast.Load()), args=[], keywords=[])
            method = "add" if isinstance(node, ast.SetComp) else "append"
            innermost = ast.Expr(value=ast.Call(func=ast.Attribute(value=result, attr=method, ctx=ast.Load()),
                                                args=[node.elt], keywords=[]))
        body = innermost
        for generator in reversed(node.generators):
            for condition in reversed(generator.ifs):
                body = ast.If(test=condition, body=[body], orelse=[])
            body = ast.For(target=generator.target, iter=generator.iter, body=[body], orelse=[])
        name = f"{TEMP_PREFIX}comp_{len(self.builder.uses)}_{len(self.hoisted)}"
        statements = [ast.Assign(targets=[ast.Name(id=result.id, ctx=ast.Store())], value=initial), body,
                      ast.Return(value=result),
                      ast.If(test=_const(False), body=[ast.Expr(value=ast.Yield(value=None))], orelse=[])]
        args = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[],
                             kwarg=None, defaults=[])
        function = ast.FunctionDef(name=name, args=args, body=statements, decorator_list=[], returns=None)
        ast.copy_location(function, node)
        for child in ast.walk(function):
            if not hasattr(child, "lineno") or getattr(child, "lineno", None) is None:
                ast.copy_location(child, node)
        self.hoisted.append(self.visit(function))
        return ast.YieldFrom(value=ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=[], keywords=[]))

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def _function(self, node):
        """Functions the cell defines run as plain Python when called: nbgrad cannot pause inside a call,
        so a module event there is an error; `.grad` and `.backward()` keep their PyTorch meaning."""
        if getattr(node, "name", "").startswith(TEMP_PREFIX):
            return self.generic_visit(node)          # a comprehension nbgrad turned into a generator
        for inner in ast.walk(node):
            if isinstance(inner, ast.Attribute) and inner.attr in MODULE_EVENTS:
                raise NbgradError(f"`.{inner.attr}` inside a function defined in the cell: nbgrad runs "
                                  f"statements when their events fire and cannot wait inside a function call. "
                                  f"Read it at the top level of the cell (loops and comprehensions are fine) "
                                  f"and pass the value to the function", inner.lineno)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _use(self, kind, target: ast.expr, node: ast.AST, write: bool) -> int:
        return self.builder.add_use(kind, target, node.lineno, write)

    def visit_Attribute(self, node):
        if not isinstance(node.ctx, ast.Load) or (node.attr not in MODULE_EVENTS and node.attr != "grad"):
            return self.generic_visit(node)
        write = id(node) in self.written
        use = self._use(node.attr, node.value, node, write)
        base = self.visit(node.value)
        if node.attr == "grad":
            return _yield(_const("grad"), base, _const(use), _const(self.builder.pass_for(node)))
        return _yield(_const("read"), _thunk(base), _const(use))

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "save" and not node.args and not node.keywords:
            saver = ast.Attribute(value=ast.Name(id=RUNTIME_NAME, ctx=ast.Load()), attr="save", ctx=ast.Load())
            label = ast.get_source_segment(self.builder.source, func.value) or ast.unparse(func.value)
            return ast.Call(func=saver, args=[self.visit(func.value), _const(node.lineno), _const(label)],
                            keywords=[])
        if is_backward_call(node):
            return self._backward(node, block=False)
        return self.generic_visit(node)

    def _backward(self, call: ast.Call, block: bool) -> ast.Yield:
        if _position(call) not in self.builder.pass_at:
            raise NbgradError("a %%backward body cannot start another backward pass; "
                              "use a %%trace cell for several passes", call.lineno)
        pass_index = self.builder.pass_at[_position(call)]
        args = ast.List(elts=[self.visit(a) for a in call.args], ctx=ast.Load())
        kwargs = ast.Dict(keys=[_const(k.arg) if k.arg else None for k in call.keywords],
                          values=[self.visit(k.value) for k in call.keywords])
        return _yield(_const("backward"), self.visit(call.func.value), _const(pass_index), args, kwargs,
                      _const(block))

    def _event_store(self, target: ast.Attribute, value: ast.expr, line: int) -> ast.stmt:
        use = self.builder.add_use(target.attr, target.value, line, True)
        base = self.visit(target.value)
        if target.attr == "grad":
            request = _yield(_const("set_grad"), base, _const(use), _const(self.builder.pass_for(target)), value)
        else:
            request = _yield(_const("write"), _thunk(base), _const(use), value)
        return ast.Expr(value=request)

    def visit_Assign(self, node):
        if not any(_is_event_attr(t) for t in node.targets):
            return self.generic_visit(node)
        temp = f"{TEMP_PREFIX}value"
        statements = [ast.Assign(targets=[ast.Name(id=temp, ctx=ast.Store())], value=self.visit(node.value))]
        for target in node.targets:
            if _is_event_attr(target):
                statements.append(self._event_store(target, ast.Name(id=temp, ctx=ast.Load()), node.lineno))
            else:
                statements.append(ast.Assign(targets=[self.visit(target)], value=ast.Name(id=temp, ctx=ast.Load())))
        return [ast.copy_location(s, node) for s in statements]

    def visit_AugAssign(self, node):
        if not _is_event_attr(node.target):
            return self.generic_visit(node)
        temp = f"{TEMP_PREFIX}value"
        read = ast.Attribute(value=node.target.value, attr=node.target.attr, ctx=ast.Load())
        self.written.add(id(read))
        statements = [
            ast.Assign(targets=[ast.Name(id=temp, ctx=ast.Store())], value=self.visit(read)),
            ast.AugAssign(target=ast.Name(id=temp, ctx=ast.Store()), op=node.op, value=self.visit(node.value)),
            self._event_store(node.target, ast.Name(id=temp, ctx=ast.Load()), node.lineno),
        ]
        return [ast.copy_location(s, node) for s in statements]

    def visit_With(self, node):
        if is_backward_block(node):
            raise NbgradError("`with ....backward():` must stand at the top level of the cell, "
                              "not inside another statement", node.lineno)
        return self.generic_visit(node)


def _is_event_attr(target: ast.AST) -> bool:
    return isinstance(target, ast.Attribute) and (target.attr in MODULE_EVENTS or target.attr == "grad")


def _is_path(expr: ast.expr, names: frozenset | None = None) -> bool:
    """A name followed by attributes and subscripts, safe to evaluate early. With `names`, the root and
    any name used as an index must be among them (names the cell does not bind); without, any root name
    and constant indices only."""
    if isinstance(expr, ast.Name):
        return names is None or expr.id in names
    if isinstance(expr, ast.Attribute):
        return expr.attr not in MODULE_EVENTS and expr.attr != "grad" and _is_path(expr.value, names)
    if isinstance(expr, ast.Subscript):
        index = expr.slice
        if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
            index = index.operand
        by_name = names is not None and isinstance(index, ast.Name) and index.id in names
        return (isinstance(index, ast.Constant) or by_name) and _is_path(expr.value, names)
    return False


# --- building the program ----------------------------------------------------------------------

class _Builder:
    def __init__(self, source: str, mode: str, filename: str):
        self.source = source
        self.mode = mode
        self.filename = filename
        self.uses: list = []
        self.use_ast: list = []
        self.passes: list = []
        self.pass_at: dict = {}
        self.current_block: int | None = None
        self.grad_targets: list = []

    # uses and passes
    def add_use(self, kind: str, target: ast.expr, line: int, write: bool) -> int:
        text = ast.get_source_segment(self.source, target) or ast.unparse(target)
        self.uses.append(EventUse(kind, text, line, write))
        self.use_ast.append(target)
        if kind == "grad":
            self._grad_target(target)
        return len(self.uses) - 1

    def _grad_target(self, target: ast.expr) -> None:
        """Remember `T` of `T.grad` when it can be evaluated when its pass starts, so its hook is in place
        before the gradient arrives, whatever order the statements read it in."""
        pass_index = self.pass_for(target)
        if pass_index is None:
            return
        kind = None
        if isinstance(target, ast.Attribute) and target.attr in MODULE_EVENTS:
            kind, target = target.attr, target.value
        if _is_path(target):
            self.grad_targets.append((pass_index, kind, False, _eval_code(target, self.filename)))
        elif isinstance(target, ast.Subscript) and _is_path(target.value):
            # `outs[i].grad` in a loop: hook every element of `outs` before the pass
            self.grad_targets.append((pass_index, kind, True, _eval_code(target.value, self.filename)))

    def pass_for(self, node: ast.AST):
        """The backward pass a `.grad` belongs to: its block's, else the next one in the text, else the last."""
        if self.current_block is not None:
            return self.current_block
        position = _position(node)
        later = [p for p in self.passes if (p.line, self._pass_col[p.index]) >= position]
        if later:
            return later[0].index
        return self.passes[-1].index if self.passes else None

    def _collect_passes(self, body: list) -> None:
        self._pass_col = {}
        if self.mode == "backward":
            self.passes.append(BackwardPass(0, 0, "LOSS", True))
            self._pass_col[0] = 0
            return
        calls = sorted((n for stmt in body for n in walk_cell_level(stmt) if is_backward_call(n)), key=_position)
        blocks = {id(s.items[0].context_expr) for stmt in body for s in walk_cell_level(stmt)
                  if is_backward_block(s)}
        for call in calls:
            index = len(self.passes)
            text = ast.get_source_segment(self.source, call) or ast.unparse(call)
            self.passes.append(BackwardPass(index, call.lineno, text, id(call) in blocks))
            self.pass_at[_position(call)] = index
            self._pass_col[index] = call.col_offset

    # nodes
    def _flatten(self, body: list) -> list:
        """(statement, block) pairs; a top-level `with L.backward():` becomes its own node plus its body."""
        flat = []
        for stmt in body:
            if self.mode == "trace" and is_backward_block(stmt):
                index = self.pass_at[_position(stmt.items[0].context_expr)]
                flat.append((stmt, None))
                flat.extend((inner, index) for inner, _ in self._flatten(stmt.body))
            else:
                flat.append((stmt, 0 if self.mode == "backward" else None))
        return flat

    def build(self, body: list) -> Program:
        self._collect_passes(body)
        flat = self._flatten(body)
        all_bound = set()
        for stmt, _ in flat:
            names, mutated = bound_names(stmt) if not is_backward_block(stmt) else (set(), set())
            all_bound |= names | mutated
        stored_anywhere = {n.id for stmt, _ in flat for n in ast.walk(stmt)
                           if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        free = frozenset(n for stmt, _ in flat for n in read_names(stmt)) - all_bound - stored_anywhere
        nodes, specs = [], []
        for index, (stmt, block) in enumerate(flat):
            compiled = self._compile_node(index, stmt, block)
            nodes.append(compiled)
            specs.append(compiled.spec)
        _add_dependencies(specs)
        graph = HookGraph(nodes=specs, passes=self.passes)
        static, candidates = self._static_targets(free)
        bound = frozenset(n for n in all_bound if not n.startswith(TEMP_PREFIX))
        return Program(self.source, self.mode, self.filename, graph, nodes, self.uses, static, candidates,
                       bound, self.grad_targets)

    def _compile_node(self, index: int, stmt: ast.stmt, block) -> CompiledNode:
        self.current_block = block
        first_use = len(self.uses)
        line_text = self.source.splitlines()[stmt.lineno - 1].strip()
        if is_backward_block(stmt):
            rewritten = [ast.Expr(value=_Rewriter(self, set())._backward(stmt.items[0].context_expr, block=True))]
            names, mutated, reads, text = set(), set(), read_names(stmt.items[0].context_expr), line_text
            starts = (self.pass_at[_position(stmt.items[0].context_expr)],)
        else:
            names, mutated = bound_names(stmt)
            reads = read_names(stmt)
            text = ast.get_source_segment(self.source, stmt) or line_text
            starts = tuple(self.pass_at[_position(n)] for n in walk_cell_level(stmt) if is_backward_call(n))
            if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                stmt = ast.copy_location(ast.Assign(targets=[stmt.target], value=stmt.value), stmt)
            rewriter = _Rewriter(self, written_events(stmt))
            result = rewriter.visit(stmt)
            rewritten = rewriter.hoisted + (result if isinstance(result, list) else [result])
        code = _function_code(rewritten, sorted(n for n in names if not n.startswith(TEMP_PREFIX)),
                              f"{TEMP_PREFIX}node_{index}", stmt.lineno, self.filename)
        spec = Node(index=index, line=stmt.lineno, end_line=getattr(stmt, "end_lineno", stmt.lineno),
                    source=text, reads=frozenset(reads), binds=frozenset(names | mutated),
                    events=tuple(self.uses[first_use:]), block=block, starts_passes=starts)
        return CompiledNode(spec, code)

    def _static_targets(self, free: frozenset):
        static, candidates, seen = [], [], set()
        for use, target in zip(self.uses, self.use_ast):
            if use.kind == "grad" or (use.kind, use.target) in seen:
                continue
            seen.add((use.kind, use.target))
            if _is_path(target, free):
                static.append((use.kind, use.target, _eval_code(target, self.filename)))
            elif isinstance(target, ast.Subscript) and _is_path(target.value, free):
                container = ast.get_source_segment(self.source, target.value) or ast.unparse(target.value)
                candidates.append((use.kind, container, _eval_code(target.value, self.filename)))
        return static, candidates


def _eval_code(expr: ast.expr, filename: str) -> types.CodeType:
    return compile(ast.fix_missing_locations(ast.Expression(body=expr)), filename, "eval")


def _function_code(body: list, global_names: list, name: str, line: int, filename: str) -> types.CodeType:
    statements = []
    if global_names:
        statements.append(ast.Global(names=global_names))
    statements.extend(body)
    statements.append(ast.If(test=_const(False), body=[ast.Expr(value=ast.Yield(value=None))], orelse=[]))
    args = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[],
                         kwarg=None, defaults=[])
    function = ast.FunctionDef(name=name, args=args, body=statements, decorator_list=[], returns=None,
                               type_params=[])
    for node in ast.walk(function):
        if not hasattr(node, "lineno") or node.lineno is None:
            node.lineno, node.col_offset = line, 0
            node.end_lineno, node.end_col_offset = line, 0
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    module_code = compile(module, filename, "exec")
    code = next(c for c in module_code.co_consts if isinstance(c, types.CodeType) and c.co_name == name)
    return code.replace(co_name="<cell>", co_qualname="<cell>")   # what a traceback shows


def _add_dependencies(specs: list) -> None:
    """Order nodes by their names: a node waits for every earlier node that binds what it reads,
    reads what it binds, or binds what it binds. A backward pass is a side effect: passes keep their
    order, and a later statement that reads no gradient runs after the passes written before it."""
    for later in specs:
        reads_grads = any(event.kind == "grad" for event in later.events)
        deps = []
        for earlier in specs[:later.index]:
            if (earlier.binds & later.reads) or (earlier.reads & later.binds) or (earlier.binds & later.binds):
                deps.append(earlier.index)
            elif earlier.starts_passes and (later.starts_passes or not reads_grads) and later.block is None:
                deps.append(earlier.index)
        later.deps = tuple(deps)
