"""What the cell magics do around a run: find MODEL in the notebook's names, show what a run left (the sidebar,
its panels) and explain a NameError for a name a trace bound but did not save. Plain functions of the shell and
its names: the magics (magics.py) parse their line and call these."""
from __future__ import annotations

import keyword

from ..engine.run.cellstate import unsaved_names
from ..errors import NbgradError
from ..errors.naming import a_or_an
from .provenance import footed


def model_named(namespace: dict, name: str):
    """The module the notebook calls `name` (MODEL of a magic's line), or an error saying what is wrong."""
    from torch import nn
    if not name.isidentifier() or keyword.iskeyword(name):
        raise NbgradError(f"unknown model '{name}': MODEL is the name of a module in the notebook, such as "
                          f"`model` after `model = nbgrad.load_model()`")
    if name not in namespace:
        raise NbgradError(f"unknown model '{name}': no such name in the notebook. Define it first, "
                          f"e.g. `{name} = nbgrad.load_model()`")
    model = namespace[name]
    if not isinstance(model, nn.Module) and not hasattr(model, "nbgrad_trace"):     # nbgrad.remote's handle
        raise NbgradError(f"'{name}' is {a_or_an(type(model).__name__)}, not a torch.nn.Module")
    return model


def show_result(shell, result, quiet: bool, model, title: str = "") -> None:
    """After a %%trace / %%backward cell: the sidebar learns of the run, and (unless quiet) its panels show."""
    from . import comm
    comm.after_cell(shell, model, result)
    if quiet or not result.saved and not result.leaf_grads:
        return
    from IPython.display import display
    from ..models import tokenizer_for
    from ..views import panel_for_result
    tokenizer = tokenizer_for(model) if model is not None else None
    result, caches = split_caches(result, tokenizer)
    if result.saved or result.leaf_grads:
        display(footed(panel_for_result(result, tokenizer, title), model, title))
    for panel in caches:
        display(footed(panel, model, title))


def split_caches(result, tokenizer=None) -> tuple:
    """(the result without its Caches, a panel for each Cache the cell bound): a Cache has a panel of its own."""
    from ..engine.results.cache import Cache
    from ..views.cache import CachePanel
    caches = {name: value for name, value in result.saved.items() if isinstance(value, Cache)}
    if not caches:
        return result, []
    rest = result.without(caches)
    ids, tokens = getattr(result, "input_ids", None), None
    if ids is not None and tokenizer is not None and len(result.invokes or ()) <= 1:
        tokens = [tokenizer.decode([int(i)]) for i in ids.reshape(-1, ids.shape[-1])[0]]
    return rest, [CachePanel(cache.summary(), title=name, tokens=tokens) for name, cache in caches.items()]


def explain_unsaved(shell, etype, value, tb, tb_offset=None):
    """A NameError for a name the last trace bound but did not save says to `.save()` it."""
    name = getattr(value, "name", None)
    kind = unsaved_names(shell.user_ns).get(name) if name else None
    if kind in ("dict", "list", "tuple", "set"):
        value.args = (f"name '{name}' is not defined: it was bound inside a %%trace cell to {a_or_an(kind)} that "
                      f"holds a traced value that was not saved. Save each value you keep in it "
                      f"(`{name}[...] = ....save()`), and the {kind} stays after the cell",)
    elif kind is not None:
        value.args = (f"name '{name}' is not defined: it was bound inside a %%trace cell to a traced value "
                      f"that was not saved. Add `.save()` (`{name} = ....save()`) to keep it after the cell",)
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
