"""`nbgrad.remote`'s two halves joined in this process, without a cluster: a `ModelHolder` (the actor's side)
behind an object that answers as a Ray actor handle does, so a `RemoteModel` (the notebook's side) talks to it
through its methods, the bytes that Ray would carry included."""
import nbgrad
from nbgrad.remote.actor import ModelHolder
from nbgrad.remote.handle import RemoteModel


class Method:
    def __init__(self, function):
        self.function = function

    def remote(self, *args):
        return self.function(*args)


class InProcess:
    """The holder's methods as an actor handle's: `holder.run.remote(request)` is the answer itself."""

    def __init__(self, holder):
        self.holder = holder

    def __getattr__(self, name):
        return Method(getattr(self.holder, name))


def in_process_handle(monkeypatch, build, **actor_options) -> RemoteModel:
    """A handle on a holder of `build()`'s model in this process (`ray.get` patched to give the answer as it is)."""
    import ray
    monkeypatch.setattr(ray, "get", lambda answer: answer)
    return RemoteModel(build, actor_options, actor=InProcess(ModelHolder(build)))


class Counted(InProcess):
    """The in-process actor, counting what the notebook asks of it."""

    def __init__(self, holder):
        super().__init__(holder)
        self.calls = []

    def __getattr__(self, name):
        self.calls.append(name)
        return super().__getattr__(name)


def counted_handle(monkeypatch) -> tuple:
    """(handle, actor): the embedded model on a Counted actor, its calls counted from after the handle is made."""
    import ray
    monkeypatch.setattr(ray, "get", lambda answer: answer)
    actor = Counted(ModelHolder(nbgrad.load_model))
    handle = RemoteModel(nbgrad.load_model, {}, actor=actor)
    actor.calls.clear()                 # describe(), which made the skeleton
    return handle, actor


def one_read_traffic(big, prompt: str) -> tuple:
    """(the cell's stats, bytes moved, the least it could move) for a one-read cell on a remote model: its saved
    value's bytes and its text."""
    source = "h = big.transformer.h[1].output.save()\n"
    namespace = {"big": big}
    nbgrad.trace(big, prompt, source, namespace)
    cell = big.stats()[-1]
    moved = cell["sent"] + cell["received"]
    least = namespace["h"].numel() * namespace["h"].element_size() + len(source.encode())
    return cell, moved, least
