"""`M.skip(v)`: M does not run, `v` is its output (nnsight's `.skip`). It compiles to a write of the `output` event of
M's SkipGate (compile/siteaccess.py), hookable like a module: while it holds a hook, M's instance `forward` is the gate,
which fires the event with nothing in it; a statement that writes the event supplies M's output and M's own forward is
not called. With no write (the statement did not run for this call), M runs as usual."""
from __future__ import annotations

import types
import weakref

import torch
from torch import Tensor, nn

from ...errors import NbgradError
from ...errors.naming import a_or_an

NOT_SKIPPED = None        # what the gate's event holds until a statement writes the output


class SkipGate:
    def __init__(self, module: nn.Module):
        self.module_ref = weakref.ref(module)
        self.hooks: dict = {}
        self.given: tuple | None = None     # (what the instance dict held under `forward`, the gate we put there)
        self.skipped = False                # M was skipped at its latest call (for the error after the run); set at
                                            # each call, not when hooks are bound: an edit binds again right after
                                            # the call, before the cell's 'never came' error asks
        self.partial = None                 # the invokes that skipped M while M ran for the others' rows
        self.inner = None                   # M's forward with its sites, when a cell names both (sites.py)

    def __repr__(self):
        module = self.module_ref()
        return f"<skip of {type(module).__name__}>"

    def register_forward_pre_hook(self, hook, *, with_kwargs: bool = False, prepend: bool = False):
        raise NbgradError("a skipped module has no input event of its own: read the module's .input instead")

    def register_forward_hook(self, hook, *, prepend: bool = False):
        handle = _GateHandle(self)
        try:
            self.hooks[id(handle)] = hook
            if prepend:         # first to see the value, as torch's prepend
                for key in [k for k in self.hooks if k != id(handle)]:
                    self.hooks[key] = self.hooks.pop(key)
            self._bind()
            return handle           # inside the try: an interrupt on this line is still ours to undo
        except BaseException:       # an interrupt before the caller holds the handle
            handle.remove()
            raise

    def _bind(self):
        module = self.module_ref()
        if self.given is None and module is not None:
            gate = types.MethodType(_gate_forward, module)
            self.partial = None
            PARTIAL.discard(self)
            self.given = (module.__dict__.get("forward", ABSENT), gate)
            module.__dict__["forward"] = gate

    def release(self, handle):
        self.hooks.pop(id(handle), None)
        if self.hooks or self.given is None:
            return
        PARTIAL.discard(self)
        give_back_forward(self.module_ref(), self.given)
        self.given = None

    def run(self, module, args, kwargs):
        output = NOT_SKIPPED
        for hook in list(self.hooks.values()):
            replaced = hook(self, args, output)
            if replaced is not None:
                output = replaced
        if type(output) is RowsSkipped:         # invokes' skips, each its own rows
            self.partial = frozenset(output.values)     # before M runs: reads inside it ask (skipped_for_invoke)
            PARTIAL.add(self)
            output, ran = output.whole(lambda: self._forward(module)(*args, **kwargs))
            self.skipped = not ran
            return output
        self.skipped = output is not NOT_SKIPPED
        if self.skipped:
            return output
        return self._forward(module)(*args, **kwargs)

    def _forward(self, module):
        before = self.given[0] if self.given is not None else ABSENT
        return self.inner or (before if before is not ABSENT else types.MethodType(type(module).forward, module))


def checked_skip_value(use, value):
    """`M.skip(v)`'s v, refused when it cannot stand in for a module's output (None is what "not skipped"
    holds, so it would be ignored in silence)."""
    if isinstance(value, (Tensor, tuple, list, dict)):
        return value
    module = use.target[:-len(".skip")]
    takes = (f"`{module}.skip(v)` takes the value that {module}'s output becomes while it does not run: a tensor "
             f"of the shape its forward returns (a tuple for many attention modules)")
    if value is None:
        raise NbgradError(f"{takes}; None is no output. To let it run, leave the skip out", use.line)
    raise NbgradError(f"{takes}, not {a_or_an(type(value).__name__)}", use.line)


