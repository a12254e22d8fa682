"""What the compiler hands the runtime: a Program, and the requests its compiled statements yield.

A compiled statement is a generator. Where the cell touches an event it yields one request and the
runtime answers it (with the value read, or None) when the event exists:

    M.output            -> (yield __nbgrad__.Read(lambda: M, use, None))
    PATH[i].output      -> (yield __nbgrad__.Read(lambda: PATH[i], use, i))     (see Read.at; also PATH[-1])
    M.output = v        -> (yield __nbgrad__.Write(lambda: M, use, v))
    T.grad              -> (yield __nbgrad__.GradRead(T, use, pass_index))
    T.grad = g          -> (yield __nbgrad__.GradWrite(T, use, pass_index, g))
    L.backward(...)     -> (yield __nbgrad__.Backward(L, pass_index, [args], {kwargs}, block))
    x.save()            -> __nbgrad__.save(x, line, label)

`use` is an index into `Program.uses` (the EventUse: kind, target text, cell line, write or read).
Each request is written here as `Kind(...)`; the code makes it as `__nbgrad__.new(__nbgrad__.Kind, (...))`.
"""
from __future__ import annotations

import ast
import types
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from .unroll import LOOP_PREFIX
from .graph import HookGraph, Node

RUNTIME_NAME = "__nbgrad__"       # the name under which compiled code finds the running Runtime
TEMP_PREFIX = "__nbgrad_"         # names the compiler invents; never left in the namespace


def runtime_names(statements: list) -> set:
    """The attributes of the runtime that compiled statements use (`new`, `Read`, `save`, `cache`, ...)."""
    return {node.attr for stmt in statements for node in ast.walk(stmt) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == RUNTIME_NAME}


class Read(NamedTuple):
    module: Callable              # thunk: evaluated when the request is handled
    use: int
    # `i` of `PATH[i].output` or `PATH[-1].output` at the cell's level, PATH a module path (Program.containers), else
    # None: a run finds the module in the model's `_modules` without evaluating the thunk, which is Python
    # code of torch's (two `__getattr__` and `ModuleList.__getitem__`) run cold, at every event of a loop
    at: Any = None


class Write(NamedTuple):
    module: Callable
    use: int
    value: Any


class GradRead(NamedTuple):
    tensor: Any
    use: int
    pass_index: int | None


class GradWrite(NamedTuple):
    tensor: Any
    use: int
    pass_index: int | None
    value: Any


class Backward(NamedTuple):
    target: Any                   # the loss, or torch.autograd for torch.autograd.backward(...)
    pass_index: int
    args: list
    kwargs: dict
    block: bool                   # written as `with LOSS.backward():`


REQUEST_TYPES = (Read, Write, GradRead, GradWrite, Backward)
DIRECT_KINDS = frozenset({"output", "grad"})     # the events of a cell that may take the fast kinds
# What such a cell asks of its run: module outputs, gradients and backward passes, and saves
DIRECT_RUNTIME_NAMES = frozenset({"new", "Read", "Write", "save", "GradRead", "GradWrite", "Backward"})


@dataclass(eq=False)       # one of a run's `unstarted` is removed from it by identity, not by comparing fields
class CompiledNode:
    spec: Node
    code: types.CodeType          # a generator function's code; globals are the cell's namespace
    # A loop whose body only edits each block's output (compile/hookloops.py): a run with the fast kinds may call the body from
    # each block's event instead of resuming the statement there
    loop: Any = None
    one: Any = None               # a statement of one event, a static path's output (compile/hookloops.py, OnEvent)


@dataclass(frozen=True)
class Target:
    """An expression the runtime may evaluate before the statement runs, to hook its event early."""
    kind: str | None              # output | input | inputs (or None: the tensor itself, for .grad)
    text: str
    code: types.CodeType
    every_element: bool = False   # hook every element of the container the expression names
    pass_index: int | None = None  # for gradient targets: the backward pass they belong to
    uses: frozenset = frozenset()  # the event uses it stands for (a module target that is a plain path)
    keep: types.CodeType | None = None   # a loop's condition on one element: hook only the elements it keeps
    each: types.CodeType | None = None   # `lambda b: b.attn`: what a loop's expression names for one element
    # Indices of the statements that bind the names the expression reads (compile/loops.py, aliases): it is
    # evaluated only once they have run, else the namespace may hold a value from before the cell
    needs: frozenset = frozenset()
    # The path a loop's iterable is made from (loops.innermost_path): never iterated when it is an iterator
    base: types.CodeType | None = None
    every_call: bool = False      # `code` names M of `M.calls[k]` with k a loop's: every call of M (run/calls.py)


