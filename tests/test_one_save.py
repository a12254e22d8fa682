"""The cell of one-reads, saved (`NAME = PATH.output.save()` statements, Program.one_save): a direct run answers it from
its hook with no statement run (engine/run/onesave.py). Each cell here runs both ways, that way and through the
general runtime, on the same weights and namespace, and must leave the same (test_direct_run.assert_same_both_ways:
saved values, names, shapes, the hook graph's steps, errors with their messages and notes); which cells take the
hook's way, and which go the general way because their path is not found by `_modules` alone, is checked too."""
from collections import OrderedDict

import pytest
import torch
from torch import nn

import nbgrad
from nbgrad.engine.compile.compiler import compile_cell
from nbgrad.engine.run import onesave, runtime
from helpers import tiny_gpt2
from test_direct_run import assert_same_both_ways
from test_direct_run import _same_both_ways_with_hooks_of_the_users as assert_same_both_ways_with_users_hook

MODEL = tiny_gpt2(n_layer=3, seed=5)


class Fails(nn.Module):
    def forward(self, x):
        raise ValueError("the model's own error")


class Unused(nn.Module):
    """A model with a submodule its forward never calls."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


class OwnLookup(nn.Module):
    """A module that finds its submodules its own way: a path through it is evaluated as written."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def __getattr__(self, name):
        return super().__getattr__("inner" if name == "alias" else name)

    def forward(self, x):
        return self.inner(x)


SHARED = nn.Linear(4, 4)
OWN_MODELS = {
    "sequential": nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)),
    "named sequential": nn.Sequential(OrderedDict(first=nn.Linear(4, 4), act=nn.ReLU(), last=nn.Linear(4, 3))),
    "a module called twice": nn.Sequential(SHARED, nn.Tanh(), SHARED),
    "fails after": nn.Sequential(nn.Linear(4, 4), Fails()),
    "unused": Unused(),
    "own lookup": nn.Sequential(OwnLookup()),
}
# cell -> whether the hook answers it (False: the general way, from the start)
GPT2_CELLS = {
    "x = model.transformer.h[-1].output.save()": True,
    "x = model.transformer.h[0].attn.output.save()": True,
    "x = model.transformer.h[1].mlp.c_fc.output.save()": True,
    "x = model.lm_head.output.save()": True,
    "IDS = model.transformer.ln_f.output.save()": True,          # a name the namespace held, bound anew
    "x = model.transformer.output.save()": True,                 # not a tensor: a hint's note, both ways
    "x = model.output.save()": True,                             # the model's own: what its call returns
    "x = holder.output.save()": False,                           # not a module
    "x = model.transformer.h[7].output.save()": False,           # IndexError, with torch's message
    "x = model.transformer.h[-4].output.save()": False,
    "x = model.transformer.nope.output.save()": False,           # AttributeError, and nbgrad's path message
    "x = missing.output.save()": False,                          # NameError
}
OWN_CELLS = [
    ("sequential", "h = model[1].output.save()", True),
    ("sequential", "h = model[-1].output.save()", True),
    ("named sequential", "h = model[1].output.save()", True),    # by its place, as Sequential indexes
    ("named sequential", "h = model.last.output.save()", True),
    ("a module called twice", "h = model[0].output.save()", True),
    ("fails after", "h = model[0].output.save()", True),         # saved, then the model's error
    ("fails after", "h = model[1].output.save()", True),         # the model's error, nothing saved
    ("unused", "h = model.unused.output.save()", True),          # never came: the general way's OrderError
    ("own lookup", "h = model[0].alias.output.save()", False),
    ("own lookup", "h = model[0].inner.output.save()", False),
    ("sequential", "h = model[1].output.save()\ny = model.output.save()", True),
    ("sequential", "y = model.output.save()\nh = model[1].output.save()", True),       # rows in the events' order
    ("sequential", "a = model[2].output.save()\nb = model[0].output.save()\nc = model[2].output.save()", True),
    ("a module called twice", "h = model[2].output.save()\ng = model[1].output.save()", True),
    ("fails after", "h = model[0].output.save()\ny = model.output.save()", True),   # h saved, then the error
    ("unused", "h = model.used.output.save()\ng = model.unused.output.save()", True),   # the second never came
    ("unused", "g = model.unused.output.save()\nh = model.used.output.save()", True),   # the first never came
    ("own lookup", "h = model.output.save()\ng = model[0].alias.output.save()", False),
]


