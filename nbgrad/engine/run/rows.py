"""Invokes are a view, not a second engine: the model runs one batch, and a statement inside
`with invoke(...)` sees that invoke's rows of every value. Row views share the batch's storage, so
in-place edits land in the batch; an assignment replaces the rows in a copy of the batch value."""
from __future__ import annotations

import torch

from ...errors import OrderError
from .skips import PARTIAL, skipped_for_invoke


class InvokeRows:
    """Rows [start, stop) of the batch per invoke, and the row views handed out (to map `.grad` back)."""

    def __init__(self, spans: list, batch_size: int):
        self.spans = spans
        self.batch_size = batch_size
        self._bases: dict = {}           # id(row view) -> (view, batch tensor it was cut from, invoke)

    def _batched(self, value) -> bool:
        return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == self.batch_size

    def view(self, value, invoke: int):
        """The invoke's rows of a module's value: tensors with the batch on axis 0, inside tuples, lists,
        dicts and ModelOutputs too. Anything else as it is."""
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == self.batch_size:  # _batched,
            start, stop = self.spans[invoke]                  # inline: this runs at every read in an invoke
            rows = value.narrow(0, start, stop - start)      # value[start:stop], without parsing an index
            self._bases[id(rows)] = (rows, value, invoke)
            return rows
        if isinstance(value, (tuple, list)):
            return type(value)(self.view(v, invoke) for v in value) if type(value) in (tuple, list) else value
        if isinstance(value, dict):
            return rebuilt(value, {k: self.view(v, invoke) for k, v in value.items()})
        return value

    def replace(self, batch_value, invoke: int, new):
        """The batch value with the invoke's rows replaced by `new` (broadcast as in `x[rows] = new`)."""
        if self._batched(batch_value):
            start, stop = self.spans[invoke]
            out = batch_value.clone()
            out[start:stop] = new
            return out
        if type(batch_value) in (tuple, list) and isinstance(new, (tuple, list)) and len(new) == len(batch_value):
            return type(batch_value)(self.replace(b, invoke, n) for b, n in zip(batch_value, new))
        if isinstance(batch_value, dict) and isinstance(new, dict):
            return rebuilt(batch_value, {k: self.replace(v, invoke, new.get(k, v)) for k, v in batch_value.items()})
        return new

    def grad_target(self, tensor, invoke: int | None) -> tuple:
        """(tensor whose gradient to hook, invoke whose rows to hand back or None) for `T.grad`: a row view
        handed out earlier stands for its rows of the batch tensor, wherever the `.grad` is read."""
        known = self._bases.get(id(tensor))
        if known is not None and known[0] is tensor:
            return known[1], known[2]
        if invoke is not None and self._batched(tensor):
            return tensor, invoke
        return tensor, None

    def base_of(self, tensor):
        known = self._bases.get(id(tensor))
        return known[1] if known is not None and known[0] is tensor else tensor

    def clear(self) -> None:
        self._bases.clear()


def rebuilt(original: dict, items: dict):
    """A dict (or ModelOutput) of the same class with new items."""
    try:
        return type(original)(**items) if type(original) is not dict else items
    except TypeError:
        return items


def rows_of(rows: InvokeRows, module, value, use, invoke: int):
    """An invoke's rows of an event's value; an error where the invoke skipped a module around it."""
    if PARTIAL and (skipped := skipped_for_invoke(module, invoke)) is not None:
        raise OrderError(f"{use.target}.{use.kind} never came for this invoke: it skipped "
                         f"{type(skipped).__name__} (`.skip(...)`), so nothing inside it ran at its rows "
                         f"(it ran for the other invokes' rows)", use.line)
    return rows.view(value, invoke)
