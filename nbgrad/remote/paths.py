"""What names the remote model and its modules when a cell's names are sent: on the actor, the model is MODEL, a
module a ModulePath and a tensor it kept a Kept; in the notebook, a module reached from the handle is a RemotePath."""
from __future__ import annotations

from torch import nn


MODEL = "__nbgrad_remote_model__"


class ModulePath:
    """A module of the remote model, sent by its path in `named_modules()`."""

    def __init__(self, path: str):
        self.path = path


class Kept:
    """A tensor the actor kept with its autograd graph (the notebook holds a copy without it), sent by its number."""

    def __init__(self, number: int):
        self.number = number


class RemotePath:
    """A module of the remote model, reached from the handle: its children by name or index, its tensors read
    from the actor."""

    def __init__(self, handle, path: str, module: nn.Module):     # handle: the RemoteModel
        self._handle, self._path, self._module = handle, path, module

    @property
    def nbgrad_skeleton(self) -> nn.Module:
        """The skeleton's module this one stands for (what `%source` and the sidebar read, without the actor)."""
        return self._module

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(self._module, name)
        if isinstance(value, nn.Module):
            return RemotePath(self._handle, self._child(name), value)
        if name in self._module._parameters or name in self._module._buffers:
            return self._handle.read(self._child(name))
        return value

    def __getitem__(self, index):
        child = self._module[index]
        name = next(n for n, m in self._module.named_children() if m is child)
        return RemotePath(self._handle, self._child(name), child)

    def __len__(self):
        return len(self._module)

    def __iter__(self):
        return (RemotePath(self._handle, self._child(name), child) for name, child in self._module.named_children())

    def _child(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name

    def __repr__(self):
        return f"remote {self._path or 'model'}: {self._module!r}"
