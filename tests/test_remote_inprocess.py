"""`nbgrad.remote`'s two halves joined in this process, without a cluster: the handle (notebook side) talks to a
`ModelHolder` (actor side) through its methods, the bytes that Ray would carry included. Every cell form gives
what the same cell gives on a local copy, bit for bit. (tests/test_remote.py runs the same on a Ray actor.)"""
import pytest
import torch

import nbgrad
from inprocess import Counted, counted_handle, in_process_handle, one_read_traffic

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
    with pytest.raises(nbgrad.NbgradError, match="runs --over's batches on its own actor: `engine` does not apply"):
        nbgrad.trace(big, None, "h = big.transformer.h[1].output.save()\n", {"big": big}, over=["Hi"], engine="ray")
    graph = nbgrad.trace(big, None, "h = big.transformer.h[1].output.save()\n", {"big": big}, graph=True).graph
    assert graph is not None and big.stats() == []          # --graph: compiled here, nothing sent




@pytest.fixture
def counted(monkeypatch):
    return counted_handle(monkeypatch)


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


def test_weights_never_travel_and_what_does_is_counted(big):
    """SPEC 3d: a one-read cell moves its saved value and its text, within 2x, never the weights; a cell that binds
    a weight-sized value is counted as such (the count sees what travels)."""
    cell, moved, least = one_read_traffic(big, PROMPT)
    assert cell["cell"] == "h = big.transformer.h[1].output.save()" and least <= moved <= 2 * least, cell
    assert moved < big.weight_bytes / 100
    namespace = {"big": big}
    nbgrad.trace(big, PROMPT, "w = (big.transformer.wte.weight * 1).save()\n", namespace)
    embedding = namespace["w"].numel() * namespace["w"].element_size()
    assert big.stats()[-1]["received"] >= embedding > big.weight_bytes / 20
