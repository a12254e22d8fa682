"""The rewrite of one statement: event accesses become requests the runtime answers (see program.py)."""
from __future__ import annotations

import ast

from .astcopy import copied
from .cellast import (MODULE_EVENTS, const, generator_function, is_backward_block, is_backward_call, is_event_attr,
                      is_invoke_block, is_save_call, loop_sources, makes_invokes, name, never_runs_yield, position,
                      thunk, touches_events, walk_cell_level)
from ...errors import NbgradError
from .containers import element_index
from .partgrad import grad_of_part, part_edit, part_of_event
from .unroll import misplaced_invoke
from .program import RUNTIME_NAME, TEMP_PREFIX
from .dataflow import written_events
from .methods import method_key
from .targets import Call, parameters


TWIN_ATTR = "__nbgrad_twin__"
RUNTIME_CALLS = ("cache", "stop")   # names every body has, answered by the running Runtime


def request(kind: str, *parts: ast.expr) -> ast.Yield:
    """`(yield __nbgrad__.new(__nbgrad__.Kind, (*parts,)))`: `Kind(*parts)` made by tuple's own constructor,
    not the named tuple's `__new__`, which is Python code: one call less at every request."""
    request_type = ast.Attribute(value=name(RUNTIME_NAME), attr=kind, ctx=ast.Load())
    maker = ast.Attribute(value=name(RUNTIME_NAME), attr="new", ctx=ast.Load())
    return ast.Yield(value=ast.Call(func=maker, args=[request_type, ast.Tuple(elts=list(parts), ctx=ast.Load())],
                                    keywords=[]))


