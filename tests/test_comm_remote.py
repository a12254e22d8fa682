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


SHAPED_CELL = ("h = big.transformer.h[1].output.save()\np = big.transformer.h[0].attn.source.attention_interface_1.output.save()\n"
               "with big.lm_head.output[0, -1].max().backward():\n    g = big.transformer.h[0].output.grad.save()\n")


def shapes_of(entry) -> dict:
    return {path: (node["output"], node["grad"]) for path, node in by_path(entry).items()}


def test_after_a_remote_cell_the_sidebar_shows_the_shapes_the_same_local_cell_shows(monkeypatch, shell):
    big = in_process_handle(monkeypatch, nbgrad.load_model)
    [before] = models({"big": big})
    assert all(shapes == (None, None) for shapes in shapes_of(before).values())     # no cell ran: none
    shell.user_ns["big"] = big
    shell.run_cell(f'%%trace big "The Eiffel Tower is in the city of" -q\n{SHAPED_CELL}', store_history=False)
    [there] = models({"big": big})
    local = nbgrad.load_model()
    shell.user_ns["big"] = local
    shell.run_cell(f'%%trace big "The Eiffel Tower is in the city of" -q\n{SHAPED_CELL}', store_history=False)
    [here] = models({"big": local})
    shell.user_ns.pop("big")
    assert shapes_of(there) == shapes_of(here)
    tokens = shell.user_ns["h"].shape[1]
    assert shapes_of(there)["big.transformer.h[1]"][0] == [1, tokens, 128]
    assert shapes_of(there)["big.transformer.h[0]"] == ([1, tokens, 128], [1, tokens, 128])
    assert sum(output is not None for output, _ in shapes_of(there).values()) >= 3
    json.dumps(there)
    big._actor = NoActor()          # the sidebar's later answers ask the actor nothing
    monkeypatch.setattr(ray, "get", asked)
    assert shapes_of(models({"big": big})[0]) == shapes_of(here)


def test_the_sites_of_a_remote_models_module_are_listed_from_the_skeleton(monkeypatch):
    big = in_process_handle(monkeypatch, nbgrad.load_model)
    local = nbgrad.load_model()
    big._actor = NoActor()
    monkeypatch.setattr(ray, "get", asked)
    there = comm.answer({"request": "sites", "path": "big.transformer.h[0].attn", "id": 3}, {"big": big})
    here = comm.answer({"request": "sites", "path": "big.transformer.h[0].attn", "id": 3}, {"big": local})
    assert there == here and "attention_interface_1" in there["sites"] and "error" not in there
    missing = comm.answer({"request": "sites", "path": "big.transformer.h[9]"}, {"big": big})
    assert missing["error"] == "ModuleList has no submodule '9'" and missing["sites"] == []
    assert comm.answer({"request": "sites", "path": "odd.attn"}, {"odd": Marked(object())})["error"] == \
        "no model named 'odd' in the kernel"
