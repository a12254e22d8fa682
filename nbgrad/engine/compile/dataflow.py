"""Data flow between a cell's statements: the names each binds and reads, the events it edits in
place, and the order that follows from them."""
from __future__ import annotations

import ast
import builtins

from .cellast import event_root, is_backward_block, is_event_attr, root_name, walk_cell_level
from .methods import called_methods


class _BoundNames(ast.NodeVisitor):
    """Names a statement binds at its own level (not inside functions, classes, comprehensions), and
    names whose value it changes in place (`outs.append(x)`, `d[k] = v`)."""

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
        # `outs.append(x)` and `d[k].append(x)` change `outs` and `d`: order them like a binding. A method
        # reached through attributes (`model.transformer.h[0].requires_grad_(False)`) changes a part of an
        # object, not the name: ordering every later statement that reads `model` after it would make a
        # read of an earlier layer come too late.
        call = node.value
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and event_root(call.func.value) is None and not _through_attributes(call.func.value)):
            root = root_name(call.func.value)
            if root is not None:
                self.mutated.add(root.id)
        self.generic_visit(node)

    def _store_target(self, target):
        if event_root(target) is not None or is_event_attr(target):
            return          # an edit of an event value, not of the name it hangs from
        root = root_name(target)
        if root is not target and root is not None:
            self.mutated.add(root.id)

    def visit_Assign(self, node):
        for target in node.targets:
            self._store_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._store_target(node.target)
        self.generic_visit(node)


def _through_attributes(expr: ast.AST) -> bool:
    while isinstance(expr, ast.Subscript):
        expr = expr.value
    return isinstance(expr, ast.Attribute)


def bound_names(stmt: ast.stmt) -> tuple:
    """(names the statement binds, names whose value it changes in place)."""
    finder = _BoundNames()
    finder.visit(stmt)
    return finder.names, finder.mutated


def read_names(stmt: ast.AST) -> set:
    """Names the statement reads from the cell's scope: a comprehension's own variables are its own scope (a
    later `for b in ...` rebinding the `b` of `[... for b in h]` does not touch what the comprehension read)."""
    finder = _FreeReads()
    finder.visit(stmt)
    return finder.names


class _FreeReads(ast.NodeVisitor):
    def __init__(self):
        self.names: set = set()
        self.local: list = []            # the variables of each comprehension we are inside

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and not any(node.id in scope for scope in self.local):
            self.names.add(node.id)

    def _comprehension(self, node):
        generators = node.generators
        self.visit(generators[0].iter)          # evaluated in the enclosing scope
        scope = set()
        self.local.append(scope)
        for k, generator in enumerate(generators):
            if k:
                self.visit(generator.iter)
            scope |= {n.id for n in ast.walk(generator.target) if isinstance(n, ast.Name)}
            for condition in generator.ifs:
                self.visit(condition)
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                self.visit(getattr(node, part))
        self.local.pop()

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def augmented_names(stmt: ast.AST) -> set:
    """Names a statement updates with `h += v`, `h *= v`: in place where h is a tensor."""
    return {n.target.id for n in ast.walk(stmt) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}


def grad_only_names(stmt: ast.AST) -> set:
    """Names the statement reads only as `name.grad`: it needs their gradient, not their value."""
    as_grad, other = set(), set()
    grad_roots = {id(n.value) for n in ast.walk(stmt) if isinstance(n, ast.Attribute) and n.attr == "grad"}
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            (as_grad if id(node) in grad_roots else other).add(node.id)
    return (as_grad - other) & read_names(stmt)       # not a comprehension's own variable


def stored_names(stmt: ast.AST) -> set:
    """Every name stored anywhere inside, comprehension variables and function arguments' uses included."""
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def _edited_place(node: ast.AST) -> list:
    """The expressions a node edits in place: subscript stores, augmented stores, `x.op_()` calls."""
    if isinstance(node, ast.Assign):
        return [t for t in node.targets if isinstance(t, ast.Subscript)]
    if isinstance(node, ast.AugAssign):
        return [node.target]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr.endswith("_") and not node.func.attr.startswith("_")
            and node.func.attr != "requires_grad_"):
        return [node.func.value]
    return []


