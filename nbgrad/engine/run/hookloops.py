"""The statement kind "loop of on-event functions": a loop that only edits or saves each block's output
(compile/hookloops.py), its body called from each block's event as a raw hook would run it, instead of the statement
resumed there. The core starts it (Scheduler.start_ready, with `hook_loops`); a part of DirectRun, whose attributes it
uses.

Each block gets a Task with `loop` set, parked on the block's event with the loop's own request, as the statement
would have parked on it: the core's delivery reaches it (a statement earlier in the source that waits for the same
block still goes first), a block that never runs is said by the same message, and a failure is the statement's, at
its line. The loop ends, as the statement would, when its last block's edit is done."""
from __future__ import annotations

import types

from ...errors import OrderError, diagnose
from ..compile.program import Read
from .elements import hold
from .scheduler import Task


class _Loop:
    """What a loop's blocks share: its variable, body and use, how many blocks it has and which it takes next; for a
    list, the name it is bound to, its elements so far and the blocks that came before their turn."""
    __slots__ = ("name", "body", "use", "size", "next", "first", "result", "values", "early", "advance")


class HookLoops:
    """Starting a HookLoop, and each of its blocks' edits."""
    __slots__ = ()

    def _start_loop(self, node) -> bool:
        """Park a Task on every block of the loop's PATH, before the model runs; False where the run cannot (PATH
        no plain ModuleList now, `range` or `len` not the builtins, a block twice): the statement runs as written."""
        loop, ns = node.loop, self.ns
        if self.model_running or self.done:
            return False
        if loop.by_index and (ns.get("range", range) is not range or ns.get("len", len) is not len):
            return False                           # (the cell's own: a loop of the statement's)
        held = hold(ns, (loop.root, loop.attributes))
        blocks = held[5] if held is not None else ()
        distinct = set(map(id, blocks))
        if not blocks or len(distinct) != len(blocks) or id(self.model) in distinct:
            return False
        state = _Loop()
        state.name, state.body, state.use = loop.name, types.FunctionType(loop.body, ns), loop.use
        state.size, state.next, state.result, state.values, state.early = len(blocks), 0, loop.result, [], {}
        state.advance = self._step if loop.result is None else self._collect     # what a block's event calls
        request, index, cause = Read(None, loop.use, None), node.spec.index, self.cause
        parked, hooks = self.parked, self.hooks
        for position, block in enumerate(blocks):
            step = Task()
            step.node, step.index, step.gen, step.cause, step.module = node, index, None, cause, block
            step.grad_mode = None
            step.loop, step.position, step.item = state, position, position if loop.by_index else block
            key = (id(block), "output")
            if key not in hooks:
                self._hook(block, key)
            parked.setdefault(key, []).append((step, request))
        # What stands for the loop among the started tasks until its last block is done: no generator, and no
        # reference to the loop, so that nothing of a run makes a cycle once its parked blocks are let go
        state.first = first = Task()
        first.node, first.index, first.gen, first.loop = node, index, None, None
        self.tasks.append(first)
        self.requested.add(loop.use)
        self.covered = self.covered | {loop.path}      # its blocks are hooked: `_hook_targets` passes PATH over
        return True

    def _step(self, step: Task, value, error: Exception | None = None) -> None:
        """A block of an edit loop returned `value`: the loop's body edits it (the core's `_advance`, for a block)."""
        loop = step.loop
        self.in_statement += 1
        try:
            if error is not None:
                raise error
            if step.position != loop.next:         # the model ran the blocks out of order: as the statement would
                use = self.uses[loop.use]
                raise OrderError(diagnose.too_late(use, use), use.line)
            self.ns[loop.name] = step.item
            loop.body(value)
        except BaseException:
            self.failed = step.index if self.failed is None else self.failed
            raise
        finally:
            self.in_statement -= 1
        loop.next += 1
        if loop.next == loop.size:
            self._loop_done(loop)

    def _collect(self, step: Task, value, error: Exception | None = None) -> None:
        """A block of a list of saved outputs returned `value`: its element, saved, in the list's order. A block that
        comes before its turn waits for it, as the statement's read would find its value kept."""
        loop = step.loop
        if error is None and step.position != loop.next:
            loop.early[step.position] = (step, value)
            return
        while True:        # the body's call as `_step` makes it, written out: a helper would be a call more a block
            self.in_statement += 1
            try:
                if error is not None:
                    raise error
                loop.values.append(loop.body(value, step.item))
            except BaseException:
                self.failed = step.index if self.failed is None else self.failed
                raise
            finally:
                self.in_statement -= 1
            loop.next += 1
            if loop.next not in loop.early:
                break
            step, value = loop.early.pop(loop.next)
        if loop.next == loop.size:
            self.ns[loop.result] = loop.values
            self._loop_done(loop)

    def _loop_done(self, loop: _Loop) -> None:
        """The loop's last block is done: the statement has finished."""
        self.finished.add(loop.first.index)
        self.tasks.remove(loop.first)
        if self.unstarted:
            self.start_ready()
