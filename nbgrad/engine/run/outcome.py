"""What a run leaves when it ends: its hook graph (which event woke each statement, and when) and, when it failed,
the error as the cell shows it."""
from __future__ import annotations

from ...errors import for_the_cell, hints, located
from ..compile.graph import HookGraph, Run
from ..compile.program import Program
from .scheduler import one_read_rows


def failed_cell(run, error: BaseException) -> BaseException:
    """The error of a run as the cell shows it: the names the cell bound given back, the error at its line, with hints
    and the graph of what ran and which statement failed."""
    if run.state is not None:
        run.state.unbind()
    program, forward = run.program, run.forward
    error = located(error, program.uses, program.filename)
    error = hints.failed_after_replacement(error, forward.last_replacement)
    hints.add_hints(error, forward)
    try:
        error.nbgrad_graph = run_graph(program, run.timeline, run.failed, run.one_reads)
    except AttributeError:
        pass
    return for_the_cell(error)


def run_graph(program: Program, timeline: list, failed, one_reads=None) -> HookGraph:
    """The hook graph with what happened in a run: which event woke each statement, and when (for a cell of
    one-reads, from what it left: `one_reads`)."""
    if one_reads is not None:
        timeline = one_read_rows(*one_reads)
    uses, nodes = program.uses, program.graph.nodes
    runs = [Run(node, nodes[node].line, uses[use].describe() if use is not None else None, phase)
            for node, use, phase in timeline]
    return HookGraph(nodes, program.graph.passes, runs, failed, program.graph.caches)
