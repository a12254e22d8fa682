"""Persistent edits (`%%edit MODEL`, `nbgrad.edit`): a compiled body that runs at every call of a model until
removed. Each call of the model is one step of a Runtime, as each forward call of `generate` is one step of
a `%%generate` cell; the steps of every edit on a model are driven by one EditStack of that model.

    installed / after a call   arm each edit: a fresh EditRun, hooks on the events its graph names, put first
                               on each module (before the hooks of a trace or of the user), so that a later
                               cell reads the edited values and its own edits apply on top
    model called               (the stack's pre-hook, first of all) start every edit's step
    model returned             (the stack's hook, last of the edits', also when the forward raised) finish each
                               step, close it, arm again
    removed                    close the steps, take the stack's own hooks off when no edit is left

Between calls the armed hooks let every event pass untouched (a submodule called alone is not a call of the
model). An interrupt that cuts a call short leaves its steps open: the next call of the model closes them
first, and `remove()` closes them whatever state they are in.
"""
from __future__ import annotations

import weakref

from torch import nn

from ...errors import NbgradError, diagnose
from .editstack import EditStack, stack_on, stacks
from .loopranges import check_loop_ranges
from ..run.missing import PATH_ERRORS
from ..run.runtime import Runtime
from ..compile.editable import check_names
from ..compile.program import RUNTIME_NAME


class Edit:
    """An edit installed on a model: `remove()` it (twice does nothing), or use it as a context manager
    (`with nbgrad.edit(model, source): ...` removes it at the end of the block)."""

    def __init__(self, model: nn.Module, program, namespace: dict, label: str = ""):
        self.model, self.program, self.namespace = model, program, namespace
        self.source = program.source
        self.label = label or f"nbgrad.edit({type(model).__name__})"
        self.active = False
        self.skipped_at_call: list = []     # the modules its latest call of the model skipped (editrun.py)

    def remove(self) -> None:
        stack = stack_on(self.model)
        if self.active or (stack is not None and (self in stack.edits or not stack.edits)):   # (or one cut short)
            stack_of(self.model).remove(self)

    def __enter__(self) -> "Edit":
        if not self.active:     # a `with` would run without it, silently
            raise NbgradError(f"{self.label} was removed: it is no longer on the model; install it again with "
                              f"nbgrad.edit(model, source) (or %%edit)")
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def summary(self) -> str:
        """The body on one line, cut short."""
        text = "; ".join(line.strip() for line in self.source.splitlines() if line.strip())
        return text if len(text) <= 80 else text[:79] + "…"

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return f"<Edit on {type(self.model).__name__} ({state}): {self.summary()}>"


def install(edit: Edit) -> Edit:
    """Put `edit` on its model, after the edits already there; a module path not in the model is refused now."""
    _check_paths(edit.program, edit.namespace)
    check_loop_ranges(edit.program.source, edit.namespace)      # a literal range past the last layer: said now
    check_names(edit.program, edit.namespace)      # a name read elsewhere in the body: said now, not at every call
    stack = stack_on(edit.model)
    if stack is None:
        stack = EditStack(edit.model)
        stacks[edit.model] = weakref.ref(stack)
    stack.add(edit)
    return edit


def names_read(program, namespace: dict) -> dict:
    """The names the body (and the helpers compiled into it) reads, with their values now: what an edit keeps of
    the notebook, so that the rest of it (a large tensor deleted later, say) is not held while the edit is on."""
    names = set(program.helper_globals).union(*(node.spec.reads for node in program.nodes))
    return {name: namespace[name] for name in names if name in namespace}


def _check_paths(program, namespace: dict) -> None:
    for target in program.forward_targets:
        if not target.uses or target.needs or target.every_element:
            continue
        try:
            eval(target.code, {**namespace, RUNTIME_NAME: Runtime})     # `M.source.SITE`, `M.skip` open here
        except PATH_ERRORS as error:
            raise diagnose.module_path_error(program.uses[min(target.uses)], namespace, error) from error
        except Exception as error:      # a name the body reads that is not bound: say so now, not at every call
            use = program.uses[min(target.uses)]
            raise NbgradError(f"{use.describe()}: the module cannot be found when the edit is installed "
                              f"({type(error).__name__}: {error})", use.line) from error


def stack_of(model: nn.Module) -> "EditStack":
    return stack_on(model) or EditStack(model)


def active_edits(model: nn.Module) -> list:
    """The edits installed on `model`, in the order they apply."""
    stack = stack_on(model)
    return list(stack.edits) if stack is not None else []


def edit_hooks(model: nn.Module) -> int:
    """How many hooks on `model` and its modules belong to its edits (they stay between cells)."""
    stack = stack_on(model)
    return stack.hook_count() if stack is not None else 0


def skipped_modules(edit: Edit) -> list:
    """The modules `edit` skips (`M.skip(v)` in its body), for the sidebar: those its paths name, and those its
    latest call of the model skipped (a skip in a loop names its module only as it runs); one its path no longer
    finds is left out."""
    modules = list(edit.skipped_at_call)
    for target in edit.program.forward_targets:
        if target.needs or target.every_element or not any(edit.program.uses[i].skip for i in target.uses):
            continue
        try:
            gate = eval(target.code, {**edit.namespace, RUNTIME_NAME: Runtime})
        except Exception:       # the namespace changed since the edit was installed: nothing to mark
            continue
        module = gate.module_ref() if hasattr(gate, "module_ref") else None
        if module is not None and all(module is not known for known in modules):
            modules.append(module)
    return modules
