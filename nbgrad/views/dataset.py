"""The panel of a dataset run (`%%trace MODEL --over DATASET`): each saved name's values, one per example, stacked
on a new first axis where their shapes agree, so its heatmap has a row (or a slider step) per example. Only the
first examples are read (a run written to DIR loads its files on access)."""
from __future__ import annotations

import torch

from . import payload as build
from .gradients import gradient_targets_in_cell
from .panel import MAX_ITEMS, Panel, items_for

SHOWN_EXAMPLES = 64


def dataset_panel(saved: dict, title: str = "", tokenizer=None, skip=(), cell: str = "") -> Panel | None:
    """The panel of `saved` ({name: the values of the examples}), leaving out the names in `skip`; None when there
    is nothing to show. `cell` (the cell's text) tells which names hold gradients, badged so."""
    items = []
    gradients = gradient_targets_in_cell(cell, saved) if cell else {}
    for name, values in saved.items():
        kind, partner = ("gradient", gradients[name] or None) if name in gradients else ("activation", None)
        if name in skip or not len(values):
            continue
        count = len(values)
        first = [values[k] for k in range(min(count, SHOWN_EXAMPLES))]
        which = f"examples 0-{len(first) - 1} of {count}" if len(first) < count else f"{count} examples"
        tensors = all(isinstance(v, torch.Tensor) for v in first)
        if tensors and len({(v.shape, v.dtype) for v in first}) == 1:
            one_row = first[0].dim() > 1 and first[0].shape[0] == 1      # the example's row of the batch: joined
            stacked = (torch.cat if one_row else torch.stack)([v.detach() for v in first])
            items.append(build.tensor_item(name, stacked, tokenizer=tokenizer, kind=kind, partner=partner,
                                           note=f"one per example on axis 0: {which}"))
        else:               # values of different shapes (a sequence, padded per batch) or of other kinds
            why = "the values' shapes differ: " if tensors else ""
            items.extend(items_for(f"{name}[0]", first[0], tokenizer=tokenizer, kind=kind, partner=partner,
                                   note=f"example 0 of {count} ({why}{name}[k] is example k)"))
    if not items:
        return None
    notes = [f"showing {MAX_ITEMS} of {len(items)} values"] if len(items) > MAX_ITEMS else []
    return Panel(items[:MAX_ITEMS], title=title, notes=notes)
