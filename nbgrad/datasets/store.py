"""`--out DIR`: each finished batch's saved values in a safetensors file of its own, and an index.

    DIR/index.json                   the cell, the batch size, every finished batch (with a digest of its
                                     examples) and the names saved
    DIR/batch-00000016.safetensors   the batch that starts at example 16: tensor `name/k/path` is example
                                     16+k's value of `name` (a path inside a list / dict value); the file's
                                     metadata holds the shape of each value (which keys, which plain values)

A file is written to a temporary name and moved into place with `os.replace`, and the index after it, so
a batch is either whole in DIR or absent: a run stopped anywhere leaves DIR readable and resumable.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file, safe_open

from ..engine.run.cache import Cache, Calls, same_elements
from ..errors import ArgumentError, NbgradError
from ..errors.naming import a_or_an

INDEX = "index.json"
CACHE_PARTS = ("outputs", "inputs", "grads")      # what a Cache holds, each a dict by module path


class Store:
    """The batches a run over a dataset has written to DIR."""

    def __init__(self, folder, source: str, batch_size: int):
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise ArgumentError(f"--out {folder} is a file, not a folder: give a folder (made if missing), where each "
                                f"batch's values are written")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ArgumentError(f"--out {folder}: the folder cannot be made ({error.strerror or error})") from error
        self.cell = hashlib.sha256(source.strip().encode()).hexdigest()[:16]
        self.batch_size = batch_size
        self.digests_asked: dict = {}    # start -> digest of the examples `has` was asked about, for `write`
        index = self._read_index()
        if index and (index["cell"], index["batch_size"]) != (self.cell, batch_size):
            raise NbgradError(f"--out {folder} holds the values of another cell or another --batch-size "
                              f"({index['batch_size']}): give a new DIR, or delete this one to start again")
        self.batches = {int(start): count for start, count in (index or {}).get("batches", {}).items()}
        self.digests = {int(start): digest for start, digest in (index or {}).get("examples", {}).items()}
        self.names = list((index or {}).get("names", []))

    def has(self, start: int, examples: list) -> bool:
        """Does DIR hold the batch of these examples that starts at `start`? One computed from other examples
        is an error: the run would hand back another dataset's values as this one's. A batch of another size
        (a run over fewer examples ended there) is computed again."""
        digest = self.digests_asked[start] = examples_digest(examples)
        if self.batches.get(start) != len(examples) or not self._file(start).exists():
            return False
        held = self.digests.get(start)
        if held is not None and held != digest:
            raise NbgradError(f"--out {self.folder} holds the values of other examples: the batch of examples "
                              f"{start}-{start + len(examples) - 1} was computed from other INPUTs than this run's "
                              f"(another dataset, or one that changed). Give a new DIR, or delete this one to start "
                              f"again")
        return True

    def write(self, start: int, per_example: list) -> None:
        tensors, layout = {}, []
        for k, values in enumerate(per_example):
            layout.append({name: _flatten(value, f"{name}/{k}", tensors) for name, value in values.items()})
            for name in values:
                if name not in self.names:
                    self.names.append(name)
        tensors, aliases = _unshared(tensors)
        _atomic(self._file(start), lambda path: save_file(tensors, str(path), metadata={
            "layout": json.dumps(layout), "aliases": json.dumps(aliases)}))
        self.batches[start] = len(per_example)
        if start in self.digests_asked:
            self.digests[start] = self.digests_asked.pop(start)
        index = {"cell": self.cell, "batch_size": self.batch_size, "names": self.names,
                 "batches": {str(s): c for s, c in sorted(self.batches.items())},
                 "examples": {str(s): d for s, d in sorted(self.digests.items())}}
        _atomic(self.folder / INDEX, lambda path: path.write_text(json.dumps(index, indent=1)))

    def lists(self, count: int) -> dict:
        """Each saved name as a list over the first `count` examples that loads a batch's file on access."""
        return {name: StoredList(self, name, count) for name in self.names}

    def load(self, start: int) -> list:
        """[{name: value} per example] of the batch that starts at `start`."""
        path = self._file(start)
        with safe_open(str(path), framework="pt") as handle:      # one opening: the layout and the tensors
            metadata = handle.metadata()
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        for alias, key in json.loads(metadata.get("aliases", "{}")).items():
            tensors[alias] = tensors[key]
        layout = json.loads(metadata["layout"])
        return [{name: _unflatten(shape, tensors) for name, shape in values.items()} for values in layout]

    def _file(self, start: int) -> Path:
        return self.folder / f"batch-{start:08d}.safetensors"

    def _read_index(self):
        path = self.folder / INDEX
        return json.loads(path.read_text()) if path.exists() else None


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