@pytest.fixture
def hook_way(monkeypatch):
    """The answers of `_forward_one` in this test: True where the hook answered the cell."""
    answers = []
    original = onesave.forward_one

    def recorded(self, *args):
        try:
            answered = original(self, *args)
        except BaseException:
            answers.append(True)         # it ran the model, which failed
            raise
        answers.append(answered)
        return answered
    monkeypatch.setattr(runtime, "forward_one", recorded)
    return answers


@pytest.mark.parametrize("cell", list(GPT2_CELLS))
def test_a_one_save_cell_gives_what_the_runtime_gives(cell, hook_way, capfd):
    assert compile_cell(cell).one_save is not None
    found = assert_same_both_ways(cell, capfd, model=MODEL)
    assert hook_way == [GPT2_CELLS[cell]]
    assert found["saved"] or found["error"] or cell.startswith("x = holder")


@pytest.mark.parametrize("model, cell, by_hook", OWN_CELLS, ids=[f"{m}: {c}" for m, c, _ in OWN_CELLS])
def test_on_a_model_of_ones_own(model, cell, by_hook, hook_way, capfd):
    found = assert_same_both_ways(cell, capfd, model=OWN_MODELS[model], ids=torch.randn(2, 4))
    assert hook_way == [by_hook]
    assert found["saved"] or found["error"]


def test_several_reads_are_bound_and_saved_from_one_forward():
    model, x = OWN_MODELS["sequential"], torch.randn(2, 4)
    namespace = {"model": model}
    result = nbgrad.trace(model, x, "h = model[1].output.save()\ny = model.output.save()", namespace)
    assert torch.equal(result.saved["h"], model[1](model[0](x))) and torch.equal(result.saved["y"], model(x))
    assert namespace["h"] is result.saved["h"] and namespace["y"] is result.saved["y"]
    assert [(run.line, run.woke_by) for run in result.graph.runs] == [(1, None), (2, None), (1, "model[1].output"),
                                                                      (2, "model.output")]


def test_a_model_with_a_backward_hook_goes_the_general_way(hook_way, capfd):
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    handle = model.register_full_backward_hook(lambda module, grad_in, grad_out: None)
    try:
        found = assert_same_both_ways_with_users_hook("y = model.output.save()", capfd, model, torch.randn(2, 4))
    finally:
        handle.remove()
    assert hook_way == [False] and found["saved"]


def test_a_module_called_twice_is_read_at_its_first_call():
    model, x = OWN_MODELS["a module called twice"], torch.randn(2, 4)
    namespace = {"model": model}
    result = nbgrad.trace(model, x, "h = model[0].output.save()", namespace)
    assert torch.equal(result.saved["h"], SHARED(x)) and namespace["h"] is result.saved["h"]


def test_under_no_grad_too(hook_way, capfd):
    found = assert_same_both_ways("x = model.transformer.h[1].output.save()", capfd, model=MODEL, no_grad=True)
    assert hook_way == [True] and found["saved"]["x"].grad_fn is None


def test_float_ids_get_the_same_hint(hook_way, capfd):
    found = assert_same_both_ways("x = model.transformer.h[1].output.save()", capfd, model=MODEL,
                                  ids=torch.tensor([[3.0, 17.0]]))
    assert found["error"] is not None


@pytest.mark.parametrize("cell", ["x = model.transformer.h[i].output.save()", "x = model.transformer.h[0].output",
                                  "x = model.transformer.h[0].output[:, -1].save()", "x = y = model.lm_head.output.save()",
                                  "model = model.lm_head.output.save()", "x = model.transformer.h[0].input.save()",
                                  "x = model.lm_head.output.save()\ny = 1", "x.y = model.lm_head.output.save()",
                                  "x = model.lm_head.output.save()\nx = model.transformer.output.save()",
                                  "x = model.lm_head.output.save()\ny = x.output.save()"])
def test_other_cells_are_not_one_save(cell):
    assert compile_cell(cell).one_save is None
