"""`nbgrad.remote(...)` and `name=` (SPEC 3d): a model with a name makes a named, detached actor; `name=` alone
attaches to the actor another notebook made under that name, and says what to pass when there is none. Ray's
actor registry is stood in for by a dict of in-process actors (tests/inprocess.py); tests/test_remote.py attaches
across two processes on a real cluster."""
import importlib

import pytest
import torch

import nbgrad
from inprocess import InProcess
from nbgrad.remote.actor import ModelHolder

ray = pytest.importorskip("ray")
remote_package = importlib.import_module("nbgrad.remote")      # (nbgrad.remote is the function)
handle_module = importlib.import_module("nbgrad.remote.handle")
PROMPT = "The Eiffel Tower is in the city of"
MAKE = ("to make it, pass the model too: nbgrad.remote(\"gpt2\", name='shared') (a hub name or a path), "
        "nbgrad.remote(factory, name='shared') (a function that returns the model), or "
        "nbgrad.remote(nbgrad.load_model, name='shared') for the embedded default model")


class Cluster:
    """The named actors of a cluster, the actors made, and how often nbgrad connected to it."""

    def __init__(self, monkeypatch):
        self.named, self.made, self.connections = {}, [], 0
        monkeypatch.setattr(ray, "get", lambda answer: answer)
        monkeypatch.setattr(ray, "get_actor", self.get_actor)
        monkeypatch.setattr(remote_package, "connected", self.connect)
        monkeypatch.setattr(handle_module, "holder_class", lambda: self)

    def connect(self):
        self.connections += 1

    def get_actor(self, name, namespace=None):
        if (name, namespace) not in self.named:
            raise ValueError(f"Failed to look up actor with name '{name}'.")
        return self.named[(name, namespace)]

    def options(self, **options):        # holder_class().options(...).remote(build), as Ray's actor class
        self.made.append(options)
        return self

    def remote(self, build):
        actor = InProcess(ModelHolder(build))
        if "name" in self.made[-1]:
            self.named[(self.made[-1]["name"], self.made[-1]["namespace"])] = actor
        return actor


@pytest.fixture
def cluster(monkeypatch):
    return Cluster(monkeypatch)


def test_a_name_alone_attaches_to_the_model_another_notebook_made(cluster):
    maker = nbgrad.remote(nbgrad.load_model, name="shared", num_gpus=0)
    assert cluster.made == [{"num_gpus": 0, "name": "shared", "namespace": "nbgrad", "lifetime": "detached",
                             "get_if_exists": True}]
    maker.call(lambda model: setattr(model, "nbgrad_mark", 41))
    shared = nbgrad.remote(name="shared")
    assert len(cluster.made) == 1 and shared._actor is maker._actor and shared.call(lambda m: m.nbgrad_mark) == 41
    assert shared.where == f"actor 'shared', pid {shared.pid} on {shared.node}"
    there, here = {"big": shared}, {"big": nbgrad.load_model()}
    nbgrad.trace(shared, PROMPT, "h = big.transformer.h[1].output.save()\n", there)
    nbgrad.trace(here["big"], PROMPT, "h = big.transformer.h[1].output.save()\n", here)
    assert torch.equal(there["h"], here["h"])
    with pytest.raises(nbgrad.NbgradError) as caught:
        shared.restart()
    assert str(caught.value) == "this handle attached to a named model that another notebook made: restart it there"


def test_a_name_that_no_actor_has_says_what_to_pass_and_makes_nothing(cluster):
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.remote(name="shared")
    assert str(caught.value) == (
        "no remote model is named 'shared' on this cluster (Ray namespace 'nbgrad'): nbgrad.remote(name='shared') "
        f"attaches to one that another notebook made and that is still running; {MAKE}")
    assert cluster.made == [] and cluster.connections == 1


@pytest.mark.parametrize("options, given", [
    ({"num_gpus": 1}, "num_gpus"),
    ({"dtype": torch.float16, "resources": {"slot": 1}}, "resources, dtype"),
])
def test_options_of_making_a_model_given_to_a_name_alone_are_said(cluster, options, given):
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.remote(name="shared", **options)
    assert str(caught.value) == (
        "nbgrad.remote(name='shared') alone attaches to the model another notebook made under that name, whose "
        f"actor is made already: {given} apply only when a model is made; {MAKE}")
    assert cluster.made == [] and cluster.connections == 0


def test_without_a_name_the_actor_is_anonymous_and_without_a_model_it_holds_the_default(cluster):
    big = nbgrad.remote()
    assert cluster.made == [{}] and cluster.named == {} and big.where == f"actor pid {big.pid} on {big.node}"
    assert type(big.skeleton).__name__ == type(nbgrad.load_model()).__name__
