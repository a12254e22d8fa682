"""The statement kind "loop of on-event functions": a loop that only edits or saves each block's output
(compile/hookloops.py), its body called from each block's event as a raw hook would run it, instead of the statement
resumed there. The core starts it (Scheduler.start_ready, with `hook_loops`: `start_loop` is the Runtime's
`_start_loop`). Each block gets a Task with `loop` set, parked on the block's event with the loop's own request, as
the statement would have parked on it: the core's delivery reaches it (an earlier statement that waits for the same
block still goes first), a block that never runs is said by the same message, and a failure is the statement's, at
its line. The loop ends, as the statement would, when its last block's edit is done."""
from __future__ import annotations

import types
from functools import partial

from ...errors import OrderError, diagnose
from ..compile.program import Read
from .elements import hold
from .scheduler import Task


class _Loop:
    """What a loop's blocks share: its run, variable, body and use, how many blocks it has and which it takes next;
    for a list, the name it is bound to, its elements so far and the blocks that came before their turn. `advance` is
    what a block's event calls (the class's own method, so that a loop holds no reference to itself)."""
    __slots__ = ("run", "name", "body", "use", "size", "next", "first", "result", "values", "early")

    def step(self, step: Task, value, error: Exception | None = None) -> None:
        """A block of an edit loop returned `value`: the loop's body edits it (the core's `_advance`, for a block)."""
        run = self.run
        run.in_statement += 1
        try:
            if error is not None:
                raise error
            if step.position != self.next:         # the model ran the blocks out of order: as the statement would
                use = run.program.uses[self.use]
                raise OrderError(diagnose.too_late(use, use), use.line)
            run.ns[self.name] = step.item
            self.body(value)
        except BaseException:
            run.failed = step.index if run.failed is None else run.failed
            raise
        finally:
            run.in_statement -= 1
        self.next += 1
        if self.next == self.size:
            self.done()

    def collect(self, step: Task, value, error: Exception | None = None) -> None:
        """A block of a list of saved outputs returned `value`: its element, saved, in the list's order. A block that
        comes before its turn waits for it, as the statement's read would find its value kept."""
        if error is None and step.position != self.next:
            self.early[step.position] = (step, value)
            return
        run = self.run
        while True:        # the body's call as `step` makes it, written out: a helper would be a call more a block
            run.in_statement += 1
            try:
                if error is not None:
                    raise error
                self.values.append(self.body(value, step.item))
            except BaseException:
                run.failed = step.index if run.failed is None else run.failed
                raise
            finally:
                run.in_statement -= 1
            self.next += 1
            if self.next not in self.early:
                break
            step, value = self.early.pop(self.next)
        if self.next == self.size:
            run.ns[self.result] = self.values
            self.done()

    def done(self) -> None:
        """The loop's last block is done: the statement has finished."""
        run = self.run
        run.finished.add(self.first.index)
        run.tasks.remove(self.first)
        if run.unstarted:
            run.start_ready()


class _EditLoop(_Loop):
    """A loop that edits each block's output."""
    __slots__ = ()
    advance = _Loop.step


class _ListLoop(_Loop):
    """A list of each block's saved output."""
    __slots__ = ()
    advance = _Loop.collect


def start_loop(run, node) -> bool:
    """Park a Task on every block of the loop's PATH, before the model runs; False where the run cannot (PATH no plain
    ModuleList now, `range` or `len` not the builtins, a block twice): the statement runs as written."""
    loop, ns, forward = node.loop, run.ns, run.forward
    if forward.model_running or forward.done:
        return False
    if loop.by_index and (ns.get("range", range) is not range or ns.get("len", len) is not len):
        return False                           # (the cell's own: a loop of the statement's)
    held = hold(ns, (loop.root, loop.attributes))
    blocks = held[5] if held is not None else ()
    distinct = set(map(id, blocks))
    if not blocks or len(distinct) != len(blocks) or id(run.model) in distinct:
        return False
    state = _EditLoop() if loop.result is None else _ListLoop()
    state.run, state.name, state.body, state.use = run, loop.name, types.FunctionType(loop.body, ns), loop.use
    state.size, state.next, state.result, state.values, state.early = len(blocks), 0, loop.result, [], {}
    request, index, cause = Read(None, loop.use, None), node.spec.index, run.cause
    parked, hooks = run.parked, []
    on_event = forward._log_event if forward.quiet else forward._on_event   # `forward.hook`'s, a block being no model
    for position, block in enumerate(blocks):
        step = Task()
        step.node, step.index, step.gen, step.cause, step.module = node, index, None, cause, block
        step.grad_mode = None
        step.loop, step.position, step.item = state, position, position if loop.by_index else block
        key = (id(block), "output")
        hooks.append((key, block, partial(on_event, key)))
        parked.setdefault(key, []).append((step, request))
    run.hooks.forward_hooks(hooks)
    # What stands for the loop among the started tasks until its last block is done: no generator, and no reference
    # to the loop, so that nothing of a run makes a cycle once its parked blocks are let go
    state.first = first = Task()
    first.node, first.index, first.gen, first.loop = node, index, None, None
    run.tasks.append(first)
    forward.requested.add(loop.use)
    forward.covered = forward.covered | {loop.path}      # its blocks are hooked: `hook_targets` passes PATH over
    return True