def _unshared(tensors: dict) -> tuple:
    """(tensors, {key: the key of the same tensor}) as a file holds them: one tensor kept once (a cache holds a
    module's output again as the next one's input), and views into one another's memory copied out (safetensors
    writes each tensor's own bytes)."""
    kept, aliases, first, storages = {}, {}, {}, {}
    for key, tensor in tensors.items():
        same = same_elements(tensor)
        if same in first:
            aliases[key] = first[same]
            continue
        first[same] = key
        kept[key] = tensor
        storages.setdefault(same[0], []).append(key)
    for keys in storages.values():
        for key in keys:
            kept[key] = kept[key].clone() if len(keys) > 1 else kept[key].contiguous()
    return kept, aliases


def _atomic(path: Path, write) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _flatten(value, key: str, tensors: dict, in_cache: bool = False):
    """The value's shape for the metadata, its tensors put in `tensors` under paths from `key`. Inside a Cache or a
    model's output (a ModelOutput, kept with its class), what is no tensor, container or plain value (the model's
    key-value cache object) is left out."""
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach().cpu()
        return {"tensor": key}
    if isinstance(value, Cache):
        parts = {part: _flatten(dict(getattr(value, "_" + part)), f"{key}/{part}", tensors, True)
                 for part in CACHE_PARTS}
        return {"cache": {"options": {name: bool(value.options.get(name)) for name in ("inputs", "grads")}, **parts}}
    if isinstance(value, (list, tuple)):
        kind = "calls" if isinstance(value, Calls) else "list" if isinstance(value, list) else "tuple"   # a named one too
        return {kind: [_flatten(v, f"{key}/{i}", tensors, in_cache) for i, v in enumerate(value)]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        output = _model_output_class(type(value))
        items = {k: _flatten(v, f"{key}/{k}", tensors, in_cache or output is not None) for k, v in value.items()}
        return {"dict": items, "class": output} if output else {"dict": items}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"plain": value}
    if in_cache:
        return {"omitted": type(value).__name__}
    raise NbgradError(f"--out writes tensors (and lists / dicts of them, numbers, strings, caches); "
                      f"{key.split('/')[0]} holds {a_or_an(type(value).__name__)}")


def _unflatten(shape: dict, tensors: dict):
    kind, content = next(iter(shape.items()))
    if kind == "tensor":
        return tensors[content]
    if kind in ("list", "tuple", "calls"):
        values = [_unflatten(v, tensors) for v in content]
        return values if kind == "list" else tuple(values) if kind == "tuple" else Calls(values)
    if kind == "dict":
        items = {k: _unflatten(v, tensors) for k, v in content.items()}
        return _model_output(shape["class"], items) if "class" in shape else items
    if kind == "cache":
        cache = Cache(content["options"])
        for part in CACHE_PARTS:
            setattr(cache, "_" + part, _unflatten(content[part], tensors))
        return cache
    return None if kind == "omitted" else content


def _model_output_class(cls: type) -> str | None:
    """`module:name` of a transformers ModelOutput class (what `_model_output` makes again); None for any other."""
    from transformers.utils import ModelOutput
    return f"{cls.__module__}:{cls.__qualname__}" if issubclass(cls, ModelOutput) else None


def _model_output(name: str, items: dict):
    """The ModelOutput `name` (`_model_output_class`) with `items`, read from a file: only a ModelOutput class of
    transformers is made, never whatever a file names; the items as a dict where that class is gone."""
    import importlib
    from transformers.utils import ModelOutput
    module, _, qualname = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module), qualname) if module.startswith("transformers.") else None
        return cls(**items) if isinstance(cls, type) and issubclass(cls, ModelOutput) else items
    except (ImportError, AttributeError, TypeError):
        return items