@dataclass(frozen=True)
class Invoke:
    """A top-level `with invoke(INPUT):` block: its statements address the rows of INPUT in the batch."""
    index: int
    line: int
    text: str                     # the INPUT expression as written
    code: types.CodeType          # evaluated in the namespace before the run
    label: str = ""               # what its errors call it, when not `invoke(TEXT)` (a dataset's "the example")
    name: str | None = None       # INPUT, when it is a plain name: read from the namespace where it is bound there

    def named(self) -> str:
        return self.label or f"invoke({self.text})"


@dataclass
class Program:
    source: str
    mode: str                     # "trace" or "backward"
    filename: str
    graph: HookGraph
    nodes: list                   # CompiledNode, in source order
    uses: list                    # EventUse by use id
    forward_targets: list = field(default_factory=list)   # Target: module events to hook before the run
    grad_targets: list = field(default_factory=list)      # Target: tensors to hook when their pass starts
    bound_names: frozenset = field(default_factory=frozenset)
    invokes: list = field(default_factory=list)           # Invoke, in source order
    calls_nothing: bool = False   # the cell cannot change requires_grad flags (cellast.calls_nothing)
    called_names: frozenset = field(default_factory=frozenset)   # names the cell calls but does not bind
    helper_globals: frozenset = field(default_factory=frozenset)  # names its helpers from earlier cells read
    runtime_names: frozenset = field(default_factory=frozenset)   # what its statements ask of `__nbgrad__`
    # use id -> (root name, attribute names, whether `i` is a name) of PATH in `PATH[i].output`, a chain of attributes
    # of a name the cell never binds (Read.at): where a run may find `PATH[i]` by `i` alone (run/elements.py)
    containers: dict = field(default_factory=dict)
    # The cell only binds and saves what it reads, whole (keeping.keeps_only), and every module it reads is named
    # by a target that the run hooks before the model starts
    keeps_only: bool = False
    # (name, root, steps, label, line) of each statement of a cell of `NAME = PATH.output.save()` statements alone, use
    # i read by statement i (keeping.one_save), a quiet one: a fast run answers it from hooks, no statement run
    # (run/onesave.py)
    one_save: tuple | None = None
    # The uses of all forward targets when each is a plain path, else None: once statements wait on all of
    # them, their modules are hooked and hooking the targets has nothing left to do (the one-read cell)
    plain_target_uses: frozenset | None = field(init=False, default=None)
    # The cell reads or writes a `.grad` or starts a backward pass: its runs need gradient events
    has_gradients: bool = field(init=False, default=False)
    # Forward targets that wait for statements of the cell (Target.needs): hooked again once statements start
    late_targets: list = field(init=False, default_factory=list)
    # The common cell, which may take the fast statement kinds (runner="fast", runtime.py): statements that only read and replace module
    # outputs and their gradients, start backward passes and save, with no invoke, input event, cache, stop, site or
    # skip, and no `with` block around a read (whose context the general scheduler keeps to the statement)
    direct: bool = field(init=False, default=False)
    one_events: bool = field(init=False, default=False)   # the same, invokes allowed: for on-event statements alone
    row_zero: bool = field(init=False, default=False)     # a use is written `M.output[0]` (a hint to check)
    # A direct cell that only reads, binds and saves, every read hooked ahead: nothing it does can change the forward
    # or depend on when it runs, so a run may log the events and run the statements on the log after the model has
    # run (run/forward.py's log and replay), as they would have run inside the hooks
    quiet: bool = field(init=False, default=False)
    # Each iteration's own bindings in a loop unrolled before compiling (unroll.py): never left in the namespace
    loop_names: frozenset = field(init=False, default=frozenset())

    def __post_init__(self):
        self.loop_names = frozenset(name for node in self.graph.nodes for name in node.binds
                                    if name.startswith(LOOP_PREFIX))
        self.late_targets = [target for target in self.forward_targets if target.needs]
        self.has_gradients = bool(self.graph.passes) or any(use.kind == "grad" for use in self.uses)
        self.row_zero = any(use.row_zero for use in self.uses)
        self.one_events = (self.mode == "trace" and self.runtime_names <= DIRECT_RUNTIME_NAMES
                           and all(use.kind in DIRECT_KINDS for use in self.uses)
                           and not any(node.spec.in_with or node.spec.after for node in self.nodes))
        self.direct = self.one_events and not self.invokes
        self.quiet = (self.direct and self.keeps_only and not self.has_gradients
                      and not any(use.write for use in self.uses))
        if not (self.quiet and self.one_save and len(self.nodes) == len(self.uses) == len(self.one_save)
                and all(node.loop is None and not node.spec.deps for node in self.nodes)
                and all(use.kind == "output" and use.node == index for index, use in enumerate(self.uses))):
            self.one_save = None
        if all(target.uses for target in self.forward_targets):
            self.plain_target_uses = frozenset().union(*(target.uses for target in self.forward_targets))

