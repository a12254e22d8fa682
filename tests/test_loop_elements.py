"""`PATH[i].output` in a loop (Read.at, run/elements.py): a direct run finds `PATH[i]` from the ModuleList it holds
instead of evaluating the expression at every event, and gives what evaluating it gives: the same modules, the
ModuleList's own error for an index out of range, and the new block once the cell replaces one."""
import torch
from torch import nn

import nbgrad
from nbgrad.engine.compile.compiler import compile_cell
from helpers import hook_count, hooked, tiny_gpt2
from test_direct_run import assert_same_both_ways

IDS = torch.tensor([[3, 17, 42, 5, 88, 9]])
LOOP = "outs = [model.transformer.h[i].output.save() for i in range(len(model.transformer.h))]"


class Counting(nn.Module):
    """A root module that counts how often the cell's expressions ask it for `transformer`."""

    def __init__(self, model):
        super().__init__()
        self.transformer = model.transformer
        self.asked = 0

    def __getattr__(self, name):
        if name == "transformer":
            self.__dict__["asked"] += 1
        return super().__getattr__(name)

    def forward(self, ids):
        return self.transformer(ids)


def test_a_loop_evaluates_the_path_once_per_run_not_once_per_block():
    asked = []
    for n_layer in (2, 6):
        model = Counting(tiny_gpt2(n_layer=n_layer, seed=1))
        namespace = {"model": model}
        nbgrad.trace(model, IDS, LOOP, namespace)
        outputs = hooked(model, IDS, [f"transformer.h.{i}" for i in range(n_layer)])[0]
        assert all(torch.equal(namespace["outs"][i], outputs[f"transformer.h.{i}"]) for i in range(n_layer))
        asked.append(model.asked)
    assert asked[0] == asked[1]
    assert compile_cell(LOOP).containers and not compile_cell("x = model.transformer.h[-1].output").containers


def test_a_loop_finds_each_block_anew_once_the_cell_replaces_one():
    """Held until a module is registered anywhere: here the loop swaps block 2 for another before reading it,
    and reads the new one."""
    model = tiny_gpt2(n_layer=3, seed=3)
    spare = tiny_gpt2(n_layer=1, seed=4).transformer.h[0]

    def swap():
        model.transformer.h[2] = spare
    source = ("outs = []\nfor i in range(3):\n    if i == 2:\n        swap()\n"
              "    outs.append(model.transformer.h[i].output.save())")
    assert compile_cell(source).containers
    namespace = {"model": model, "swap": swap}
    nbgrad.trace(model, IDS, source, namespace)
    outputs = hooked(model, IDS, ["transformer.h.0", "transformer.h.1", "transformer.h.2"])[0]
    assert model.transformer.h[2] is spare and torch.equal(namespace["outs"][2], outputs["transformer.h.2"])
    assert torch.equal(namespace["outs"][0], outputs["transformer.h.0"]) and hook_count(model) == 0


def test_a_name_the_cell_binds_or_a_function_takes_is_evaluated_as_written():
    for source in ("blocks = model.transformer.h\nx = [blocks[i].output.save() for i in range(2)]",
                   "x = [m.transformer.h[i].output.save() for m in [model] for i in range(2)]",
                   "def f(i):\n    return model.transformer.h[i].output\nx = f(0)"):
        assert not compile_cell(source).containers, source


def test_an_index_out_of_range_is_the_module_lists_own_error(capfd):
    found = assert_same_both_ways("outs = [model.transformer.h[i].output.save() for i in range(5)]", capfd)
    assert found["error"][:2] == ("ModulePathError",
                                  "line 1: model.transformer.h[i].output: IndexError: index 3 is out of range")
    assert found["hooks"] == 0