def written_events(stmt: ast.stmt) -> set:
    """ids of event attributes that a statement edits in place (subscript stores, `x_()` calls)."""
    written = set()
    for node in ast.walk(stmt):
        for target in _edited_place(node):
            root = event_root(target)        # `M.output[:, 0] = v`, `M.output.mul_(2)`, `T.grad.zero_()`
            if root is not None:
                written.add(id(root))
    return written


def add_dependencies(specs: list) -> None:
    """Order nodes by their names: a node waits for every earlier node that binds what it reads,
    reads what it binds, or binds what it binds. A backward pass is a side effect: passes keep their
    order, and a later statement that reads no gradient runs after the passes written before it.

    One exception: a node that reads `h` only as `h.grad` does not hold back a later in-place edit of
    `h` (`h[:, 1] = 0`, `h.mul_(2)`, `h *= 2`: h has a gradient, so it is a tensor): the edit belongs
    to the forward pass, the read waits for a backward pass, and both name the same tensor whenever
    they run. Ordering them would run the edit after the backward."""
    for later in specs:
        reads_grads = any(event.kind == "grad" for event in later.events)
        deps = []
        for earlier in specs[:later.index]:
            read_before = (earlier.reads - earlier.grad_reads) & later.binds or \
                earlier.grad_reads & (later.binds - later.mutated)
            if (earlier.binds & later.reads) or read_before or (earlier.binds & later.binds):
                deps.append(earlier.index)
            elif earlier.starts_passes and (later.starts_passes or not reads_grads) and later.block is None:
                deps.append(earlier.index)
        later.deps = tuple(deps)


def cache_names(statements) -> frozenset:
    """Names bound to a `cache(...)` of the run (`c = cache(...)`), among the cell's statements."""
    return frozenset(stmt.targets[0].id for stmt in statements
                     if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                     and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Call)
                     and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "cache")


def mark_waits(specs: list, cache_names: frozenset, statements: list) -> None:
    """A cache fills as the model runs (and its gradients as the backward pass does), so a statement that reads
    one and waits for no event of its own would see it empty. It starts once the cache is whole instead: after
    the forward pass, or, inside `with LOSS.backward():`, after that pass. A statement with events of its own
    runs when they come, and sees what the run has cached by then. A statement that holds a `with` block is
    marked too: it may pause inside a context (the scheduler keeps the context's mode from the model)."""
    for spec, stmt in zip(specs, statements):
        if spec.reads & cache_names and not spec.events:
            spec.after = "forward" if spec.block is None else "pass"
        spec.in_with = (spec.events != () and not is_backward_block(stmt)
                        and any(isinstance(node, ast.With) for node in ast.walk(stmt)))


def helper_names(definitions) -> frozenset:
    """Names the helpers from earlier cells (their `def`s) read from the namespace: not their arguments or locals."""
    found = set()
    for definition in definitions:
        local = {a.arg for a in ast.walk(definition.args) if isinstance(a, ast.arg)}
        for stmt in definition.body:
            local |= bound_names(stmt)[0] | stored_names(stmt)
        found |= read_names(definition) - local
    return frozenset(found)


def called_names(statements: list, bound: set | None = None) -> frozenset:
    """Names the statements call (`f(...)`) that they do not bind (`bound`: what the cell binds, when known), less
    builtins and the names every body has, and the keys of the notebook objects' methods they may call (methods.py):
    where a helper from an earlier cell may be."""
    if bound is None:
        bound = set().union(*(bound_names(stmt)[0] for stmt in statements))
    called = {n.func.id for stmt in statements for n in walk_cell_level(stmt)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    called = called - bound - set(dir(builtins)) - {"invoke", "cache", "stop"}
    return frozenset(called | called_methods(statements, bound))
