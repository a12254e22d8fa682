"""`nbgrad.remote`'s two halves joined in this process, without a cluster: the handle (notebook side) talks to a
`ModelHolder` (actor side) through its methods, the bytes that Ray would carry included. Every cell form gives
what the same cell gives on a local copy, bit for bit. (tests/test_remote.py runs the same on a Ray actor.)"""
import pytest
import torch

import nbgrad
from inprocess import InProcess, in_process_handle
from nbgrad.remote.actor import ModelHolder
from nbgrad.remote.handle import RemoteModel

ray = pytest.importorskip("ray")
PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture
def big(monkeypatch):
    return in_process_handle(monkeypatch, nbgrad.load_model)


@pytest.fixture(scope="module")
def local():
    return nbgrad.load_model()


def equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def both(big, local, source, input=PROMPT, **options):
    there, here = {"big": big}, {"big": local}
    nbgrad.trace(big, input, source, there, **options)
    nbgrad.trace(local, input, source, here, **options)
    return there, here


def test_cells_equal_local(big, local):
    there, here = both(big, local, "h = big.transformer.h[1].output.save()\n"
                                   "with big.lm_head.output[0, -1].max().backward():\n"
                                   "    g = big.transformer.h[0].output.grad.save()\n")
    assert equal(there["h"], here["h"]) and equal(there["g"], here["g"]) and there["h"].grad_fn is None
    assert equal(big.transformer.h[0].attn.c_attn.weight.grad, local.transformer.h[0].attn.c_attn.weight.grad)
    local.zero_grad(set_to_none=True)
    there, here = both(big, local, "c = cache('transformer.h.*', grads=True)\n"
                                   "big.lm_head.output[0, -1].max().backward()\n")
    assert list(there["c"]) == list(here["c"]) and all(equal(there["c"][k], here["c"][k]) for k in here["c"])
    assert all(equal(there["c"].grads[k], here["c"].grads[k]) for k in here["c"].grads)
    local.zero_grad(set_to_none=True)
    prompts = ["The Eiffel Tower is in", "Hi", "A longer prompt"]
    there, here = both(big, local, "last = big.transformer.h[1].output[:, -1].save()\n", input=None, over=prompts,
                       batch_size=2)
    assert len(there["last"]) == 3 and equal(there["last"], here["last"])


def test_generation_and_attribution_equal_local(big, local):
    body = "top = big.lm_head.output[:, -1].argmax(-1).save()\n"
    there, here = {"big": big}, {"big": local}
    remote_run = nbgrad.generate(big, PROMPT, body, there, max_new_tokens=3, out="ids")
    local_run = nbgrad.generate(local, PROMPT, body, here, max_new_tokens=3, out="ids")
    assert equal(remote_run.output, local_run.output) and equal(there["ids"], here["ids"])
    assert equal(there["top"], here["top"]) and len(there["top"]) == 3
    there = nbgrad.attribute(big, PROMPT, " Paris", method="grad-x-input")
    here = nbgrad.attribute(local, PROMPT, " Paris", method="grad-x-input")
    assert equal(there.scores, here.scores) and list(there.labels) == list(here.labels)


def test_options_a_remote_model_does_not_take_are_said(big):
    with pytest.raises(nbgrad.NbgradError, match="runs --over's batches on its own actor: `out`"):
        nbgrad.trace(big, None, "h = big.transformer.h[1].output.save()\n", {"big": big}, over=["Hi"], out="dir")
    with pytest.raises(nbgrad.NbgradError, match="the dataset .*cannot be pickled"):
        nbgrad.trace(big, None, "h = big.transformer.h[1].output.save()\n", {"big": big},
                     over=(p for p in ["Hi"]))
    graph = nbgrad.trace(big, None, "h = big.transformer.h[1].output.save()\n", {"big": big}, graph=True).graph
    assert graph is not None and big.stats() == []          # --graph: compiled here, nothing sent


class Counted(InProcess):
    """The in-process actor, counting what the notebook asks of it after the handle is made."""

    def __init__(self, holder):
        super().__init__(holder)
        self.calls = []

    def __getattr__(self, name):
        self.calls.append(name)
        return super().__getattr__(name)


@pytest.fixture
def counted(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda answer: answer)
    actor = Counted(ModelHolder(nbgrad.load_model))
    handle = RemoteModel(nbgrad.load_model, {}, actor=actor)
    actor.calls.clear()                 # describe(), which made the skeleton
    return handle, actor


@pytest.mark.parametrize("source, local_source", [
    ("h = big.transformer.hh[1].output.save()\n", None),
    ("x = 1\nwith big.lm_head.output[0, -1].max().backward():\n    g = big.transformer.h[7].output.grad.save()\n", None),
    ("p = big.transformer.h[0].atn.source.attention_interface_1.output.save()\n", None),
    ("big.transformer.hx[1].skip(big.transformer.h[1].input)\n", None),
    ("r = big.layers[9].resid_post.save()\n", None),
    ("block = big.transformer.h[0]\nh = block.mlpp.output.save()\n", "h = layer.mlpp.output.save()\n"),
], ids=["attribute", "index in a backward block", "before a site", "before a skip", "canonical", "a module bound"])
def test_a_path_not_in_the_model_is_the_local_error_and_nothing_is_sent(counted, local, source, local_source):
    big, actor = counted
    there = {"big": big, "layer": big.transformer.h[0]}
    actor.calls.clear()                  # reading the handle's module walks the skeleton, not the actor
    with pytest.raises(nbgrad.ModulePathError) as remote_error:
        nbgrad.trace(big, PROMPT, source if local_source is None else local_source, there)
    with pytest.raises(nbgrad.ModulePathError) as local_error:
        nbgrad.trace(local, PROMPT, source if local_source is None else local_source,
                     {"big": local, "layer": local.transformer.h[0]})
    assert str(remote_error.value) == str(local_error.value)
    assert actor.calls == [] and big.stats() == []


def test_paths_that_are_in_the_model_go_to_the_actor_once(counted):
    big, actor = counted
    there = {"big": big}
    nbgrad.trace(big, PROMPT, "h = big.transformer.h[1].output.save()\n"
                              "p = big.transformer.h[0].attn.source.attention_interface_1.output.save()\n"
                              "r = big.layers[1].resid_post.save()\n", there)
    assert actor.calls == ["run"] and there["h"].shape == there["r"].shape


def test_scan_asks_the_actor_nothing(counted, local):
    big, actor = counted
    source = ("c = cache('transformer.h.0.*', grads=True)\nh = big.layers[1].resid_post.save()\n"
              "p = big.transformer.h[0].attn.source.attention_interface_1.output.save()\n"
              "with big.lm_head.output[0, -1].max().backward():\n    g = big.transformer.h[0].output.grad.save()\n")
    there = nbgrad.scan(big, PROMPT, source, {"big": big})
    assert there == nbgrad.scan(local, PROMPT, source, {"big": local}) and there["g"].shape == there["h"].shape
    steps = nbgrad.scan(big, PROMPT, "top = big.lm_head.output[:, -1].argmax(-1).save()\n", {"big": big},
                        generate=True, max_new_tokens=2)
    assert len(steps["top"]) == 2 and actor.calls == [] and big.stats() == []
    with pytest.raises(nbgrad.ModulePathError, match="nearest: h$"):
        nbgrad.scan(big, PROMPT, "h = big.transformer.hh[1].output.save()\n", {"big": big})
    assert actor.calls == []
