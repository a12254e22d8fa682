"""The statement kinds "on-event function" and "loop of on-event functions" (compile/hookloops.py): a statement of one
event, or a loop that only edits or saves each block's output, called from the event as a raw hook would run it,
instead of the statement resumed there. The core starts them (Scheduler.start_ready: `start_one`, `start_loop`). Each
event gets a Task with `loop` set, parked on it with the statement's own request: the core's delivery reaches it (an
earlier statement waiting for the same event still goes first), an event that never comes is said by the same message,
and a failure is the statement's, at its line. It ends, as the statement would, when its last event's part is done."""
from __future__ import annotations

import types
from functools import partial

from ...errors import OrderError, diagnose
from ..compile.program import Read
from .. import moduletree
from .elements import hold, walk
from .scheduler import Task

ALL = slice(None)         # an on-event function's `:` where its statement is in no invoke


class _Loop:
    """What a loop's blocks share: run, variable, body, use, block count, the next block, how many blocks' bodies ran
    at their event (`on_block`); for a list, its name, its elements so far, blocks that came early. `advance`: what an
    event calls (the class's: no reference to itself)."""
    __slots__ = ("run", "name", "body", "use", "size", "next", "ran", "first", "result", "values", "early")

    def step(self, step: Task, value, error: Exception | None = None) -> None:
        """A block of an edit loop returned `value`: the loop's body edits it (the core's `_advance`, for a block)."""
        run = self.run
        run.in_statement += 1
        outer, run.current = run.current, step      # (a save in an invoke is that invoke's: Runtime.save)
        try:
            if error is not None:
                raise error
            if step.position != self.next:         # the model ran the blocks out of order: as the statement would
                use = run.program.uses[self.use]
                raise OrderError(diagnose.too_late(use, use), use.line)
            if self.name is None:       # an on-event statement, a "loop" of one block: its `:` is `item` (start_one)
                self.body(value, step.item or ALL)
            else:
                run.ns[self.name] = step.item
                if step.position >= self.ran:
                    self.body(value)
        except BaseException:
            run.failed = step.index if run.failed is None else run.failed
            raise
        finally:
            run.in_statement, run.current = run.in_statement - 1, outer
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
    """A loop that edits each block's output. Where it alone waits on events inside the forward (Runtime._forward says),
    a block's hook runs only the body and logs the event, as a raw hook would; the core answers the log once the model
    has returned, where its own code runs warm (`replay`: about 5 us a block less on the embedded model)."""
    __slots__ = ()
    advance = _Loop.step

    def on_block(self, step: Task, key, module, args, value):
        """A block's hook. Anything out of the way (no log, a block out of order or called again, a call the cell
        makes) goes the event's own way, the log answered first."""
        run = self.run
        logged = run.forward.logged
        if logged is None or step.position != self.ran or run.in_statement:
            if logged is not None:
                self.replay()
            return run.forward._on_event(key, module, args, value)
        run.ns[self.name] = step.item
        try:
            self.body(value)
        except BaseException as error:       # the blocks before answered, then this one: its row, its error (`step`)
            logged[key] = value
            self.replay(error)
        logged[key] = value
        self.ran += 1

    def replay(self, error: BaseException | None = None) -> None:
        """Answer the logged blocks in order, as `ForwardEvents._on_event` would have (the core writes each row), the
        bodies skipped; later blocks are answered as they come. `error`: what the body of the block after the last
        that ran (`ran`) raised, raised by its step as the statement's."""
        run, use = self.run, self.use
        forward, parked, outer, run.cause = run.forward, run.parked, run.cause, use
        logged, forward.logged = forward.logged, None
        try:
            for key, value in logged.items():
                forward.values[key] = value
                ((step, _),) = parked.pop(key)
                step.cause, step.module = use, None
                run._advance(step, value, error if step.position == self.ran else None, use)
        finally:
            run.cause = outer


class _ListLoop(_Loop):
    """A list of each block's saved output."""
    __slots__ = ()
    advance = _Loop.collect


def start_one(run, node, ahead: bool = False) -> bool:
    """Start an on-event statement (Node.one) as an edit loop of one block, the statement its body, parked as its read
    would be (ForwardEvents.read) or run at once; False where `walk` cannot find its module: it runs as written.
    `ahead`: before the model, only make its parts, for a start inside the forward (after the statement it waits
    for), where the same work runs cold; taken while no module is registered and the root's name holds the same."""
    one, versions = node.one, moduletree._structure_version
    made = run.ahead.pop(node, None) if run.ahead else None
    if made is None or made[0] != versions[0] or run.ns.get(one.root) is not made[1]:
        module = walk(run.ns, one.root, one.steps)
        if module is None:
            return False
        state, step, first = _EditLoop(), Task(), Task()      # (Tasks filled in here: making one runs no Python code)
        state.run, state.name, state.body, state.use = run, None, types.FunctionType(one.body, run.ns), one.use
        state.size, state.next, state.first, index = 1, 0, first, node.spec.index
        step.node, step.index, step.gen, step.module, step.grad_mode = node, index, None, module, None
        step.loop, step.position, invoke = state, 0, node.spec.invoke
        step.item = slice(*run.rows.spans[invoke]) if one.rows and invoke is not None else None     # (forward.read)
        first.node, first.index, first.gen, first.loop = node, index, None, None      # as a loop's (start_loop)
        if ahead:
            run.ahead[node] = (versions[0], run.ns.get(one.root), state, step, first)
            if (id(module), "output") in run.hooks:     # its event is hooked already: `hook_targets` need not look
                run.forward.requested.add(one.use)
            return True
    else:
        _, _, state, step, first = made
    step.cause = run.cause
    run.tasks.append(first)
    try:
        answered, value = run.forward.read(step, tuple.__new__(Read, (None, one.use, None)))   # (no Python call)
    except Exception:       # (too late, never came): said as the statement says it, from its line, as written
        run.tasks.remove(first)
        return False
    if answered:
        state.step(step, value)
    return True


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
    state.size, state.next, state.ran, state.result, state.values, state.early = len(blocks), 0, 0, loop.result, [], {}
    edits = loop.result is None and not forward.quiet
    if edits:                   # the run's one edit loop may leave its bookkeeping to the model's end; of two, neither
        forward.deferred = state if forward.deferred is None else False
    request, index, cause = tuple.__new__(Read, (None, loop.use, None)), node.spec.index, run.cause
    parked, hooks = run.parked, []
    on_event = forward._log_event if forward.quiet else forward._on_event   # `forward.hook`'s, a block being no model
    for position, block in enumerate(blocks):
        step = Task()
        step.node, step.index, step.gen, step.cause, step.module = node, index, None, cause, block
        step.grad_mode = None
        step.loop, step.position, step.item = state, position, position if loop.by_index else block
        key = (id(block), "output")
        hooks.append((key, block, partial(state.on_block, step, key) if edits else partial(on_event, key)))
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
