"""The run core: which statement runs when. It starts every node whose dependencies are done, resumes each one
with the answer to its request (the one trampoline, `_advance`), parks it on the event it waits for, wakes it when
that event fires, writes the timeline, says the first wait and a too-late write, and closes. Every run is this core:
a Runtime is one (runtime.py), with the statement kinds the compiler gave the cell (docs/architecture.md) and the
homes of the events that answer its requests."""
from __future__ import annotations

import types

import torch
from torch import is_grad_enabled, set_grad_enabled

from ...errors import NbgradError, OrderError, diagnose


def thread_contexts() -> tuple:
    """The thread's modes that a `with` block in a statement may set and nbgrad cannot hand back and forth."""
    return torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda")


# Where a run is, as its timeline records it; set at each change (and "backward pass N" during a pass), so
# that recording it costs no call.
BEFORE_MODEL, FORWARD, AFTER_FORWARD = "before the model runs", "forward", "after the forward pass"


class Task:
    """A started statement, of any kind: its node and index; its generator (None for on-event functions: a Task per
    event with `loop` set, the block's position, the loop variable's value); the use id of the event that woke it
    last; the module it is parked on; the grad mode its code set for itself before it paused, else None. Made with no
    arguments and filled in where it starts, so that making one runs no Python code."""
    __slots__ = ("node", "index", "gen", "cause", "module", "grad_mode", "loop", "position", "item")


def task_index(pair) -> int:
    """The index of the statement of a parked (task, request)."""
    return pair[0].index


