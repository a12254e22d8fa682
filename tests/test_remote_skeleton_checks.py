"""What a local run finds from the module tree alone, a remote cell finds on the notebook's skeleton, with nothing sent:
a misspelled event (`.outptu`, `.skp(...)`, `.inptu`, `.grd`), a site the forward does not have, a `cache(...)` that
matches no module or takes wrong arguments. Each is the local run's own error (type, message, notes, cell line);
the actor (in this process, tests/inprocess.py) is asked nothing."""
import traceback

import pytest
import torch

import nbgrad
from inprocess import Counted, counted_handle
from nbgrad.remote.actor import ModelHolder
from nbgrad.remote.handle import RemoteModel

ray = pytest.importorskip("ray")
PROMPT = "The Eiffel Tower is in the city of"




@pytest.fixture(scope="module")
def local():
    return nbgrad.load_model()


@pytest.fixture
def counted(monkeypatch):
    return counted_handle(monkeypatch)


def hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def raised(model, source: str, **options) -> BaseException:
    with pytest.raises(Exception) as caught:
        nbgrad.trace(model, None if "invoke(" in source else PROMPT, source, {"big": model}, **options)
    return caught.value


def cell_line(error: BaseException):
    lines = [line for frame, line in traceback.walk_tb(error.__traceback__)
             if frame.f_code.co_filename.startswith("<nbgrad-cell-")]
    return lines[-1] if lines else getattr(error, "line", None)


TYPOS = {
    "outptu": ("h = big.transformer.h[0].outptu.save()\n", "did you mean `.output`?"),
    "skp": ("x = big.transformer.h[0].mlp.output.save()\nbig.transformer.h[0].skp(x)\n", "did you mean `.skip`?"),
    "inptu": ("x = big.transformer.h[1].attn.inptu.save()\n", "did you mean `.input`?"),
    "loop": ("for b in big.transformer.h:\n    x = b.outptu.save()\n", "did you mean `.output`?"),
    "comprehension": ("p = [b.inptus for b in big.transformer.h]\n", "did you mean `.inputs`?"),
    "invoke": (f"with invoke({PROMPT!r}):\n    h = big.lm_head.ouput.save()\n", "did you mean `.output`?"),
    "backward block": ("with big.lm_head.output[0, -1].max().backward():\n    g = big.transformer.h[0].outptu.grad.save()\n",
                       "did you mean `.output`?"),
}


def test_a_misspelled_event_of_a_site_is_the_local_error_and_nothing_is_sent(counted, local):
    big, actor = counted
    source = "x = 1\np = big.transformer.h[0].attn.source.attention_interface_1.outptu.save()\n"
    there, here = raised(big, source), raised(local, source)
    assert (type(there), str(there)) == (type(here), str(here)) == (AttributeError, (
        "the site GPT2Attention.source.attention_interface_1 has no attribute 'outptu': a site has .output, .input, "
        ".inputs, .grad and .source"))
    assert cell_line(there) == cell_line(here) == 2 and actor.calls == [] and big.stats() == []


@pytest.mark.parametrize("source, meant", TYPOS.values(), ids=TYPOS.keys())
def test_a_misspelled_event_is_the_local_error_and_nothing_is_sent(counted, local, source, meant):
    big, actor = counted
    there, here = raised(big, source), raised(local, source)
    assert (type(there), str(there), there.__notes__) == (type(here), str(here), here.__notes__)
    assert type(there) is AttributeError and meant in there.__notes__[0]
    assert cell_line(there) == cell_line(here) and f"line {cell_line(here)}:" in there.__notes__[0]
    assert actor.calls == [] and big.stats() == [] and hooks(local) == 0
    assert torch.equal(nbgrad.trace(big, PROMPT, "h = big.lm_head.output.save()\n", {"big": big})["h"],
                       nbgrad.trace(local, PROMPT, "h = big.lm_head.output.save()\n", {"big": local})["h"])


def test_a_misspelled_grad_is_said_when_the_cell_is_compiled_here_and_there(counted, local):
    big, actor = counted
    source = "x = 1\nwith big.lm_head.output[0, -1].max().backward():\n    g = big.transformer.h[0].output.grd.save()\n"
    there, here = raised(big, source), raised(local, source)
    assert type(there) is type(here) and isinstance(there, AttributeError) and str(there) == str(here) == (
        "line 3: big.transformer.h[0].output has no attribute `.grd`: did you mean `.grad`? (the gradient of an "
        "event's value is `big.transformer.h[0].output.grad`)")
    assert str(raised(local, "l = big.output.logits[0].gard\n")).startswith(
        "line 1: big.output.logits[0] has no attribute `.gard`: did you mean `.grad`?")
    assert actor.calls == [] and hooks(local) == 0 and local.transformer.h[0].mlp.c_fc.weight.grad is None


