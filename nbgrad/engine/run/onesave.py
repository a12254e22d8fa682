"""The statement kind "the cell of one-reads": `NAME = PATH.output.save()` statements alone (Program.one_save), the
most common cell there is, answered by hooks with no statement run (Runtime._forward, with the fast kinds): as
statements, each would be some fifteen Python calls, run cold between two forward passes, for a raw hook's one.
The run finds each module by `_modules` (elements.py), hooks it (the model's own output: what its call returns), and
once the model has run does what the statements would have, in the order their events came: binds each NAME to its
module's first value and saves it, or says that the first event never came. It leaves what happened (`run.one_reads`)
for the core to write the timeline from when it is read. A path not found so (a class with ways of its own, a compiled
module, a name not bound, a model with a backward hook) goes the general way, from the start: nothing has happened."""
from __future__ import annotations

from functools import partial

from torch import Tensor
from torch.nn.modules import module as torch_module

from ...errors import hints
from .calls import note_called_again
from .elements import walk
from .missing import HOOKABLE, never_ran, note_type
from .scheduler import AFTER_FORWARD, FORWARD


def forward_one(run, reads: tuple, call_args: tuple, call_kwargs: dict) -> bool:
    """Run the model for the cell `reads` describes; False, having done nothing, where the general way must."""
    model, ns, modules = run.model, run.ns, []
    for read in reads:
        module = walk(ns, read[1], read[2])
        if (module is None or not isinstance(module, HOOKABLE) or type(module).__name__ == "OptimizedModule"
                or module is model and (model._backward_hooks or model._backward_pre_hooks
                                        or torch_module._global_backward_hooks
                                        or torch_module._global_backward_pre_hooks)):
            return False      # (a backward hook on the model wraps its output after the forward hooks have run)
        modules.append(module)
    forward, hooks = run.forward, run.hooks
    run.unstarted.clear()                           # the statements start, and wait for their events
    kept: dict = {}                                 # key -> the value of its module's first call, in the order of calls
    readers: dict = {}                              # key -> the statements that read it
    run.one_reads = (len(modules), readers, kept)   # the timeline, which the core writes (scheduler.one_read_rows)
    for index, module in enumerate(modules):
        forward.requested.add(index)
        key = (id(module), "output")
        if key not in readers:
            readers[key] = [index]
            if module is not model:
                hooks.forward_hook(key, module, partial(_kept, forward, kept, key))
        else:
            readers[key].append(index)
    forward.model_running, run.phase = True, FORWARD
    try:
        try:
            output = model(*call_args, **call_kwargs)
        except Exception:
            _saved(run, reads, readers, kept)     # the statements had their values inside the hooks: saved first
            raise
    except RuntimeError as error:
        hints.note_float_ids(error, call_args, call_kwargs)
        raise
    if (id(model), "output") in readers:            # the last event of the forward
        kept[(id(model), "output")] = forward.values[(id(model), "output")] = output
    _saved(run, reads, readers, kept, modules)
    return True


def _kept(forward, kept: dict, key, module, args, value) -> None:
    """A module's output hook: the first value for the reads, the last for the sidebar's shape."""
    if key not in kept:
        kept[key] = value
    else:                   # the module called again: the hint about `M.calls[k]`, once (calls.py)
        note_called_again(forward, key)
    forward.values[key] = value


def _saved(run, reads: tuple, readers: dict, kept: dict, modules: list | None = None) -> None:
    """What the statements do with their values, in the order the events came: saved, then bound (the rewritten
    `NAME = save(...)`). With `modules`, the model has returned: the first statement whose event never came says so."""
    forward, by_id, ns = run.forward, run.by_id, run.ns
    for key, value in kept.items():
        for index in readers[key]:
            if type(value) is not Tensor:
                note_type(forward, index, forward.uses[index], value)
            read = reads[index]
            by_id[id(value)] = (read[3], value, read[4])
            ns[read[0]] = value
            run.finished.add(index)
    if modules is None:
        return
    forward.model_running, forward.done, run.phase = False, True, AFTER_FORWARD
    if len(kept) < len(readers):                    # still waiting when the cell ends: the event never came
        index = min(index for key, indices in readers.items() if key not in kept for index in indices)
        raise never_ran(forward.uses[index], modules[index], run.model, late=False)
