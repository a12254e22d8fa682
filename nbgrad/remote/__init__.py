"""`nbgrad.remote(...)`: a model held by a Ray actor, and the same cells run on it (SPEC 3d)."""
from __future__ import annotations

from ..engine.checks import remote_options
from ..errors import NbgradError
from ..datasets.cluster import connected, start_cluster
from ..datasets.waiting import off_main
from .handle import RemoteModel
from .paths import RemotePath
from .scan import Scan, TensorSpec, scan

__all__ = ["remote", "RemoteModel", "RemotePath", "Scan", "TensorSpec", "scan", "start_cluster"]

# Named actors live in this Ray namespace, so that another notebook (another Ray job, whose own namespace is a new
# anonymous one) finds them by name
NAMESPACE = "nbgrad"


def remote(name_or_factory=None, *, num_gpus=None, resources=None, runtime_env=None, name=None,
           **load_kwargs) -> RemoteModel:
    """A handle for a model held by one Ray actor: a hub name or path (None: the embedded default) is loaded
    there with `nbgrad.load_model(name, **load_kwargs)`, a function is called there and returns the model.
    `name=` makes the actor named and detached; `nbgrad.remote(name=...)` alone attaches to the model that
    another notebook made under that name (an error when there is none: it says what to pass to make it)."""
    remote_options(name, num_gpus, resources, runtime_env)
    options = {key: value for key, value in (("num_gpus", num_gpus), ("resources", resources),
                                             ("runtime_env", runtime_env)) if value is not None}
    if name_or_factory is None and name is not None:
        return _attached(name, sorted(options) + sorted(load_kwargs))
    connected()
    build = _builder(name_or_factory, load_kwargs)
    if name is not None:
        options.update(name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True)
    return RemoteModel(build, options)


def _attached(name: str, given: list) -> RemoteModel:
    """`nbgrad.remote(name=...)`: a handle on the named actor another notebook made."""
    import ray
    make = (f"to make it, pass the model too: nbgrad.remote(\"gpt2\", name={name!r}) (a hub name or a path), "
            f"nbgrad.remote(factory, name={name!r}) (a function that returns the model), or "
            f"nbgrad.remote(nbgrad.load_model, name={name!r}) for the embedded default model")
    if given:
        raise NbgradError(f"nbgrad.remote(name={name!r}) alone attaches to the model another notebook made under "
                          f"that name, whose actor is made already: {', '.join(given)} apply only when a model is "
                          f"made; {make}")
    connected()
    try:
        actor = off_main(ray.get_actor, name, NAMESPACE)
    except ValueError:
        raise NbgradError(f"no remote model is named {name!r} on this cluster (Ray namespace {NAMESPACE!r}): "
                          f"nbgrad.remote(name={name!r}) attaches to one that another notebook made and that is "
                          f"still running; {make}") from None
    return RemoteModel(None, {"name": name}, actor=actor)


def _builder(name_or_factory, load_kwargs: dict):
    from ..datasets.ray_engine import _LoadModel
    if callable(name_or_factory):
        if load_kwargs:
            raise NbgradError(f"nbgrad.remote(factory, ...) calls the factory with no arguments; the keywords "
                              f"{sorted(load_kwargs)} are for a model name (nbgrad.load_model's)")
        from .shipping import picklable
        picklable("the factory", name_or_factory)
        return name_or_factory
    if name_or_factory is not None and not isinstance(name_or_factory, str):
        raise NbgradError(f"nbgrad.remote takes a model name or path, or a function that returns the model, not "
                          f"{type(name_or_factory).__name__}")
    return _LoadModel(name_or_factory, load_kwargs)