CHECKS = {
    "site": ("p = big.transformer.h[0].attn.source.attention_interface_9.output.save()\n",
             "line 1: GPT2Attention.source has no site 'attention_interface_9'; nearest: attention_interface_1"),
    "cache glob": ("c = cache('transformer.hh.*')\n",
                   "line 1: cache(...): no module of the model matches 'transformer.hh.*'; nearest: transformer.h.3"),
    "cache list": ("x = 1\nc = cache(['transformer.h.0', 'lm_hed'])\n",
                   "line 2: cache(...): no module of the model matches 'lm_hed'; nearest: lm_head"),
    "cache option": ("c = cache(big.transformer.h[0], inputs=True, foo=2)\n",
                     "line 1: cache(...) has no option 'foo': it takes cache(modules, *, inputs=..., grads=..."),
    "cache flag": ("c = cache('transformer.h.*', grads=1)\n", "line 1: cache(grads=...) is True or False, not 1"),
}


@pytest.mark.parametrize("source, message", CHECKS.values(), ids=CHECKS.keys())
def test_a_site_or_cache_the_model_lacks_is_the_local_error_and_nothing_is_sent(counted, local, source, message):
    big, actor = counted
    there, here = raised(big, source), raised(local, source)
    assert (type(there), str(there)) == (type(here), str(here)) and str(there).startswith(message)
    assert actor.calls == [] and big.stats() == []


@pytest.mark.parametrize("source", [
    "if len(big.transformer.h) > 9:\n    p = big.lm_head.outptu\nh = big.lm_head.output.save()\n",
    "c = cache('transformer.hh.*', grads=True)\n",            # the run's own error (no backward pass) comes first
    "def later(b):\n    return b.outptu\nh = big.lm_head.output.save()\n",
    "c = cache(modules='transformer.h.*')\nh = big.lm_head.output.save()\n",
], ids=["a branch not taken", "grads without a backward pass", "a function not called", "a cache that matches"])
def test_what_a_run_may_not_reach_or_does_not_refuse_goes_to_the_actor(counted, local, source):
    big, actor = counted
    outcomes = []
    for model in (big, local):
        try:
            nbgrad.trace(model, PROMPT, source, {"big": model})
            outcomes.append(None)
        except Exception as error:
            outcomes.append((type(error), str(error)))
    assert outcomes[0] == outcomes[1] and actor.calls == ["run"]


class NoActor:
    def __getattr__(self, name):
        raise AssertionError(f"the actor was asked for {name!r}")


def test_source_and_names_of_a_remote_model_read_the_skeleton(counted, local, shell, capsys):
    big, _ = counted
    big._actor = NoActor()
    printed = {}
    for name, model in (("there", big), ("here", local)):
        shell.user_ns["big"] = model
        shell.run_line_magic("source", "big.transformer.h[0].attn")
        shell.run_line_magic("names", "big")
        printed[name] = capsys.readouterr().out
    shell.user_ns.pop("big")
    assert printed["there"] == printed["here"] and "attention_interface_1" in printed["there"]
    assert "big.layers[i].resid_post" in printed["there"]


def test_nbgrad_source_of_a_remote_module_lists_the_skeletons_forward(counted, local):
    big, _ = counted
    big._actor = NoActor()
    there = nbgrad.source(big.transformer.h[0].attn)
    assert there == nbgrad.source(local.transformer.h[0].attn) and there.names[0] in there
    assert nbgrad.source(big).names == nbgrad.source(local).names


def test_no_cell_form_of_the_tutorials_is_refused_by_the_skeleton_checks(monkeypatch):
    """The checks refuse only what a run refuses: every tutorial cell form (tests/scan_cells.py), which runs on a
    local model, passes them, and they ask the actor nothing."""
    from nbgrad.remote.pathcheck import check_paths
    from scan_cells import GENERATE_CELLS, TRACE_CELLS, for_model, namespace

    def build():
        return nbgrad.load_model(attn_implementation="eager")
    monkeypatch.setattr(ray, "get", lambda answer: answer)
    actor = Counted(ModelHolder(build))
    big = RemoteModel(build, {}, actor=actor)
    actor.calls.clear()
    names = {**namespace(build()), "model": big, "blocks": big.transformer.h}
    for _, _, source, _ in TRACE_CELLS + GENERATE_CELLS:
        check_paths(big, for_model(source, "gpt2"), dict(names))
    assert actor.calls == []
