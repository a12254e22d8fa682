"""A remote model (`nbgrad.remote`'s handle) in the sidebar: listed under its name with the "remote" mark and where it
lives, its tree (canonical names included) drawn from the notebook's skeleton without asking the actor. The handle
here talks to a holder in this process (tests/inprocess.py); tests/test_remote.py lists a real actor's."""
import json

import pytest
from torch import nn

import nbgrad
from inprocess import in_process_handle
from nbgrad.notebook import comm

ray = pytest.importorskip("ray")


class NoActor:
    """An actor handle that fails the test if anything is asked of it."""

    def __getattr__(self, name):
        raise AssertionError(f"the sidebar asked the actor for {name!r}")


def asked(*args):
    raise AssertionError("the sidebar waited for an answer from the cluster")


def by_path(tree, found=None):
    found = {} if found is None else found
    found[tree["path"]] = tree
    for child in tree["children"]:
        by_path(child, found)
    return found


def models(namespace):
    reply = comm.answer({"request": "models"}, namespace)
    json.dumps(reply)
    return reply["models"]


def test_a_remote_model_is_listed_with_its_mark_and_tree_without_a_round_trip(monkeypatch):
    big = in_process_handle(monkeypatch, nbgrad.load_model)
    local = nbgrad.load_model()
    big._actor = NoActor()
    monkeypatch.setattr(ray, "get", asked)
    [entry] = models({"big": big, "x": 3})
    assert entry["name"] == "big" and entry["remote"] is True and entry["type"] == "GPT2LMHeadModel"
    assert entry["where"] == f"actor pid {big.pid} on {big.node}" and big.node
    assert entry["total"] == sum(p.numel() for p in local.parameters())      # counted on the skeleton (meta)
    [here] = models({"big": local})
    assert "remote" not in here and "where" not in here

    assert list(by_path(entry)) == list(by_path(here))
    block = by_path(entry)["big.transformer.h[1]"]
    assert block["canonical"] == "big.layers[1]"
    assert block["values"] == ["resid_pre", "resid_mid", "resid_post"] and entry["family"] == "gpt2"


def test_a_named_remote_model_says_its_actors_name(monkeypatch):
    big = in_process_handle(monkeypatch, nbgrad.load_model, name="shared")
    assert models({"big": big})[0]["where"] == f"actor 'shared', pid {big.pid} on {big.node}"


class Marked:
    """Objects that say they are remote models, but are not quite."""
    nbgrad_remote = True

    def __init__(self, skeleton):
        self.skeleton = skeleton

    @property
    def where(self):
        raise RuntimeError("no actor")


def test_a_marked_object_without_a_module_skeleton_is_no_model_and_a_missing_where_is_none():
    listed = models({"odd": Marked(object()), "net": Marked(nn.Linear(2, 2))})
    assert [(entry["name"], entry["remote"], entry["where"]) for entry in listed] == [("net", True, None)]
