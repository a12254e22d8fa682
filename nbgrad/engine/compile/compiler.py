"""Compile a cell into a Program: one node per statement, each a generator function, plus the hook
graph they form (see program.py for the requests a node yields).

Every top-level statement is a node; the body of `with LOSS.backward():` is flattened into nodes of
that pass. Names bound by a node are declared `global`, so they land in the cell's namespace.
"""
from __future__ import annotations

import ast
import textwrap
import types
from functools import lru_cache

from .cellast import (MODULE_EVENTS, calls_nothing, can_pause_in, generator_function, invoke_value,
                      is_backward_block, is_backward_call, is_invoke_block, is_path, loop_sources, opens_source, position, walk_cell_level)
from .dataflow import (add_dependencies, augmented_names, bound_names, cache_names, called_names, grad_only_names,
                       helper_names, mark_waits, read_names, stored_names, written_events)
from ...errors import NbgradError, register_cell_source
from .loops import (aliases, element_code, indexed_container, innermost_path, is_module_iterable, loop_filters,
                    loop_variable)
from .graph import BackwardPass, EventUse, HookGraph, Node, in_statement
from .program import RUNTIME_NAME, TEMP_PREFIX, CompiledNode, Invoke, Program, Target, runtime_names
from .containers import argument_names
from .hookloops import hook_loop, on_event, with_use
from .keeping import keeps_only, one_save
from .rewrite import Rewriter
from .methods import cell_methods, instances
from .targets import forward_targets
from .siteaccess import open_sources
from .unroll import LOOP_PREFIX, misplaced_invoke, source_text, unrolled
from .inline import inlined
from .gradname import check_grad_names

_serial = 0


@lru_cache(maxsize=256)
def compile_cell(source: str, mode: str = "trace", helpers: tuple = (), elements: tuple | None = None) -> Program:
    """Compile (cached by text): the same cell run again pays no compile cost. `helpers`: (name, source) of functions
    from earlier cells that it calls and that read events (helpers.py); `elements`: of its loops to unroll (unroll.py)."""
    global _serial
    source = textwrap.dedent(source)
    _serial += 1
    filename = register_cell_source(source, _serial)
    try:
        module = ast.parse(source, filename=filename)
        compile(module, filename, "exec")    # Python's own checks: `return` / `yield` outside a function, ...
    except SyntaxError as error:
        error.filename = filename
        raise
    check_grad_names(module)
    module.body = unrolled(inlined(module.body, helpers), elements)
    return _Builder(source, mode, filename, helpers).build(open_sources(module).body)


def compile_statements(source: str, body: list, mode: str = "trace", helpers: tuple = ()) -> Program:
    """Compile statements a driver built (not cached): `body` is parsed from `source`, which tracebacks
    and the hook graph show (a dataset run repeats a cell once per example, each copy on lines of its own)."""
    global _serial
    _serial += 1
    filename = register_cell_source(source, _serial)
    module = open_sources(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])))
    compile(module, filename, "exec")
    return _Builder(source, mode, filename, helpers).build(module.body)


