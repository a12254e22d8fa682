"""The hook graph of a cell: statements as nodes, the events and names they need as edges."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from ...errors.naming import LOOP_PREFIX, as_written


@dataclass(frozen=True)
class EventUse:
    """One place in the cell that reads or writes an event."""
    kind: str            # output | input | inputs | grad
    target: str          # source text of the module (or tensor, for grad) expression
    line: int
    write: bool = False
    row_zero: bool = False   # written `M.output[0]`: a hint when the output is a tensor (batch row 0)
    skip: bool = False       # written `X.skip(v)`: the output of X's skip gate (target is `X.skip`)
    # The statement it sits in (its Node's index), the names that statement reads and those it binds or changes
    # in place: why a statement came after another, when an error has to say so (`in_statement`)
    node: int | None = field(default=None, compare=False)
    reads: frozenset = field(default=frozenset(), compare=False, repr=False)
    binds: frozenset = field(default=frozenset(), compare=False, repr=False)

    def describe(self) -> str:
        """`M.output`, with the cell's own names (an unrolled loop's iteration says which it is)."""
        described = f"{self.target}.{self.kind}"
        return as_written(described, "label") if LOOP_PREFIX in described else described

    def as_written(self) -> str:
        """The use as the cell writes it: `X.skip(...)` for a skip (describe() names the gate's event)."""
        return f"{as_written(self.target, 'label')}(...)" if self.skip else self.describe()


def in_statement(uses: list, node: int, reads: frozenset, binds: frozenset) -> list:
    """The uses of one statement, each with the statement's index and the names it reads and binds."""
    return [replace(use, node=node, reads=reads, binds=binds) for use in uses]


# What a statement that reads a cache and waits for no event waits for instead (Node.after), in words
CACHE_WAITS = {"forward": "after the forward pass (it reads a cache, whole only then)",
               "pass": "after its backward pass (it reads a cache, whose gradients are whole only then)"}


@dataclass
class Node:
    index: int
    line: int
    end_line: int
    source: str
    reads: frozenset = frozenset()
    binds: frozenset = frozenset()   # names it binds or changes in place
    mutated: frozenset = frozenset() # of those, the names it only changes in place (`h[:, 1] = 0`)
    grad_reads: frozenset = frozenset()   # names it reads only as `name.grad`
    events: tuple = ()
    deps: tuple = ()                 # indices of nodes that must finish first
    block: int | None = None         # backward pass whose `with` block holds this node
    starts_passes: tuple = ()        # backward passes this node runs
    invoke: int | None = None        # the `with invoke(...)` block that holds this node
    # A statement that reads a `cache(...)` of the cell and waits for no event of its own starts once the cache
    # is whole: "forward" (after the forward pass), or "pass" (inside `with LOSS.backward():`, after that pass)
    after: str | None = None
    in_with: bool = False            # it holds a `with` block (a context it may pause inside; scheduler.py)


@dataclass
class BackwardPass:
    index: int
    line: int
    source: str
    block: bool                      # written as `with LOSS.backward():`


class Run(NamedTuple):
    """One moment of a run: a statement started, or was woken by an event it waited for. (A tuple: every
    run of a cell makes them.)"""
    node: int
    line: int
    woke_by: str | None              # the event (`model.transformer.h[3].output`), None when it started
    phase: str                       # "before the model runs", "forward", "backward pass 0", ...


@dataclass
class HookGraph:
    nodes: list = field(default_factory=list)
    passes: list = field(default_factory=list)
    runs: list = field(default_factory=list)     # Run, in the order things happened (after a run)
    failed: int | None = None                    # the node whose statement raised, when the cell failed
    caches: list = field(default_factory=list)   # lines of the cell's `c = cache(...)`: they hook at run time

    def events(self):
        return [event for node in self.nodes for event in node.events]

    def to_text(self) -> str:
        lines = ["hook graph", "events:"]
        seen = {}
        for event in self.events():
            key = (event.kind, event.target)
            seen.setdefault(key, []).append(event)
        lines.extend(f"  cache(...)  [a forward hook on every module it matches]  line {line}" for line in self.caches)
        if not seen and not self.caches:
            lines.append("  (none: the model runs with no hooks)")
        for (kind, _), uses in seen.items():
            if uses[0].skip:          # `X.skip(v)`: X's forward answers with v while the cell runs
                how = ", ".join(f"line {u.line}" for u in uses)
                lines.append(f"  {uses[0].as_written()}  [the module's forward, in place for the run]  {how}")
                continue
            hook = "tensor hook" if kind == "grad" else (
                "forward pre-hook" if kind in ("input", "inputs") else "forward hook")
            how = ", ".join(f"line {u.line} {'writes' if u.write else 'reads'}" for u in uses)
            lines.append(f"  {uses[0].describe()}  [{hook}]  {how}")
        if self.passes:
            lines.append("backward passes:")
            for bw in self.passes:
                shape = "with-block" if bw.block else "statement"
                lines.append(f"  pass {bw.index}: line {bw.line} ({shape}) {bw.source}")
        lines.append("nodes:")
        for node in self.nodes:
            lines.extend(self._node_lines(node))
        lines.append("edges:")
        lines.extend(f"  {edge}" for edge in self.edges() or ["(none)"])
        if self.runs:
            lines.append("run order:")
            lines.extend(f"  {run.phase}: line {run.line} " + (f"woken by {run.woke_by}" if run.woke_by else "started")
                         for run in self.runs)
        if self.failed is not None:
            lines.append(f"failed: node {self.failed} (line {self.nodes[self.failed].line})")
        return "\n".join(lines)

    def _node_lines(self, node: Node) -> list:
        """A statement in `to_text`: its line, and what it waits for."""
        lines = [f"  node {node.index} (line {node.line}): {node.source.splitlines()[0]}"]
        needs = [e.as_written() for e in node.events]
        after = [f"node {d} (line {self.nodes[d].line})" for d in node.deps]
        if needs:
            lines.append(f"      waits for: {', '.join(dict.fromkeys(needs))}")
        if after:
            lines.append(f"      after: {', '.join(after)}")
        if node.block is not None:
            lines.append(f"      inside backward pass {node.block}")
        if node.invoke is not None:
            lines.append(f"      inside invoke {node.invoke} (its rows of the batch)")
        if node.after is not None:
            lines.append(f"      {CACHE_WAITS[node.after]}")
        return lines

    def edges(self) -> list:
        """`event -> node` where a node waits for an event, `node -> node` where one needs another's names."""
        found = []
        for node in self.nodes:
            for event in dict.fromkeys(e.as_written() for e in node.events):
                found.append(f"{event} -> node {node.index}")
            for dep in node.deps:
                found.append(f"node {dep} -> node {node.index}")
            if node.block is not None:
                found.append(f"backward pass {node.block} -> node {node.index}")
        return found

    __str__ = to_text

    def to_dict(self) -> dict:
        return {
            "nodes": [{"index": n.index, "line": n.line, "source": n.source,
                       "reads": _as_written(n.reads), "binds": _as_written(n.binds),
                       "deps": list(n.deps), "block": n.block, "invoke": n.invoke,
                       "after": n.after, "after_why": CACHE_WAITS.get(n.after),
                       "events": [{"kind": e.kind, "target": as_written(e.target, ""), "line": e.line,
                                   "write": e.write} for e in n.events]}
                      for n in self.nodes],
            "passes": [{"index": p.index, "line": p.line, "source": p.source, "block": p.block}
                       for p in self.passes],
            "runs": [{"node": r.node, "line": r.line, "woke_by": r.woke_by, "phase": r.phase} for r in self.runs],
            "failed": self.failed,
            "caches": list(self.caches),
        }


def _as_written(names: frozenset) -> list:
    """The names, sorted, as the cell wrote them: an unrolled loop's per-iteration names by the loop's own."""
    return sorted({as_written(name, "") for name in names})
