"""The sidebar's comm always answers: lazy modules, modules that cannot be walked, a failing answer, and
error replies stay short whatever the message holds."""
import json

import torch
from torch import nn

from nbgrad.notebook import comm
from helpers import tiny_gpt2


class _Comm:
    """The part of an ipykernel comm that the handler uses."""

    def __init__(self):
        self.sent, self.on_message = [], None

    def send(self, data):
        self.sent.append(json.loads(json.dumps(data)))     # what goes over the wire is JSON

    def on_msg(self, callback):
        self.on_message = callback

    def on_close(self, callback):
        pass


class _Shell:
    def __init__(self, namespace):
        self.user_ns = namespace


def _through_the_handler(namespace, data=None):
    fake = _Comm()
    comm._open(_Shell(namespace), fake, {"content": {"data": {"request": "models"}}})
    fake.on_message({"content": {"data": data or {"request": "models", "id": 3}}})
    comm._comms.remove(fake)
    return fake.sent


def test_a_lazy_module_in_the_namespace_is_listed_with_the_others():
    lazy = nn.Sequential(nn.LazyLinear(4), nn.Linear(4, 2))
    model = tiny_gpt2()
    opened, reply = _through_the_handler({"lazy": lazy, "model": model})
    assert opened["reply"] == reply["reply"] == "models" and reply["id"] == 3
    trees = {tree["name"]: tree for tree in reply["models"]}
    assert trees["model"]["total"] == sum(p.numel() for p in model.parameters())
    first, second = trees["lazy"]["children"]
    assert first["type"] == "LazyLinear" and first["lazy"] is True and first["params"] == 0
    assert second["params"] == 4 * 2 + 2 and "lazy" not in second
    assert trees["lazy"]["total"] == 10
    lazy(torch.ones(1, 3))                     # the first call gives the lazy layer its shape
    tree = comm.answer({"request": "models"}, {"lazy": lazy})["models"][0]
    assert tree["total"] == 3 * 4 + 4 + 10 and "lazy" not in tree["children"][0]


class _Unwalkable(nn.Module):
    def named_children(self):
        raise RuntimeError("this module hides its children")


def test_a_module_that_cannot_be_walked_says_why_and_the_rest_is_listed():
    reply = comm.answer({"request": "models"}, {"odd": _Unwalkable(), "model": tiny_gpt2()})
    trees = {tree["name"]: tree for tree in reply["models"]}
    assert trees["odd"]["error"] == "RuntimeError: this module hides its children"
    assert trees["odd"]["type"] == "_Unwalkable" and trees["odd"]["children"] == []
    assert trees["model"]["type"] == "GPT2LMHeadModel" and trees["model"]["children"]


class _BrokenNamespace(dict):
    def items(self):
        raise KeyError("x" * 5000)


def test_a_failing_answer_still_gets_an_error_reply_from_the_handler():
    opened, reply = _through_the_handler(_BrokenNamespace(model=tiny_gpt2()))
    assert opened == reply
    assert set(reply) == {"error"} and reply["error"].startswith("nbgrad could not list the models: KeyError")
    assert len(reply["error"]) < 300


def test_an_error_reply_names_a_few_unknown_keys_only():
    message = {f"key{index:05d}" + "y" * 100: index for index in range(10_000)}
    message["request"] = "models"
    reply = comm.answer(message, {})
    assert set(reply) == {"error"} and len(reply["error"]) < 300
    shown = "key00000" + "y" * 32
    assert reply["error"].startswith(f"unknown keys: {shown}, ") and reply["error"].endswith(" and 9995 more")
    two = comm.answer({"request": "models", "b": 1, "a": 2}, {})
    assert two == {"error": "unknown keys: a, b"}


class _RaisesOnEveryAttribute:
    """An object in the namespace that raises on `__class__` (and any attribute), as some proxies do."""

    def __getattribute__(self, name):
        raise RuntimeError(f"no {name} here")


def test_an_object_that_raises_on_its_class_is_skipped_and_the_others_listed():
    namespace = {"odd": _RaisesOnEveryAttribute(), "model": tiny_gpt2()}
    reply = comm.answer({"request": "models"}, namespace)
    assert "error" not in reply
    assert [entry["name"] for entry in reply["models"]] == ["model"]