class _Builder:
    """Walks the cell once: finds its backward passes, compiles each statement, records every event use."""

    def __init__(self, source: str, mode: str, filename: str, helpers: tuple = ()):
        self.source = source
        self.helpers = {name: open_sources(ast.parse(text)).body[0] for name, text in helpers}   # name -> its `def`
        self.mode, self.filename = mode, filename
        self.uses: list = []             # EventUse by use id
        self.use_ast: list = []          # the target expression of each use (its container, for a loop variable)
        self.use_loop: list = []         # (code of its loop's condition, element_code) of a use through a loop variable
        self.passes: list = []           # BackwardPass
        self.pass_at: dict = {}          # position of a backward call -> its pass index
        self.pass_column: dict = {}      # pass index -> column of its backward call
        self.current_block: int | None = None
        self.loop_sources: dict = {}     # loop variable of the statement being compiled -> its container
        self.loop_filters: dict = {}     # loop variable -> code of its loop's condition on one element
        self.free: frozenset = frozenset()
        self.grad_targets: list = []
        self._temps = 0
        self.invokes: list = []          # Invoke blocks, in source order
        self.twins: set = set()          # names of functions the cell defines whose direct calls can pause
        self.twin_defs: set = set()      # ids of their `def` statements
        self.cell_bound: set = set()     # every name the cell binds (a `cache` of its own is not nbgrad's)
        self.function = None             # (name, parameters) of the function whose body is being rewritten
        self.use_function: list = []     # that, for each use (None at the cell's level)
        self.calls: list = []            # targets.Call: the cell's calls of its functions whose reads pause
        self.runtime_names: set = set()  # what the compiled statements ask of the runtime (`__nbgrad__.save`, ...)
        self.containers: dict = {}       # Program.containers
        self.hooked_ahead: set = set()   # ids of the uses a forward target names (compile/targets.py)
        self.globals_only: frozenset = frozenset()   # free names no lambda or function of the cell takes as an argument
        self.caches: frozenset = frozenset()         # names bound to the run's `cache(...)`: `c.inputs` is no event
        self.instances: dict = {}        # name -> class, of the objects the cell makes (methods.py)
        self.assigned: set = set()       # the names the cell binds (not those it only changes in place)

    def build(self, body: list) -> Program:
        plain, keeping, single = calls_nothing(body), keeps_only(body), one_save(body, self.source)    # before rewriting
        self._collect_passes(body)
        flat = self._flatten(body)
        for stmt, _, _ in flat:
            if can_pause_in(stmt):
                self.twins.add(stmt.name)
                self.twin_defs.add(id(stmt))
        all_bound = set()
        for stmt, _, _ in flat:
            if not is_backward_block(stmt):
                names, mutated = bound_names(stmt)
                all_bound |= names | mutated
        self.cell_bound = all_bound
        self.instances, self.helpers = instances(flat_statements := [s for s, _, _ in flat]), \
            self.helpers | cell_methods(flat_statements)      # the methods of the cell's classes that read events
        self.assigned = set().union(*(bound_names(s)[0] for s in flat_statements if not is_backward_block(s)))
        called = called_names(flat_statements, self.assigned)
        stopping = [index for index, (stmt, _, _) in enumerate(flat) if self._calls_stop(stmt)]   # before rewriting
        stored_anywhere = set().union(*(stored_names(stmt) for stmt, _, _ in flat))
        free = frozenset().union(*(read_names(stmt) for stmt, _, _ in flat)) - all_bound - stored_anywhere
        helper_globals = helper_names(self.helpers.values()) - all_bound
        self.free = free = free | helper_globals
        self.globals_only = free - argument_names(stmt for stmt, _, _ in flat)
        caches = self.caches = frozenset() if "cache" in all_bound else cache_names(stmt for stmt, _, _ in flat)
        alias_at = aliases(flat_statements)
        nodes = [self._compile_node(index, *entry) for index, entry in enumerate(flat)]
        specs = [node.spec for node in nodes]
        add_dependencies(specs)
        for index in stopping:     # "stop here": once what the cell asked for above has run
            specs[index].deps = tuple(range(index))
        mark_waits(specs, caches, flat_statements)
        graph = HookGraph(nodes=specs, passes=self.passes, caches=[spec.line for spec in specs if spec.binds & caches])
        bound = frozenset(n for n in all_bound if not n.startswith((TEMP_PREFIX, LOOP_PREFIX)))
        targets = forward_targets(self, free, alias_at)      # before `hooked_ahead` is read
        return Program(self.source, self.mode, self.filename, graph, nodes, self.uses, forward_targets=targets,
                       grad_targets=self.grad_targets, bound_names=bound, invokes=self.invokes, calls_nothing=plain,
                       called_names=called, helper_globals=helper_globals,
                       runtime_names=frozenset(self.runtime_names), containers=self.containers,
                       keeps_only=keeping and len(self.hooked_ahead) == len(self.uses), one_save=single)

    # --- event uses and backward passes ---------------------------------------------------------

    def add_use(self, kind: str, target: ast.expr, line: int, write: bool, row_zero: bool = False) -> int:
        text = self._text(target)
        skip = opens_source(target) and target.func.attr == "skip_of"
        self.uses.append(EventUse(kind, text, line, write, row_zero, skip))
        self.use_function.append(self.function)
        through = loop_variable(target, self.loop_sources)       # `b`, or `b.attn`, in a loop over `b`
        self.use_ast.append(self.loop_sources[through] if through else target)
        self.use_loop.append(through and (self.loop_filters.get(through), element_code(through, target, self.filename)))
        if kind == "grad":
            self.grad_target(target)
        return len(self.uses) - 1

    def grad_target(self, target: ast.expr) -> None:
        """Remember `T` of `T.grad` when it can be evaluated when its pass starts, so its hook is in place
        before the gradient arrives, whatever order the statements read it in."""
        pass_index = self.pass_for(target)
        if pass_index is None:
            return
        kind = None
        if isinstance(target, ast.Attribute) and target.attr in MODULE_EVENTS:
            kind, target = target.attr, target.value
        through = loop_variable(target, self.loop_sources)
        if through is None and is_path(target):
            self.grad_targets.append(Target(kind, self._text(target), self._eval_code(target),
                                            pass_index=pass_index))
            return
        # `[h.grad for h in refs]`, `[b.mlp.output.grad for b in blocks]`: every element of refs (what the expression
        # names in each); `outs[i].grad`, `model.transformer.h[i].mlp.output.grad` in a loop: every element of outs
        if through is not None:
            container, each = self.loop_sources[through], element_code(through, target, self.filename)
        elif (indexed := indexed_container(target, None, self.filename)) is not None:
            container, each = indexed
        else:
            return
        if is_module_iterable(container):
            base = innermost_path(container)
            self.grad_targets.append(Target(kind, self._text(container), self._eval_code(container), every_element=True,
                                            pass_index=pass_index, each=each, base=base and self._eval_code(base)))

    def pass_for(self, node: ast.AST):
        """The backward pass a `.grad` belongs to: its block's, else the next one in the text, else the last."""
        if self.current_block is not None:
            return self.current_block
        later = [p for p in self.passes if (p.line, self.pass_column[p.index]) >= position(node)]
        if later:
            return later[0].index
        return self.passes[-1].index if self.passes else None

    def _collect_passes(self, body: list) -> None:
        if self.mode == "backward":
            self.passes.append(BackwardPass(0, 0, "LOSS", True))
            self.pass_column[0] = 0
            return
        calls = sorted((n for stmt in body for n in walk_cell_level(stmt) if is_backward_call(n)), key=position)
        blocks = {id(s.items[0].context_expr) for stmt in body for s in walk_cell_level(stmt)
                  if is_backward_block(s)}
        for call in calls:
            index = len(self.passes)
            self.passes.append(BackwardPass(index, call.lineno, self._text(call), id(call) in blocks))
            self.pass_at[position(call)] = index
            self.pass_column[index] = call.col_offset

    # --- nodes ----------------------------------------------------------------------------------

    def _flatten(self, body: list, invoke: int | None = None, top: bool = True) -> list:
        """(statement, block, invoke) triples. A top-level `with invoke(INPUT):` contributes its body; a
        `with L.backward():` becomes its own node plus its body."""
        flat = []
        for stmt in body:
            if self.mode == "trace" and is_invoke_block(stmt):
                if not top or invoke is not None:
                    raise misplaced_invoke(stmt.lineno)
                flat.extend(self._flatten(stmt.body, self._add_invoke(stmt), top=False))
            elif self.mode == "trace" and is_backward_block(stmt):
                index = self.pass_at[position(stmt.items[0].context_expr)]
                flat.append((stmt, None, invoke))
                # a `with` block nested in this one keeps its own pass for its body
                flat.extend((inner, index if inner_block is None else inner_block, inner_invoke)
                            for inner, inner_block, inner_invoke in self._flatten(stmt.body, invoke, top=False))
            else:
                flat.append((stmt, 0 if self.mode == "backward" else None, invoke))
        return flat

    def _add_invoke(self, stmt: ast.With) -> int:
        value = invoke_value(stmt.items[0].context_expr, stmt.lineno)     # one INPUT, or keywords as a dict
        index = len(self.invokes)
        self.invokes.append(Invoke(index, stmt.lineno, self._text(value), self._eval_code(value),
                                   name=value.id if isinstance(value, ast.Name) else None))
        return index

    def _compile_node(self, index: int, stmt: ast.stmt, block, invoke) -> CompiledNode:
        self.current_block = block
        self.loop_sources = loop_sources(stmt)
        self.loop_filters = loop_filters(stmt, self.free, walk_cell_level)
        first_use = len(self.uses)
        line_text, loop = self.source.splitlines()[stmt.lineno - 1].strip(), None
        if is_backward_block(stmt):
            call = stmt.items[0].context_expr
            rewritten = [ast.Expr(value=Rewriter(self, set()).backward(call, block=True))]
            names, mutated, reads, text = set(), set(), read_names(call), line_text
            grad_reads, augmented = grad_only_names(call), set()
            starts = (self.pass_at[position(call)],)
        else:
            names, mutated = bound_names(stmt)
            # before the rewriter edits stmt
            reads, grad_reads, augmented = read_names(stmt), grad_only_names(stmt), augmented_names(stmt)
            text = ast.get_source_segment(self.source, stmt) or line_text
            starts = tuple(self.pass_at[position(n)] for n in walk_cell_level(stmt) if is_backward_call(n))
            if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                stmt = ast.copy_location(ast.Assign(targets=[stmt.target], value=stmt.value), stmt)
            loop = hook_loop(stmt, self) if block is None and invoke is None else None
            rewriter = Rewriter(self, written_events(stmt))
            result = rewriter.visit(stmt)
            rewritten = rewriter.hoisted + (result if isinstance(result, list) else [result])
        global_names = sorted(n for n in names if not n.startswith(TEMP_PREFIX))
        self.runtime_names |= runtime_names(rewritten)
        code = _function_code(rewritten, global_names, f"{TEMP_PREFIX}node_{index}", stmt.lineno, self.filename)
        self.uses[first_use:] = in_statement(self.uses[first_use:], index, frozenset(reads), frozenset(names | mutated))
        spec = Node(index=index, line=stmt.lineno, end_line=getattr(stmt, "end_lineno", stmt.lineno),
                    source=text, reads=frozenset(reads), binds=frozenset(names | mutated),
                    mutated=frozenset((mutated - names) | augmented), grad_reads=frozenset(grad_reads),
                    events=tuple(self.uses[first_use:]), block=block, starts_passes=starts, invoke=invoke)
        one = on_event(rewritten, global_names, stmt.lineno, self.filename) if block is None and not loop else None
        one = one if one is not None and self.uses[one.use].kind == "output" else None
        return CompiledNode(spec, code, loop and with_use(loop, spec.events, first_use), one)

    def _calls_stop(self, stmt: ast.stmt) -> bool:
        """Whether a statement calls `stop()` (nbgrad's: the cell binds no `stop` of its own)."""
        return "stop" not in self.cell_bound and any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "stop"
            for n in walk_cell_level(stmt))

    def temp_name(self, what: str) -> str:
        """A name no other generated name in the cell has."""
        self._temps += 1
        return f"{TEMP_PREFIX}{what}_{self._temps}"

    def _text(self, node: ast.AST) -> str:
        return source_text(self.source, node)

    def _eval_code(self, expr: ast.expr) -> types.CodeType:
        return compile(ast.fix_missing_locations(ast.Expression(body=expr)), self.filename, "eval")


def _function_code(body: list, global_names: list, name: str, line: int, filename: str) -> types.CodeType:
    """The code of `def name(): global ...; <body>` as a generator, with every line in the cell's file."""
    statements = ([ast.Global(names=global_names)] if global_names else []) + body
    function = generator_function(name, statements)
    for node in ast.walk(function):
        if getattr(node, "lineno", None) is None:
            node.lineno, node.col_offset = line, 0
            node.end_lineno, node.end_col_offset = line, 0
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    module_code = compile(module, filename, "exec")
    code = next(c for c in module_code.co_consts if isinstance(c, types.CodeType) and c.co_name == name)
    return code.replace(co_name="<cell>", co_qualname="<cell>")   # what a traceback shows
