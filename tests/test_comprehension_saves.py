"""`.save()` of a value made in a comprehension (`[h.output.mean(-1).save() for h in model.transformer.h]`,
`[(x * 2).save() for x in outs]`), in the forms pasted from nnsight tutorials: each saved value equals the same
computation on plain forward hooks' outputs, on the same weights. A comprehension that reads no event itself (it
goes over a list of outputs the cell made earlier) kept `.save()` as written, which tensors lack."""
import pytest
import torch

import nbgrad
from helpers import hook_count, hooked, tiny_gpt2

MODEL = tiny_gpt2(n_layer=3, seed=5)
IDS = torch.tensor([[3, 17, 42, 5, 88, 9]])
BLOCKS = [f"transformer.h.{i}" for i in range(3)]

# cell -> (the name it binds, what it holds made from the blocks' outputs in order)
CELLS = {
    "acts = [h.output[0].mean(-1).save() for h in model.transformer.h]": lambda outs: [o[0].mean(-1) for o in outs],
    "acts = [(layer.output * 2).save() for layer in model.transformer.h]": lambda outs: [o * 2 for o in outs],
    "acts = [model.transformer.h[i].output[:, -1].norm(dim=-1).save() for i in range(3)]":
        lambda outs: [o[:, -1].norm(dim=-1) for o in outs],
    "acts = {i: h.output.sum().save() for i, h in enumerate(model.transformer.h)}":
        lambda outs: {i: o.sum() for i, o in enumerate(outs)},
    "hs = [h.output for h in model.transformer.h]\nacts = [x.mean(-1).save() for x in hs]":
        lambda outs: [o.mean(-1) for o in outs],
    "hs = [h.output for h in model.transformer.h]\nacts = [(x * 2).save() for x in hs]": lambda outs: [o * 2 for o in outs],
    "outs = [h.output for h in model.transformer.h]\nacts = [o[:, -1].save() for o in reversed(outs)]":
        lambda outs: [o[:, -1] for o in reversed(outs)],
    "hs = {i: h.output for i, h in enumerate(model.transformer.h)}\nacts = {i: v[0, 1:].sum().save() for i, v in hs.items()}":
        lambda outs: {i: o[0, 1:].sum() for i, o in enumerate(outs)},
    "h = model.transformer.h[1].output\nacts = [h[:, t].clone().save() for t in range(3)]":
        lambda outs: [outs[1][:, t] for t in range(3)],
    "hs = [h.output for h in model.transformer.h]\nacts = [[x[:, t].sum().save() for t in range(2)] for x in hs]":
        lambda outs: [[o[:, t].sum() for t in range(2)] for o in outs],
    "acts = list(x.mean(-1).save() for x in [h.output for h in model.transformer.h])":
        lambda outs: [o.mean(-1) for o in outs],
    "hs = [h.output for h in model.transformer.h]\nacts = [nbgrad.save(x.amax(-1)) for x in hs]":
        lambda outs: [o.amax(-1) for o in outs],
}


def _assert_equal(found, expected):
    if isinstance(expected, dict):
        assert sorted(found) == sorted(expected)
        for key in expected:
            _assert_equal(found[key], expected[key])
    elif isinstance(expected, list):
        assert isinstance(found, list) and len(found) == len(expected)
        for one, other in zip(found, expected):
            _assert_equal(one, other)
    else:
        torch.testing.assert_close(found, expected, rtol=0, atol=0)


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_a_value_made_and_saved_in_a_comprehension_equals_plain_hooks(cell):
    outputs = hooked(MODEL, IDS, BLOCKS)[0]
    expected = CELLS[cell]([outputs[name] for name in BLOCKS])
    namespace = {"model": MODEL, "nbgrad": nbgrad}
    nbgrad.trace(MODEL, IDS, cell, namespace)
    _assert_equal(namespace["acts"], expected)
    assert hook_count(MODEL) == 0 and not any(name.startswith("__nbgrad") for name in namespace)


def test_an_unsaved_value_of_such_a_comprehension_is_not_kept():
    namespace = {"model": MODEL}
    result = nbgrad.trace(MODEL, IDS, "hs = [h.output for h in model.transformer.h]\nacts = [x.mean(-1) for x in hs]",
                          namespace)
    assert "acts" not in namespace and "hs" not in namespace and not result.saved


def test_in_an_invoke_each_saved_value_has_the_invokes_rows(default_model):
    cell = ("with invoke('The Eiffel Tower is in'):\n    hs = [h.output for h in model.transformer.h]\n"
            "with invoke('Rome'):\n    acts = [(x * 2)[:, -1].save() for x in hs]\n")
    namespace = {"model": default_model}
    nbgrad.trace(default_model, None, cell, namespace)
    ids = nbgrad.tokenizer_for(default_model)("The Eiffel Tower is in", return_tensors="pt")["input_ids"]
    names = [f"transformer.h.{i}" for i in range(len(default_model.transformer.h))]
    outputs = hooked(default_model, ids, names)[0]
    for found, name in zip(namespace["acts"], names, strict=True):
        torch.testing.assert_close(found, outputs[name][:, -1] * 2)


def test_the_magic_binds_the_comprehensions_saved_values(shell):
    shell.user_ns.update(comp_model=MODEL, comp_ids=IDS)
    shell.run_cell_magic("trace", "comp_model comp_ids -q",
                         "hs = [h.output for h in comp_model.transformer.h]\nacts = [x.mean(-1).save() for x in hs]")
    outputs = hooked(MODEL, IDS, BLOCKS)[0]
    _assert_equal(shell.user_ns["acts"], [outputs[name].mean(-1) for name in BLOCKS])
