"""DATASET -> batches of INPUTs, read as the run goes: a list, any iterable (never materialised whole), or a
`datasets.Dataset` (its `text` column, or the one `--column` names)."""
from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch

from ..errors import ArgumentError, InputError
from ..errors.naming import a_or_an

DEFAULT_COLUMN = "text"


def batches(dataset, batch_size: int, column: str | None = None):
    """(index of the first example, [INPUT, ...]) per batch of `batch_size` examples, in dataset order. A
    dataset that gives no example is an error: the cell would run on none and leave every name as it was."""
    empty = True
    for batch in _batches(dataset, batch_size, column):
        empty = False
        yield batch
    if empty:
        raise InputError(f"--over: the dataset ({a_or_an(type(dataset).__name__)}) has no examples, so the cell ran "
                         f"on none and no name changed")


def _batches(dataset, batch_size: int, column: str | None):
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"--batch-size must be a positive integer, not {batch_size!r}")
    if _is_hf_dataset(dataset):
        yield from _dataset_batches(dataset, batch_size, column)
        return
    if column is not None:
        raise ArgumentError("--column names a column of a datasets.Dataset; DATASET here is "
                            f"{a_or_an(type(dataset).__name__)}")
    if isinstance(dataset, (str, bytes)) or not _iterable(dataset):
        raise InputError(f"--over takes a list of prompts, an iterable of INPUTs or a datasets.Dataset, not "
                         f"{a_or_an(type(dataset).__name__)}; for one prompt, give it as INPUT without --over")
    _refuse_ambiguous(dataset)
    examples, start = map(_one_example, dataset), 0
    while True:
        chunk = list(itertools.islice(examples, batch_size))
        if not chunk:
            return
        yield start, chunk
        start += len(chunk)


def _refuse_ambiguous(dataset) -> None:
    """A dict iterates over its keys, a 1-D tensor over single numbers: neither is what a user means by examples."""
    if isinstance(dataset, Mapping):
        raise InputError("--over a dict would run the cell over its keys: write `--over list(DATASET.values())` to "
                         "run it over the values (or `--over list(DATASET)` over the keys)")
    if isinstance(dataset, torch.Tensor) and dataset.dim() < 2:
        raise InputError(f"--over a tensor runs the cell once per row (each row one example's ids); this one has "
                         f"shape {list(dataset.shape)}: give a 1-D tensor of ids as INPUT, without --over (or "
                         f"--over [ids] for a dataset of one example)")


def _one_example(value):
    """A 1-D tensor (a row of a 2-D tensor of ids, or one example's ids) is one example: a batch of one row."""
    return value.unsqueeze(0) if isinstance(value, torch.Tensor) and value.dim() == 1 else value


def total(dataset) -> int | None:
    """How many examples, when the dataset knows (a progress bar without a total counts all the same)."""
    try:
        return len(dataset)
    except TypeError:
        return None


def describe(example, width: int = 80) -> str:
    text = repr(example)
    return text if len(text) <= width else text[:width - 3] + "..."


def _iterable(value) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _is_hf_dataset(value) -> bool:
    return type(value).__module__.startswith("datasets.") and hasattr(value, "column_names")


def _dataset_batches(dataset, batch_size: int, column: str | None):
    column = column or DEFAULT_COLUMN
    names = getattr(dataset, "column_names", None)      # None: a streamed dataset that does not know yet
    if names is not None and column not in names:
        raise InputError(f"the dataset has no column {column!r} (its columns: {', '.join(map(str, names))}); "
                         f"name the one with the INPUTs with --column NAME")
    start = 0
    for chunk in dataset.iter(batch_size=batch_size):     # streams an IterableDataset too
        values = list(chunk[column])
        yield start, values
        start += len(values)