class Scheduler:
    """`handlers` maps a request type to `handler(task, request) -> (answered, value)`: answered False means the
    handler parked the task (see `park`). With `hook_loops` a node with a loop of on-event functions (Node.loop), with
    `one_events` an on-event statement (Node.one), starts as one (`_start_loop`, `_start_one`: hookloops.py)."""
    __slots__ = ("program", "ns", "pass_state", "handlers", "unstarted", "finished", "tasks", "parked", "cause",
                 "in_statement", "current", "timeline", "phase", "forward_over", "failed", "hook_loops", "one_reads",
                 "one_events", "ahead")

    # Set as a run is made (Runtime.__init__, no call of its own). `pass_state`: per backward pass, "pending" |
    # "running" | "done"; `finished`: indices; `tasks`: started, not finished; `parked`: event key -> [(task, request)];
    # `cause`: the use id of the event delivered now; `in_statement` > 0 while a statement's own code runs (module calls
    # it makes are not events); `current`: the task whose code runs; `timeline`: (node index, use id of the event that
    # woke it or None, phase); `phase`: "forward", "backward pass 0", ...; `forward_over`: the model's forward call
    # returned (a backward pass may run inside it); `failed`: the index of the node whose code raised; `ahead`: node ->
    # the parts of an on-event statement made before the model, for its start inside the forward (hookloops.start_one)

    def start_ready(self) -> None:
        """Start, in source order, every node whose dependencies have finished (and whose backward pass, for
        a statement inside `with LOSS.backward():`, has begun)."""
        progressed = True
        while progressed:
            progressed = False
            for node in self.unstarted:
                spec = node.spec
                pass_begun = spec.block is None or self.pass_state[spec.block] != "pending"
                if pass_begun and self.finished.issuperset(spec.deps) and (spec.after is None
                                                                           or self._cache_whole(spec)):
                    self.unstarted.remove(node)
                    self.timeline.append((spec.index, None, self.phase))
                    progressed = True
                    if node.loop is not None and self.hook_loops and self._start_loop(node) or \
                            node.one is not None and self.one_events and self._start_one(node):
                        break
                    task = Task()
                    task.node, task.index, task.cause, task.module = node, spec.index, self.cause, None
                    task.grad_mode, task.loop, task.item = None, None, None
                    task.gen = types.FunctionType(node.code, self.ns)()
                    self.tasks.append(task)
                    self._advance(task, None)
                    break

    def _cache_whole(self, spec) -> bool:
        """Has the run reached the point where a statement that reads a cache may start (Node.after)?"""
        if spec.after == "pass":
            return self.pass_state[spec.block] == "done"
        return self.forward_over

    def _advance(self, task: Task, value, error: Exception | None = None, woke=None) -> None:
        """Resume a statement with `value` (or raise `error` at its line) until it waits or finishes. `woke`: the use id
        of the event that wakes it: its row in the timeline, written here only (a loop's block goes on to its loop)."""
        if woke is not None:
            self.timeline.append((task.index, woke, self.phase))
            if task.loop is not None:
                return task.loop.advance(task, value, error)
        gen, contexts = task.gen, thread_contexts() if task.node.spec.in_with else None    # modes not handed back
        while True:
            self.in_statement += 1
            outer, self.current = self.current, task
            entry, own = is_grad_enabled(), task.grad_mode
            if own is not None and own is not entry:
                set_grad_enabled(own)
            try:
                request = gen.send(value) if error is None else gen.throw(error)
            except StopIteration:
                request = None      # finish outside the handler, so later errors chain to nothing
            except BaseException:
                self.failed = task.index if self.failed is None else self.failed
                raise
            finally:
                self.in_statement, self.current = self.in_statement - 1, outer
            if own is not None or (request is not None and is_grad_enabled() is not entry):
                self._hand_back_grad_mode(task, entry)
            if request is None:
                self.finished.add(task.index)
                self.tasks.remove(task)
                if self.unstarted:
                    self.start_ready()
                return
            try:
                answered, value = self.handlers[type(request)](task, request)
                error = None
                if not answered and contexts is not None and thread_contexts() != contexts:
                    raise self.held_context(task, request)
            except Exception as raised:     # raised where the statement asked: its own try/except sees it
                answered, value, error = True, None, raised
            if not answered:
                return

    @staticmethod
    def _hand_back_grad_mode(task: Task, entry: bool) -> None:
        """After a slice of a statement that set a grad mode of its own and paused (or had paused before): keep its
        mode for its next slice, and give the model (and every other statement) the mode it had when the slice began:
        grad mode is the thread's. A statement that never pauses keeps what it sets."""
        task.grad_mode = is_grad_enabled()
        if task.grad_mode is not entry:
            set_grad_enabled(entry)

    def held_context(self, task: Task, request) -> NbgradError:
        """The error for a statement that pauses inside `with torch.inference_mode():` or `torch.autocast(...)`:
        those modes are the thread's, so the model would run in them until the statement's event came (grad
        mode, which nbgrad can hand back and forth, is kept to the statement instead). The task waits no more."""
        for key, waiting in list(self.parked.items()):       # it waits no more (resumed with this error instead)
            waiting[:] = [pair for pair in waiting if pair[0] is not task]
            if not waiting:
                del self.parked[key]
        use = getattr(request, "use", None)
        line = self.program.uses[use].line if isinstance(use, int) else None
        return NbgradError("this statement waits for an event inside a `with` block that sets inference mode or "
                           "autocast, and that mode is the thread's: the model would run in it until the event "
                           "came. Read the value first (`h = M.output`), then use it inside the `with` block", line)

    def park(self, key, task: Task, request) -> tuple:
        """Keep the task until `deliver(key)`; what a handler returns when the event is not there yet."""
        self.parked.setdefault(key, []).append((task, request))
        return False, None

    def deliver(self, key) -> None:
        """The event `key` exists now: answer every task parked on it, in source order, through the trampoline."""
        waiting = self.parked.pop(key, None)
        if not waiting:
            return
        outer, self.cause = self.cause, waiting[0][1].use
        try:
            if len(waiting) > 1:
                waiting.sort(key=task_index)
            for task, request in waiting:
                task.cause = self.cause
                try:
                    answered, value = self.handlers[type(request)](task, request)
                except Exception as raised:
                    self._advance(task, None, raised, request.use)
                    continue
                if answered:
                    self._advance(task, value, None, request.use)
        finally:
            self.cause = outer

    def too_late(self, task: Task, use) -> OrderError:
        cause = self.program.uses[task.cause] if task.cause is not None else None
        return OrderError(diagnose.too_late(use, cause), use.line)

    def first_wait(self):
        """(task, request) of the earliest statement still parked, or None when nothing waits."""
        waits = [(task, request) for entries in self.parked.values() for task, request in entries]
        return min(waits, key=task_index) if waits else None

    def close(self) -> None:
        """Close every started generator and forget everything (runs in clean-up)."""
        while self.tasks:
            gen = self.tasks.pop().gen
            if gen is not None:
                gen.close()
        self.parked.clear()
        self.unstarted.clear()


def one_read_rows(count: int, readers: dict, kept: dict) -> list:
    """The timeline of a cell of one-reads (onesave.py, which runs none of its `count` statements through the core),
    written when someone reads it, as the core writes a run's: every statement started before the model, then each
    woken by its event in the order the events came (`kept`'s keys; `readers`: key -> the statements reading it).
    One whose event never came only started."""
    rows = [(index, None, BEFORE_MODEL) for index in range(count)]
    rows += [(index, index, FORWARD) for key in kept for index in readers[key]]
    return rows
