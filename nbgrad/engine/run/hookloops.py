"""A direct run's loops that only edit or save each block's output (compile/hookloops.py): the body called from each
block's event, as a raw hook would run it, instead of the statement resumed there. A mixin of DirectRun, whose attributes
it uses.

Each block gets a Step, parked on the block's event with the loop's own request, as the statement would have parked
on it: the event reaches it through the same delivery (a statement earlier in the source that waits for the same
block still goes first), a block that never runs is said by the same message, and a failure is the statement's, at
its line. The loop ends, as the statement would, when its last block's edit is done."""
from __future__ import annotations

import types

from ...errors import OrderError, diagnose
from ..compile.program import Read
from .elements import hold

_CLOSED = (None for _ in ())      # what a Step gives `_exit` to close: its statement never runs as a generator


class Step:
    """One block of a loop (direct._Task's fields, for what reads a task, and the loop's)."""
    __slots__ = ("index", "gen", "cause", "module", "grad_mode", "loop", "position", "item")


class _Started:
    """What stands for a loop in the run's started tasks until its last block is done: no reference to the loop,
    so that nothing of a run makes a cycle once its parked Steps are let go (a cycle through the loop's bound
    `advance` would hold the whole run until a collector pass)."""
    __slots__ = ("index", "gen")


class _Loop:
    """What a loop's Steps share: its variable, body and use, how many blocks it has and which it takes next; for a
    list, the name it is bound to, its elements so far and the blocks that came before their turn."""
    __slots__ = ("name", "body", "use", "size", "next", "first", "result", "values", "early", "advance")


class HookLoops:
    """Starting a HookLoop, and each of its blocks' edits."""
    __slots__ = ()

    def _start_loop(self, node) -> bool:
        """Park a Step on every block of the loop's PATH, before the model runs; False where the run cannot (PATH
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
        self.unstarted.remove(node)
        state = _Loop()
        state.name, state.body, state.use = loop.name, types.FunctionType(loop.body, ns), loop.use
        state.size, state.next, state.result, state.values, state.early = len(blocks), 0, loop.result, [], {}
        state.advance = self._step if loop.result is None else self._collect     # what a Step's event calls
        request, index, cause = Read(None, loop.use, None), node.spec.index, self.cause
        parked, hooks = self.parked, self.hooks
        for position, block in enumerate(blocks):
            step = Step()
            step.index, step.gen, step.cause, step.module, step.grad_mode = index, _CLOSED, cause, block, None
            step.loop, step.position, step.item = state, position, position if loop.by_index else block
            key = (id(block), "output")
            if key not in hooks:
                self._hook(block, key)
            parked.setdefault(key, []).append((step, request))
        state.first = _Started()
        state.first.index, state.first.gen = index, _CLOSED
        self.tasks.append(state.first)           # until the last block's edit: `_exit` closes what is still started
        self.requested.add(loop.use)
        self.covered = self.covered | {loop.path}      # its blocks are hooked: `_hook_targets` passes PATH over
        self.timeline.append((node.spec.index, None, self.phase))
        return True

    def _step(self, step: Step, value, error: Exception | None = None) -> None:
        """A block of an edit loop returned `value`: the loop's body edits it (DirectRun._advance, for a Step)."""
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

    def _collect(self, step: Step, value, error: Exception | None = None) -> None:
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
            self._start_ready()