class RowsSkipped:
    """`M.skip(v)` inside `with invoke(...)` blocks (and `--over` examples): each skipping invoke's `v` is M's
    output at that invoke's rows. Made whole when the gate's event has been answered: the `v`s joined in row
    order when every invoke skipped with a value of its own rows (M does not run), else M's output on the
    batch with those rows replaced."""

    def __init__(self, rows):
        self.rows, self.values = rows, {}         # InvokeRows; invoke index -> its v

    @classmethod
    def add(cls, held, rows, invoke: int, value) -> "RowsSkipped":
        """What the gate's event holds after an invoke's `M.skip(value)`."""
        if held is not NOT_SKIPPED and type(held) is not cls:   # a statement outside the blocks skipped the batch
            return rows.replace(held, invoke, value)
        skipped = held if type(held) is cls else cls(rows)
        skipped.values[invoke] = value
        return skipped

    def whole(self, run_module) -> tuple:
        """(M's output for the batch, whether M ran)."""
        spans = self.rows.spans
        if len(self.values) == len(spans):
            joined = _joined([self.values[invoke] for invoke in range(len(spans))], spans)
            if joined is not _APART:
                return joined, False
        output = run_module()
        for invoke, value in self.values.items():
            output = self._replaced(output, invoke, value)
        return output, True

    def _replaced(self, output, invoke: int, value):
        """M's batch output with the invoke's rows from `value`; where `value` holds None (`(v, None)` for an
        attention's weights), the batch keeps M's own: a batch has no None for some rows only."""
        if value is None:
            return output
        if type(output) in (tuple, list) and type(value) in (tuple, list) and len(value) == len(output):
            return type(output)(self._replaced(o, invoke, v) for o, v in zip(output, value))
        return self.rows.replace(output, invoke, value)


_APART = object()          # what `_joined` gives for values it cannot join into one batch value


def _joined(parts: list, spans: list):
    """One batch value of the invokes' values, in row order: tensors of their invoke's rows concatenated, tuples
    and lists joined element by element, None where each is None; else _APART."""
    if all(isinstance(v, Tensor) and v.dim() and v.shape[0] == stop - start for v, (start, stop) in zip(parts, spans)):
        return torch.cat(parts)
    if all(part is None for part in parts):
        return None
    kind = type(parts[0])
    if kind in (tuple, list) and all(type(p) is kind and len(p) == len(parts[0]) for p in parts):
        elements = [_joined([part[i] for part in parts], spans) for i in range(len(parts[0]))]
        return _APART if any(e is _APART for e in elements) else kind(elements)
    return _APART


ABSENT = object()       # what `given` holds where the instance had no `forward` of its own


def give_back_forward(module: nn.Module | None, given: tuple) -> None:
    """Put back what M's instance dict held under `forward` (`given`: (that, what we put there)), if ours is
    still there: nothing of a skip gate or a rewritten forward stays on the instance."""
    before, ours = given
    if module is not None and module.__dict__.get("forward") is ours:
        if before is ABSENT:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = before


class _GateHandle:
    def __init__(self, gate: SkipGate):
        self.gate = gate

    def remove(self):
        self.gate.release(self)


def _gate_forward(module, *args, **kwargs):
    return _gates[module].run(module, args, kwargs)


_gates: "weakref.WeakKeyDictionary[nn.Module, SkipGate]" = weakref.WeakKeyDictionary()


def gate_in_place(module: nn.Module) -> "SkipGate | None":
    """The skip gate that is M's instance forward now, if any."""
    own = module.__dict__.get("forward")
    return _gates.get(module) if getattr(own, "__func__", None) is _gate_forward else None


def skip_of(target) -> SkipGate:
    """`M.skip(v)` in a cell: the gate whose output event a statement writes."""
    if not isinstance(target, nn.Module):
        raise NbgradError(f"`.skip(v)` skips a module; {type(target).__name__} is not one")
    if target not in _gates:
        _gates[target] = SkipGate(target)
    return _gates[target]


def skipped_around(module_or_site) -> "nn.Module | None":
    """The skipped module that contains `module_or_site` in this run, if any (for 'never came' errors)."""
    owner, _ = _owner(module_or_site)
    for module, gate in list(_gates.items()):
        if gate.skipped and gate.given is not None and (owner is module or _inside(owner, module)):
            return module
    return None


def skipped_for_invoke(module_or_site, invoke: int) -> "nn.Module | None":
    """The module containing `module_or_site` that `invoke` skipped while it ran for other invokes' rows: nothing
    inside it ran for that invoke, as nothing would run alone."""
    owner, site = _owner(module_or_site)
    for gate in list(PARTIAL):
        module = gate.module_ref()
        if (invoke in gate.partial and gate.given is not None and module is not None and _inside(owner, module)
                and (site or owner is not module)):       # M's own input and output (v) are the invoke's
            return module
    return None


def _owner(module_or_site) -> tuple:
    """(the module whose event it is, whether it is a site): a site's is the module of whose forward it is part."""
    table = getattr(module_or_site, "table", None)
    return (module_or_site, False) if table is None else (table.root.module_ref(), True)


# The gates that some invokes skip while their module runs for the others: while it is empty (always, but in such
# a run), an invoke's read pays one truth test for this (ForwardEvents.read)
PARTIAL: set = set()


def _inside(inner, outer) -> bool:
    return isinstance(inner, nn.Module) and any(m is inner for m in outer.modules())
