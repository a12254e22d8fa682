"""What only a failure or a hint needs of module events (forward.py): an event that never came, a path that is not in
the model, a read that returned no tensor."""
from __future__ import annotations

from torch import Tensor, nn

from ...errors import OrderError, diagnose
from .calls import CallOf
from .sites import NoSourceError, Site, SiteError
from .skips import SkipGate, skipped_around
from .stopping import never_came_after_stop

HOOKABLE = (nn.Module, Site, SkipGate, CallOf)   # what has events: a module, a site inside a forward, a skip, a call
# What finding a module along a statement's path may raise, for a step that is not in the model
PATH_ERRORS = (SiteError, NoSourceError, AttributeError, IndexError, KeyError, TypeError)


def never_ran(use, module, model, late: bool) -> OrderError:
    """The error for a read of a module's event that never came, with the model's forward over (`late`: its hook was
    first asked for while the model ran)."""
    skipped = skipped_around(module)
    if skipped is not None:
        return OrderError(f"{use.target}.{use.kind} never came: {type(skipped).__name__} was skipped "
                          f"(`.skip(...)`), so nothing inside it ran", use.line)
    return OrderError(diagnose.never_ran(use, module, model, after_forward=False, late=late), use.line)


def never_came(events, task, request) -> OrderError:
    """The error for a statement still waiting on a module's event when the run ends."""
    runtime = events.runtime
    use = events.uses[request.use]
    module = events._module(task, request)       # the module it waits on, or found by its path
    if runtime.stopped_at is not None:
        return never_came_after_stop(use, diagnose.module_path(runtime.model, module) or use.target,
                                     runtime.stopped_at, runtime.rows is not None)
    if isinstance(module, Site) and module.table.reached(module) is False:
        return OrderError(diagnose.site_not_reached(use, f"{module.table.label}.{module.name}"), use.line)
    late = events.late_hooks is not None and (id(module), use.kind) in events.late_hooks
    return never_ran(use, module, runtime.model, late)


def path_error(events, error: Exception, use_id) -> Exception:
    """What to raise when finding a request's module raised `error` (one of PATH_ERRORS): an error that says which
    step of its path is not in the model, or for `M.source.NAME`, the message with the line."""
    if isinstance(error, (SiteError, NoSourceError)):
        found = type(error)(error.detail, error.line or events.uses[use_id].line)
        found.__suppress_context__ = True
        return found
    found = diagnose.module_path_error(events.uses[use_id], events.runtime.ns, error)
    found.__cause__ = error
    return found


def note_type(events, use_id: int, use, value) -> None:
    """A read that returned a tuple or another non-tensor, kept for the hints of a later error."""
    if type(value) is tuple:
        events.tuple_reads = events.tuple_reads or {}
        events.tuple_reads[use_id] = (use, len(value))
    elif not isinstance(value, Tensor):
        events.other_reads = events.other_reads or {}
        events.other_reads[use_id] = (use, type(value).__name__)