class Rewriter(ast.NodeTransformer):
    """Rewrites one statement. `builder` records each event use and knows the backward passes."""

    def __init__(self, builder, written: set):
        self.builder = builder
        self.written = written           # ids of event attributes the statement edits in place
        self.hoisted: list = []          # nested generator functions that replace comprehensions
        self.row_zero: set = set()       # ids of event attributes written `M.output[0]`
        self.in_helper = False           # rewriting the body of a helper from an earlier cell

    # --- reads ----------------------------------------------------------------------------------

    def visit_Attribute(self, node):
        if (not isinstance(node.ctx, ast.Load) or not is_event_attr(node)
                or isinstance(node.value, ast.Name) and node.value.id in self.builder.caches):   # a Cache's `.inputs`
            return self.generic_visit(node)
        if node.attr == "grad" and part_of_event(node.value):
            return grad_of_part(self, node, request)
        use = self.builder.add_use(node.attr, node.value, node.lineno, id(node) in self.written,
                                   id(node) in self.row_zero)
        at = element_index(self.builder, use, node.value) if node.attr != "grad" else None
        base = self.visit(node.value)
        if node.attr == "grad":
            return request("GradRead", base, const(use), const(self.builder.pass_for(node)))
        return request("Read", thunk(base), const(use), at)

    def visit_Subscript(self, node):
        if (isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Attribute) and node.value.attr in MODULE_EVENTS
                and isinstance(node.slice, ast.Constant) and node.slice.value == 0):
            self.row_zero.add(id(node.value))
        return self.generic_visit(node)

    def visit_Call(self, node):
        if (isinstance(node.func, ast.Name) and node.func.id in RUNTIME_CALLS
                and node.func.id not in self.builder.cell_bound):
            method = ast.Attribute(value=name(RUNTIME_NAME), attr=node.func.id, ctx=ast.Load())
            return ast.Call(func=method, args=[const(node.lineno)] + [self.visit(a) for a in node.args],
                            keywords=[self.visit(k) for k in node.keywords])
        called = node.func.id if isinstance(node.func, ast.Name) else None
        helper, receiver = self._helper_of(node)
        if called in self.builder.twins or helper is not None:
            self._remember_call(node, helper or called, receiver)
        if helper is not None and not self.in_helper:      # a helper from an earlier cell, an object's method
            passed = [copied(receiver)] if receiver is not None else []     # for `self`
            call = ast.Call(func=name(self._helper_twin(helper, node.lineno)),
                            args=passed + [self.visit(a) for a in node.args],
                            keywords=[self.visit(k) for k in node.keywords])
            return ast.YieldFrom(value=call)     # pauses like the cell's own statements
        if isinstance(node.func, ast.Name) and node.func.id in self.builder.twins:
            twin = ast.Attribute(value=name(node.func.id), attr=TWIN_ATTR, ctx=ast.Load())
            call = ast.Call(func=twin, args=[self.visit(a) for a in node.args],
                            keywords=[self.visit(k) for k in node.keywords])
            return ast.YieldFrom(value=call)     # `resid(3)`: runs as part of the statement, pausing at events
        if is_save_call(node):
            saver = ast.Attribute(value=name(RUNTIME_NAME), attr="save", ctx=ast.Load())
            label = ast.get_source_segment(self.builder.source, node.func.value) or ast.unparse(node.func.value)
            return ast.Call(func=saver, args=[self.visit(node.func.value), const(node.lineno), const(label)],
                            keywords=[])
        if is_backward_call(node):
            return self.backward(node, block=False)
        return self.generic_visit(node)

    def backward(self, call: ast.Call, block: bool) -> ast.Yield:
        if position(call) not in self.builder.pass_at:
            raise NbgradError("a %%backward body cannot start another backward pass; "
                              "use a %%trace cell for several passes", call.lineno)
        pass_index = self.builder.pass_at[position(call)]
        args = ast.List(elts=[self.visit(a) for a in call.args], ctx=ast.Load())
        kwargs = ast.Dict(keys=[const(k.arg) if k.arg else None for k in call.keywords],
                          values=[self.visit(k.value) for k in call.keywords])
        return request("Backward", self.visit(call.func.value), const(pass_index), args, kwargs, const(block))

    # --- writes ---------------------------------------------------------------------------------

    def _event_store(self, target: ast.Attribute, value: ast.expr, line: int) -> ast.stmt:
        use = self.builder.add_use(target.attr, target.value, line, True)
        base = self.visit(target.value)
        if target.attr == "grad":
            made = request("GradWrite", base, const(use), const(self.builder.pass_for(target)), value)
        else:
            made = request("Write", thunk(base), const(use), value)
        return ast.Expr(value=made)

    def visit_Assign(self, node):
        node.targets = [part_edit(self, target) for target in node.targets]      # `M.output[i].grad = g`
        if not any(is_event_attr(t) for t in node.targets):
            return self.generic_visit(node)
        temp = f"{TEMP_PREFIX}value"
        statements = [ast.Assign(targets=[name(temp, store=True)], value=self.visit(node.value))]
        for target in node.targets:
            if is_event_attr(target):
                statements.append(self._event_store(target, name(temp), node.lineno))
            else:
                statements.append(ast.Assign(targets=[self.visit(target)], value=name(temp)))
        return [ast.copy_location(s, node) for s in statements]

    def visit_AugAssign(self, node):
        if not is_event_attr(node.target):
            return self.generic_visit(node)
        temp = f"{TEMP_PREFIX}value"
        read = ast.copy_location(ast.Attribute(value=node.target.value, attr=node.target.attr, ctx=ast.Load()),
                                 node.target)
        self.written.add(id(read))
        statements = [
            ast.Assign(targets=[name(temp, store=True)], value=self.visit(read)),
            ast.AugAssign(target=name(temp, store=True), op=node.op, value=self.visit(node.value)),
            self._event_store(node.target, name(temp), node.lineno),
        ]
        return [ast.copy_location(s, node) for s in statements]

    # --- statements that hold other statements --------------------------------------------------

    def visit_With(self, node):
        if is_invoke_block(node):
            raise misplaced_invoke(node.lineno)
        if is_backward_block(node):
            raise NbgradError("`with ....backward():` must stand at the top level of the cell, "
                              "not inside another statement", node.lineno)
        return self.generic_visit(node)

    def _comprehension(self, node):
        """`[f(h.output) for h in hs]` -> `(yield from __nbgrad_comp_K())`, a generator that builds the
        result: `yield` cannot stand inside a comprehension. One that touches no event stays one, its `.save()`
        calls and `cache(...)` rewritten (`[x.mean(-1).save() for x in outs]`)."""
        if not (touches_events(node) or self._calls_twin(node)):
            return self.generic_visit(node)
        result = f"{TEMP_PREFIX}result"
        initial, innermost = _accumulate(node, result)
        body = innermost
        for generator in reversed(node.generators):
            for condition in reversed(generator.ifs):
                body = ast.If(test=condition, body=[body], orelse=[])
            body = ast.For(target=generator.target, iter=generator.iter, body=[body], orelse=[])
        function_name = self.builder.temp_name("comp")
        statements = [ast.Assign(targets=[name(result, store=True)], value=initial), body,
                      ast.Return(value=name(result))]
        function = ast.copy_location(generator_function(function_name, statements), node)
        for child in ast.walk(function):
            if getattr(child, "lineno", None) is None and "lineno" in child._attributes:
                ast.copy_location(child, node)
        outer, self.hoisted = self.hoisted, []
        function = self.visit(function)
        function.body[0:0] = self.hoisted     # nested comprehensions: defined where their variables live
        self.hoisted = outer
        self.hoisted.append(function)
        built = ast.YieldFrom(value=ast.Call(func=name(function_name), args=[], keywords=[]))
        if isinstance(node, ast.GeneratorExp):    # built eagerly (a statement cannot pause lazily), still an iterator
            return ast.Call(func=name("iter"), args=[built], keywords=[])
        return built

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def _function(self, node):
        """Functions the cell defines run as plain Python when called. One defined at the cell's level and
        called directly by its statements gets a generator twin that can pause at events (see
        `_with_twin`); anywhere else nbgrad cannot pause inside a call, so a module event is an error."""
        if getattr(node, "name", "").startswith(TEMP_PREFIX):
            return self.generic_visit(node)          # a comprehension nbgrad turned into a generator
        if id(node) in self.builder.twin_defs:
            return self._with_twin(node)
        if makes_invokes(node):
            return node          # its calls are inlined (inline.py): any other caller runs it as plain Python
        for inner in ast.walk(node):
            if isinstance(inner, ast.Attribute) and inner.attr in MODULE_EVENTS:
                raise NbgradError(f"`.{inner.attr}` inside a function that nbgrad cannot pause in (a lambda, "
                                  f"a decorated or nested function, a generator, or one defined inside another "
                                  f"statement). "
                                  f"Define it with `def` at the top level of the cell and call it there, or "
                                  f"read the value in the cell and pass it to the function", inner.lineno)
        return node

    def _remember_call(self, node: ast.Call, function: str, receiver) -> None:
        """A call, at the cell's level, of a function whose reads can pause: what its reads name for what the call
        passes may be hooked before the run (targets.py). A method's receiver is what it gets for `self`."""
        if self.builder.function is None and not self.in_helper:
            passed = [receiver] if receiver is not None else []
            self.builder.calls.append(Call(function, copied(passed + node.args),
                                           {k.arg: copied(k.value) for k in node.keywords if k.arg},
                                           dict(self.builder.loop_sources)))

    def _helper_of(self, node: ast.Call) -> tuple:
        """(key, receiver) of a call of a helper (receiver None) or of a notebook object's method (methods.py)."""
        if isinstance(node.func, ast.Name) and node.func.id in self.builder.helpers:
            return node.func.id, None
        key, receiver = method_key(node, self.builder.instances, self.builder.assigned)
        return (key, receiver) if key in self.builder.helpers else (None, None)

    def _calls_twin(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and (isinstance(n.func, ast.Name) and n.func.id in self.builder.twins
                                                or self._helper_of(n)[0] is not None) for n in ast.walk(node))

    def _with_twin(self, node: ast.FunctionDef) -> list:
        """`def resid(i): ...` stays as written (a plain function for every other caller) and gets
        `resid.__nbgrad_twin__`, the same body rewritten as a generator for the cell's own calls."""
        twin = ast.FunctionDef(name=self.builder.temp_name("twin"), args=copied(node.args),
                               body=copied(node.body) + [never_runs_yield()], decorator_list=[],
                               returns=None, type_params=[])
        ast.copy_location(twin, node)
        outer, self.hoisted = self.hoisted, []
        self.written |= written_events(twin)         # the copy's own nodes: its edits are edits, not reads
        self.builder.function = (node.name, parameters(node))
        try:
            twin = self.generic_visit(twin)
        finally:
            self.builder.function = None
        twin.body[0:0] = self.hoisted                # its comprehensions see its arguments
        self.hoisted = outer
        attach = ast.Assign(targets=[ast.Attribute(value=name(node.name), attr=TWIN_ATTR, ctx=ast.Store())],
                            value=name(twin.name))
        return [node, twin, ast.copy_location(attach, node)]

    def _helper_twin(self, helper: str, line: int) -> str:
        """A generator twin of a function defined in an earlier cell, defined where the statement runs; its
        events are placed on the line of the call (the helper's own lines are in another cell)."""
        twin = copied(self.builder.helpers[helper])
        twin.name, twin.decorator_list = self.builder.temp_name("helper"), []
        twin.body.append(never_runs_yield())
        for child in ast.walk(twin):
            if "lineno" in child._attributes:       # an empty column span: its text is unparsed, not cut from the cell
                child.lineno, child.end_lineno, child.col_offset, child.end_col_offset = line, line, 0, 0
        outer, self.hoisted, self.in_helper = self.hoisted, [], True
        self.written |= written_events(twin)
        outer_loops = self.builder.loop_sources
        self.builder.loop_sources = {**outer_loops, **loop_sources(twin)}     # the helper's own loops
        self.builder.function = (helper, parameters(twin))
        try:
            twin = self.generic_visit(twin)
        finally:
            self.in_helper, self.builder.loop_sources, self.builder.function = False, outer_loops, None
        twin.body[0:0] = self.hoisted
        self.hoisted = outer
        self.hoisted.append(twin)
        return twin.name

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Delete(self, node):
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr in MODULE_EVENTS:
                text = ast.unparse(target)
                raise NbgradError(f"`del {text}`: a module's `.{target.attr}` is an event of the run, not an "
                                  f"attribute, so it cannot be deleted. To change what later modules get, assign "
                                  f"a new value (`{text} = ...`)", node.lineno)
        return self.generic_visit(node)

    def visit_ClassDef(self, node):
        """A class body runs once, as the statement runs, but in a scope of its own that cannot pause. (Its
        methods run when called: the cell's direct calls of one on an object it makes pause, methods.py.)"""
        for inner in walk_cell_level(node):
            if isinstance(inner, ast.Attribute) and inner.attr in MODULE_EVENTS:
                raise NbgradError(f"`.{inner.attr}` inside a class body: nbgrad cannot pause there. Read the "
                                  f"value in the cell and use it in the class", inner.lineno)
        return node


def _accumulate(node: ast.AST, result: str) -> tuple:
    """(the empty container, the statement that adds one element) for a comprehension."""
    if isinstance(node, ast.DictComp):
        store = ast.Subscript(value=name(result), slice=node.key, ctx=ast.Store())
        return ast.Dict(keys=[], values=[]), ast.Assign(targets=[store], value=node.value)
    if isinstance(node, ast.SetComp):
        initial, method = ast.Call(func=name("set"), args=[], keywords=[]), "add"
    else:
        initial, method = ast.List(elts=[], ctx=ast.Load()), "append"
    add = ast.Call(func=ast.Attribute(value=name(result), attr=method, ctx=ast.Load()), args=[node.elt],
                   keywords=[])
    return initial, ast.Expr(value=add)
