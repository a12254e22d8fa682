"""`nbgrad.remote`'s two halves joined in this process, without a cluster: the handle (notebook side) talks to a
`ModelHolder` (actor side) through its methods, the bytes that Ray would carry included. Every cell form gives
what the same cell gives on a local copy, bit for bit. (tests/test_remote.py runs the same on a Ray actor.)"""
import pytest
import torch

import nbgrad
from nbgrad.remote.actor import ModelHolder
from nbgrad.remote.handle import RemoteModel

ray = pytest.importorskip("ray")
PROMPT = "The Eiffel Tower is in the city of"


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


@pytest.fixture
def big(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda answer: answer)      # the transport: here, the answer as it is
    return RemoteModel(nbgrad.load_model, {}, actor=InProcess(ModelHolder(nbgrad.load_model)))


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
    with pytest.raises(nbgrad.NbgradError, match="runs --over's batches on its own actor: `engine` does not apply"):
        nbgrad.trace(big, None, "h = big.transformer.h[1].output.save()\n", {"big": big}, over=["Hi"], engine="ray")
    graph = nbgrad.trace(big, None, "h = big.transformer.h[1].output.save()\n", {"big": big}, graph=True).graph
    assert graph is not None and big.stats() == []          # --graph: compiled here, nothing sent


PROMPTS = ["The Eiffel Tower is in", "Hi", "A longer prompt about things", "One, two,", "Paris"]
OVER = "last = big.transformer.h[1].output[:, -1].save()\nn = 7\n"


def test_over_reads_the_dataset_here_and_the_notebook_writes_out(big, local, tmp_path):
    there, here = {"big": big}, {"big": local}
    nbgrad.trace(big, None, OVER, there, over=iter(PROMPTS), batch_size=2, out=tmp_path / "there")    # read as it goes
    nbgrad.trace(local, None, OVER, here, over=iter(PROMPTS), batch_size=2, out=tmp_path / "here")
    assert len(there["last"]) == 5 and equal(list(there["last"]), list(here["last"])) and there["n"] == 7
    files = sorted(p.name for p in (tmp_path / "there").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "here").iterdir()) and "index.json" in files
    assert len([f for f in files if f.startswith("batch-")]) == 3         # one file per batch, written here
    assert nbgrad.datasets.verify(tmp_path / "there") == nbgrad.datasets.verify(tmp_path / "here")
    assert [cell["sent"] > 0 for cell in big.stats()] == [True]            # one entry for the run's three batches
    again = {"big": big}
    nbgrad.trace(big, None, OVER, again, over=PROMPTS, batch_size=2, out=tmp_path / "there")
    assert big.stats()[-1]["sent"] == 0 and equal(list(again["last"]), list(here["last"]))   # all found in DIR


def test_an_error_in_an_over_batch_names_the_example_and_the_cell_line(big, local):
    source = "x = big.transformer.h[1].output.save()\ny = x.foo()\n"
    with pytest.raises(AttributeError, match="foo") as there:
        nbgrad.trace(big, None, source, {"big": big}, over=PROMPTS, batch_size=2)
    with pytest.raises(AttributeError, match="foo") as here:
        nbgrad.trace(local, None, source, {"big": local}, over=PROMPTS, batch_size=2)
    assert str(there.value) == str(here.value)
    frames = [(frame.f_code.co_filename, line) for frame, line in __import__("traceback").walk_tb(there.value.__traceback__)]
    assert frames[-1][0].startswith("<nbgrad-cell-") and frames[-1][1] == 2


LOSS_CELL = "h = big.transformer.h[1].output.save()\nloss = big.lm_head.output[0, -1].max().save()\n"


def test_backward_of_a_loss_a_remote_cell_saved_runs_on_the_actor(big, local):
    there, here = both(big, local, LOSS_CELL)
    assert there["loss"].grad_fn is None and torch.equal(there["loss"], here["loss"])
    remote_run = nbgrad.backward(there["loss"], "g = h.grad.save()\n", there)
    local_run = nbgrad.backward(here["loss"], "g = h.grad.save()\n", here)
    assert torch.equal(there["g"], here["g"]) and torch.equal(remote_run.saved["g"], local_run.saved["g"])
    weight = big.transformer.h[0].mlp.c_fc.weight
    assert torch.equal(weight.grad, local.transformer.h[0].mlp.c_fc.weight.grad)
    assert remote_run.leaf_grads == {} and len(local_run.leaf_grads) > 0     # parameters' grads stay on the actor
    with pytest.raises(nbgrad.GradError, match="backward through the graph a second time|retain") as twice:
        nbgrad.backward(there["loss"], "", there)
    with pytest.raises(nbgrad.GradError) as locally:
        nbgrad.backward(here["loss"], "", here)
    assert str(twice.value) == str(locally.value)
    local.zero_grad(set_to_none=True)


def test_the_actor_keeps_a_graph_while_the_notebook_holds_its_copy(big):
    holder = big._actor.holder
    namespace = {"big": big}
    nbgrad.trace(big, PROMPT, LOSS_CELL, namespace)
    assert len(holder.kept) == 2
    nbgrad.trace(big, PROMPT, "w = (h * 2).save()\n", namespace)
    assert len(holder.kept) == 3 and torch.equal(namespace["w"], namespace["h"] * 2)
    assert namespace["w"].nbgrad_kept is not None     # computed there from the kept h, which has a graph
    namespace.clear()
    __import__("gc").collect()
    nbgrad.trace(big, PROMPT, "y = big.transformer.h[0].output.save()\n", {"big": big}, no_grad=True)
    assert holder.kept == {}


def test_the_backward_magic_takes_a_remote_loss_and_says_what_it_cannot(big, local, shell):
    shell.user_ns["big"] = big
    shell.run_cell(f'%%trace big "{PROMPT}" -q\n{LOSS_CELL}', store_history=False)
    shell.run_cell("%%backward loss -q\ng = h.grad.save()\n", store_history=False)
    here = {"big": local}
    nbgrad.trace(local, PROMPT, LOSS_CELL, here)
    nbgrad.backward(here["loss"], "g = h.grad.save()\n", here)
    assert torch.equal(shell.user_ns["g"], here["g"])
    with pytest.raises(nbgrad.GradError) as caught:
        shell.run_line_magic("backward", "loss * 2 -q")
    assert str(caught.value) == (
        "the loss does not require grad, so there is nothing to backpropagate: loss came back from a remote model's "
        "cell, and its autograd graph stays on the model's actor: `%%backward loss` runs the pass there, but a value "
        "computed from it here has no graph: compute the loss in the remote cell, .save() it, and %%backward that name")
    for name in ("big", "h", "loss", "g"):
        shell.user_ns.pop(name)
    local.zero_grad(set_to_none=True)


def test_a_copy_the_actor_keeps_pickles_as_a_plain_tensor(big, tmp_path):
    namespace = {"big": big}
    nbgrad.trace(big, PROMPT, LOSS_CELL, namespace)
    torch.save(namespace["loss"], tmp_path / "loss.pt")
    loaded = torch.load(tmp_path / "loss.pt")
    assert torch.equal(loaded, namespace["loss"]) and not loaded.nbgrad_kept
    with pytest.raises(nbgrad.GradError, match="does not require grad"):      # a plain tensor: refused as locally
        nbgrad.backward(loaded, "", {"loaded": loaded})
    assert not __import__("copy").deepcopy(namespace["h"]).nbgrad_kept and namespace["h"].nbgrad_kept
