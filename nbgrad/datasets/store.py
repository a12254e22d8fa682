"""`--out DIR`: each finished batch's saved values in a safetensors file of its own, and an index.

    DIR/index.json                   the cell, the batch size, every finished batch (with a digest of its
                                     examples, and its file's size and SHA-256) and the names saved
    DIR/batch-00000016.safetensors   the batch that starts at example 16: tensor `name/k/path` is example
                                     16+k's value of `name` (a path inside a list / dict value); the file's
                                     metadata holds the shape of each value (which keys, which plain values)

A file is written to a temporary name and moved into place with `os.replace`, and the index after it, so
a batch is either whole in DIR or absent: a run stopped anywhere leaves DIR readable and resumable. Every
file is checked against the index before it is used (folder.py): on resume a damaged batch is computed
again; on load the error names the file.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import torch
from safetensors.torch import load as load_tensors, save as save_tensors

from ..errors import NbgradError
from . import folder as checked
from .layout import flatten, unflatten, unshared


class Store:
    """The batches a run over a dataset has written to DIR."""

    def __init__(self, folder, source: str, batch_size: int):
        self.folder = checked.out_folder(folder)
        checked.prepare(self.folder, folder)
        self.cell = hashlib.sha256(source.strip().encode()).hexdigest()[:16]
        self.batch_size = batch_size
        self.digests_asked: dict = {}    # start -> digest of the examples `has` was asked about, for `write`
        index = checked.read_index(self.folder) or {}
        if index and (index["cell"], index["batch_size"]) != (self.cell, batch_size):
            raise NbgradError(f"--out {folder} holds the values of another cell or another --batch-size "
                              f"({index['batch_size']}): give a new DIR, or delete this one to start again")
        self.batches = {int(start): count for start, count in index.get("batches", {}).items()}
        self.digests = {int(start): digest for start, digest in index.get("examples", {}).items()}
        self.files = {int(start): held for start, held in index.get("files", {}).items()}
        self.names = list(index.get("names", []))

    def has(self, start: int, examples: list) -> bool:
        """Does DIR hold the batch of these examples that starts at `start`, whole? One computed from other
        examples is an error: the run would hand back another dataset's values as this one's. A batch of
        another size (a run over fewer examples ended there), or whose file is damaged, is computed again."""
        digest = self.digests_asked[start] = examples_digest(examples)
        if self.batches.get(start) != len(examples):
            return False
        held = self.digests.get(start)
        if held is not None and held != digest:
            raise NbgradError(f"--out {self.folder} holds the values of other examples: the batch of examples "
                              f"{start}-{start + len(examples) - 1} was computed from other INPUTs than this run's "
                              f"(another dataset, or one that changed). Give a new DIR, or delete this one to start "
                              f"again")
        path = self._file(start)
        if path.is_dir():
            raise NbgradError(f"{path} is a folder where the batch of examples {start}-{start + len(examples) - 1} "
                              f"belongs: move or delete it, and run the cell again")
        return checked.file_problem(path, self.files.get(start)) is None

    def write(self, start: int, per_example: list) -> None:
        tensors, layout = {}, []
        for k, values in enumerate(per_example):
            layout.append({name: flatten(value, f"{name}/{k}", tensors) for name, value in values.items()})
            for name in values:
                if name not in self.names:
                    self.names.append(name)
        tensors, aliases = unshared(tensors)
        data = save_tensors(tensors, metadata={"layout": json.dumps(layout), "aliases": json.dumps(aliases)})
        checked.write_atomic(self._file(start), data)
        self.batches[start] = len(per_example)
        self.files[start] = checked.record(data)
        if start in self.digests_asked:
            self.digests[start] = self.digests_asked.pop(start)
        checked.write_index(self.folder, {
            "cell": self.cell, "batch_size": self.batch_size, "names": self.names,
            "batches": {str(s): c for s, c in sorted(self.batches.items())},
            "examples": {str(s): d for s, d in sorted(self.digests.items())},
            "files": {str(s): f for s, f in sorted(self.files.items())}})

    def lists(self, count: int) -> dict:
        """Each saved name as a list over the first `count` examples that loads a batch's file on access."""
        return {name: StoredList(self, name, count) for name in self.names}

    def load(self, start: int) -> list:
        """[{name: value} per example] of the batch that starts at `start`, once its file is found whole."""
        path = self._file(start)
        try:
            data = path.read_bytes()
        except OSError:
            data = None                 # file_problem says why
        problem = checked.file_problem(path, self.files.get(start), data)
        if problem:
            raise NbgradError(f"{path} cannot be read: {problem}. Run the same cell with the same --out DIR again: "
                              f"it computes this batch again (or `nbgrad.datasets.verify(DIR)` lists every such file)")
        tensors = load_tensors(data)
        metadata = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]
        for alias, key in json.loads(metadata.get("aliases", "{}")).items():
            tensors[alias] = tensors[key]
        layout = json.loads(metadata["layout"])
        return [{name: unflatten(shape, tensors) for name, shape in values.items()} for values in layout]

    def _file(self, start: int):
        return checked.batch_file(self.folder, start)


class StoredList:
    """A read-only list of one saved name over the dataset, loading one batch's file at a time."""

    def __init__(self, store: Store, name: str, count: int):
        self.store, self.name, self.count = store, name, count
        self._loaded = (None, None)      # (start, that batch's values): the last file read

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(f"{self.name}[{index}]: the run has {self.count} examples")
        start = index - index % self.store.batch_size
        if self._loaded[0] != start:
            self._loaded = (start, self.store.load(start))
        return self._loaded[1][index - start].get(self.name)

    def __iter__(self):
        return (self[i] for i in range(self.count))

    def __repr__(self) -> str:
        return f"<{self.count} values of {self.name!r} in {self.store.folder}, loaded on access>"


def examples_digest(examples: list) -> str:
    """A short digest of a batch's INPUTs (texts, tensors, dicts of them, images, anything with a stable repr)."""
    hasher = hashlib.sha256()
    for example in examples:
        _feed(hasher, example)
    return hasher.hexdigest()[:16]


def _feed(hasher, value) -> None:
    hasher.update(type(value).__name__.encode() + b"\0")
    if isinstance(value, str):
        hasher.update(value.encode())
    elif isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous()
        hasher.update(f"{value.dtype}{tuple(value.shape)}".encode())
        hasher.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            hasher.update(str(key).encode() + b"\0")
            _feed(hasher, value[key])
    elif isinstance(value, (list, tuple)):
        for element in value:
            _feed(hasher, element)
    elif hasattr(value, "tobytes") and hasattr(value, "size"):       # a PIL image
        hasher.update(f"{value.size}{getattr(value, 'mode', '')}".encode() + value.tobytes())
    else:
        hasher.update(repr(value).encode())
    hasher.update(b"\1")


