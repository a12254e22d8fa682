"""`PATH[i].output` in a loop and `PATH[-1].output` (Read.at, run/elements.py): a direct run finds `PATH[-1]` in the
model's `_modules`, and a loop's `PATH[i]` in its own copy of PATH's blocks, instead of evaluating the expression,
and gives what evaluating it gives: the same modules, the ModuleList's own error for an index out of range, the new
block once the cell replaces one, and what a property or a class's own `__getattr__` on the path names."""
import pytest
import torch
from torch import nn

import nbgrad
from nbgrad.errors import OrderError
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


def test_a_loop_indexes_no_module_list_and_asks_a_class_of_its_own_ways_at_every_block(monkeypatch):
    """On a model of torch's ways, the loop's `model.transformer.h[i]` costs no `ModuleList.__getitem__` beyond the
    model's own; a root with a `__getattr__` of its own is asked for `transformer` at every block, as the
    expression asks it."""
    indexed = []
    original = nn.ModuleList.__getitem__
    monkeypatch.setattr(nn.ModuleList, "__getitem__", lambda self, idx: indexed.append(idx) or original(self, idx))
    asked = []
    for n_layer in (2, 6):
        model = tiny_gpt2(n_layer=n_layer, seed=1)
        indexed.clear()
        model(IDS)
        own = len(indexed)
        namespace = {"model": model}
        indexed.clear()
        nbgrad.trace(model, IDS, LOOP, namespace)
        assert len(indexed) == own
        outputs = hooked(model, IDS, [f"transformer.h.{i}" for i in range(n_layer)])[0]
        assert all(torch.equal(namespace["outs"][i], outputs[f"transformer.h.{i}"]) for i in range(n_layer))
        counting = Counting(model)
        namespace = {"model": counting}
        nbgrad.trace(counting, IDS, LOOP, namespace)
        assert all(torch.equal(namespace["outs"][i], outputs[f"transformer.h.{i}"]) for i in range(n_layer))
        asked.append(counting.asked)
    assert asked[1] - asked[0] >= 4
    assert compile_cell(LOOP).containers and compile_cell("x = model.transformer.h[-1].output").containers
    assert not compile_cell("x = model.transformer.h[len(model.transformer.h) - 1].output").containers


def test_a_loop_finds_each_block_anew_once_the_cell_replaces_one():
    """The run's copy of the blocks is given up once a module is registered: here the loop swaps block 2 for
    another before reading it, and reads the new one."""
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


class _TwoModels(nn.Module):
    """A root that runs one model and registers its `transformer` (torch's `add_module` refuses a name the class
    has), while its class names another model's by that name: evaluating `model.transformer` is not looking it
    up in `_modules`."""

    def __init__(self, model, other):
        super().__init__()
        self.inner, self.other = model, other
        self._modules["transformer"] = model.transformer

    def forward(self, ids):
        return self.inner(ids)


class Renamed(_TwoModels):
    """By a property."""

    @property
    def transformer(self):
        return self.other.transformer


class Redirected(_TwoModels):
    """By a `__getattr__` of its own."""

    def __getattr__(self, name):
        if name == "transformer":
            return self.other.transformer
        return super().__getattr__(name)


def test_one_block_read_by_a_constant_index_is_the_one_the_expression_names():
    model = tiny_gpt2(n_layer=3, seed=5)
    expected = hooked(model, IDS, ["transformer.h.2", "transformer.h.0"])[0]
    for source, name in (("x = model.transformer.h[-1].output.save()", "transformer.h.2"),
                         ("x = model.transformer.h[0].output.save()", "transformer.h.0")):
        namespace = {"model": model}
        nbgrad.trace(model, IDS, source, namespace)
        assert torch.equal(namespace["x"], expected[name]) and hook_count(model) == 0


def test_a_constant_index_follows_the_model_between_runs():
    """Nothing is kept from one run to the next: a block deleted or replaced between two cells is seen."""
    model = tiny_gpt2(n_layer=3, seed=6)
    namespace = {"model": model}
    source = "x = model.transformer.h[-1].output.save()"
    nbgrad.trace(model, IDS, source, namespace)
    first = namespace["x"]
    del model.transformer.h[2]
    nbgrad.trace(model, IDS, source, namespace)
    assert torch.equal(namespace["x"], hooked(model, IDS, ["transformer.h.1"])[0]["transformer.h.1"])
    assert not torch.equal(namespace["x"], first)
    model.transformer.h[1] = tiny_gpt2(n_layer=1, seed=7).transformer.h[0]
    nbgrad.trace(model, IDS, source, namespace)
    assert torch.equal(namespace["x"], hooked(model, IDS, ["transformer.h.1"])[0]["transformer.h.1"])


def test_a_property_on_the_path_is_what_the_cell_reads():
    """`model.transformer` is a property naming another model's blocks, which the model never runs: the read
    never comes, as when the expression is evaluated, both ways."""
    for kind in (Renamed, Redirected):
        _never_ran_both_ways(kind(tiny_gpt2(n_layer=2, seed=8), tiny_gpt2(n_layer=2, seed=9)))


def _never_ran_both_ways(model):
    for source in ("x = model.transformer.h[-1].output.save()",
                   "x = [model.transformer.h[i].output.save() for i in range(2)]"):
        for runner in ("fast", "general"):
            with pytest.raises(OrderError, match="never ran"):
                nbgrad.trace(model, IDS, source, {"model": model}, runner=runner)
            assert hook_count(model) == 0


def test_an_index_written_as_a_constant_out_of_range_is_the_module_lists_own_error(capfd):
    found = assert_same_both_ways("x = model.transformer.h[7].output.save()", capfd)
    assert found["error"][:2] == ("ModulePathError", "line 1: model.transformer.h[7] is not in the model: "
                                                     "model.transformer.h has 3 blocks, indices 0–2 (or -3–-1)")


def test_which_classes_are_looked_up_as_modules_are():
    from nbgrad.engine.run.elements import plain_attribute
    model = tiny_gpt2(n_layer=1)
    assert plain_attribute(type(model), "transformer") and plain_attribute(type(model.transformer), "h")
    assert not plain_attribute(Renamed, "transformer") and plain_attribute(Renamed, "inner")
    assert not plain_attribute(Redirected, "inner")
    assert not plain_attribute(Counting, "transformer") and not plain_attribute(dict, "h")
    assert not plain_attribute(type(model), "forward")       # a method of the class, not a submodule


def test_what_a_run_keeps_of_a_loops_blocks_is_given_up_once_the_list_changes():
    """A loop's blocks, kept by index for the run (elements.hold), answer only while PATH still has them all:
    deleting or inserting a block (which registers nothing, so bumps no version) or replacing one (which does)
    sends the run back to the expression."""
    from nbgrad.engine.run.elements import element, hold
    spare = tiny_gpt2(n_layer=1, seed=10).transformer.h[0]
    for change in ("del model.transformer.h[1]", "model.transformer.h.insert(0, spare)",
                   "model.transformer.h[1] = spare", "model.transformer.h.append(spare)", "model = spare"):
        model = tiny_gpt2(n_layer=3, seed=11)
        namespace = {"model": model, "spare": spare}
        held = hold(namespace, compile_cell(LOOP).containers[0])
        assert [element(held, namespace, i) for i in (0, 1, 2, -1)] == [model.transformer.h[i] for i in (0, 1, 2, -1)]
        assert element(held, namespace, 3) is None
        exec(change, namespace)
        assert all(element(held, namespace, i) is None for i in (0, 1)), change
