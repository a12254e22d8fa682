"""Quiet cells (Program.quiet): a direct cell that only reads, binds, indexes with constants and saves, every read
hooked before the model runs, logs its events in the forward and runs its statements on the log once the model
has run. Which cells are quiet, that their statements really run after the forward while the others' run inside
it, and that the values equal plain hooks: a module called twice, a target named nothing ahead, an error.
(test_direct_run.py holds every direct cell, quiet or not, equal to the general runtime.)"""
import traceback

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import nbgrad
from nbgrad.engine.compile.compiler import compile_cell
from nbgrad.engine.run.hookloops import _EditLoop, _ListLoop
from nbgrad.engine.run.runtime import Runtime
from helpers import hook_count, hooked, tiny_gpt2
from test_direct_run import _Printed, assert_same_both_ways
from test_fuzz_cells import FUZZ

IDS = torch.tensor([[3, 17, 42, 5, 88, 9]])
MODEL = tiny_gpt2(n_layer=3, seed=11)

QUIET = {
    "one read": "hs = model.transformer.h[-1].output.save()",
    "every block by index": "outs = [model.transformer.h[i].output.save() for i in range(len(model.transformer.h))]",
    "every block by loop": "outs = [b.output.save() for b in reversed(model.transformer.h)]",
    "a name of a read": "h = model.transformer.h[1].output\nlast = h.save()",
    "a list of reads": "outs = [b.output for b in model.transformer.h]\nkept = outs",
    "a submodule in a loop": "attn = [b.attn.output for b in model.transformer.h]",
    "a name test": 'd = {n: m.output.save() for n, m in model.named_modules() if n.startswith("transformer.h.")}',
    "any order": "late = model.transformer.h[2].output.save()\nearly = model.transformer.h[0].output.save()",
}
NOT_QUIET = {
    "computes": "n = model.transformer.h[0].output.norm().save()",
    "an operator": "d = (model.transformer.h[1].output - model.transformer.h[0].output).save()",
    "a comparison": 'd = {n: m.output.save() for n, m in model.named_modules() if n == "transformer"}',
    "edits a name": "x = model.transformer.h[0].output\nx[:, 0] = 0",
    "edits an output": "model.transformer.h[0].output[:] *= 2",
    "an index that may copy": "x = model.transformer.h[0].output[rows].save()",
    "a list index": "x = model.transformer.h[0].output[[0, 0]].save()",
    "prints": "print(model.transformer.h[0].output.shape)",
    "nbgrad.save": "x = nbgrad.save(model.transformer.h[0].output)",
    "not hooked ahead": "x = getattr(model.transformer, 'h')[0].output.save()",
    "a function of the cell": "def r(i):\n    return model.transformer.h[i].output\nx = r(0).save()",
    "a branch": "if True:\n    x = model.transformer.h[0].output.save()",
    # Made from a value: the model may change it in place after its event (test_inplace_after_event.py)
    "a view of a name": "h = model.transformer.h[1].output\nlast = h[:, -1].save()",
    "a view of a read": "last = model.transformer.h[1].output[:, -1].save()",
    "an attribute": "h = model.transformer.h[1].output.save()\nlogits = model.output.logits.save()",
    "an element of a list": "outs = [b.output for b in model.transformer.h]\nfirst = outs[0].save()",
    "unpacked": "a, b = model.transformer.h[0].attn.output",
    "counted": "n = len(model.transformer.h[0].output)",
}


@pytest.mark.parametrize("cell", sorted(QUIET))
def test_cells_that_only_keep_what_they_read_are_quiet(cell):
    assert compile_cell(QUIET[cell]).quiet


@pytest.mark.parametrize("cell", sorted(NOT_QUIET))
def test_cells_that_compute_edit_or_read_unforeseen_modules_are_not(cell):
    program = compile_cell(NOT_QUIET[cell])
    assert program.direct and not program.quiet


@pytest.mark.parametrize("cell", sorted(QUIET))
def test_a_quiet_cell_gives_what_the_runtime_gives(cell, capfd):
    assert_same_both_ways(QUIET[cell], capfd)


def statements_in_forward(model, source, namespace=None) -> list:
    """For each time a statement of the cell was resumed, or a HookLoop's body called for a block (its `step` or
    `collect`): whether the model's forward was running then."""
    running, seen = [False], []
    handles = [model.register_forward_pre_hook(lambda m, a: running.__setitem__(0, True), prepend=True),
               model.register_forward_hook(lambda m, a, o: running.__setitem__(0, False), always_call=True)]
    originals = {(kind, name): getattr(kind, name) for kind, name in ((Runtime, "_advance"), (_EditLoop, "advance"),
                                                                        (_ListLoop, "advance"))}

    def spy(original, kind):
        def resumed(self, task, value, *rest):
            if kind is not Runtime or task.loop is None:    # a block's wake passes the core on to its loop: once
                seen.append(running[0])
            return original(self, task, value, *rest)
        return resumed
    for (kind, name), original in originals.items():
        setattr(kind, name, spy(original, kind))
    try:
        nbgrad.trace(model, IDS, source, namespace if namespace is not None else {"model": model})
    finally:
        for (kind, name), original in originals.items():
            setattr(kind, name, original)
        for handle in handles:
            handle.remove()
    return seen


def test_a_quiet_cells_statements_run_after_the_forward_and_the_others_inside_it():
    quiet = statements_in_forward(MODEL, "outs = [model.transformer.h[i].output.save() for i in range(3)]")
    computing = statements_in_forward(MODEL, "outs = [model.transformer.h[i].output.clone().save() for i in range(3)]")
    assert len(quiet) == len(computing) == 4 and not any(quiet)
    assert computing == [False, True, True, True]      # started before the model, woken by each block
    # a list of every block's saved output, a HookLoop: each block's element saved from the log, after the forward
    assert statements_in_forward(MODEL, QUIET["every block by index"]) == [False, False, False]


def test_values_equal_plain_hooks():
    namespace = {"model": MODEL}
    nbgrad.trace(MODEL, IDS, QUIET["every block by index"] + "\n" + QUIET["a name of a read"], namespace)
    outputs = hooked(MODEL, IDS, [f"transformer.h.{i}" for i in range(3)])[0]
    for i in range(3):
        assert torch.equal(namespace["outs"][i], outputs[f"transformer.h.{i}"])
    assert torch.equal(namespace["last"], outputs["transformer.h.1"]) and hook_count(MODEL) == 0


def test_a_module_called_twice_is_read_at_its_first_call_as_inside_the_hooks(capfd):
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.Tanh(), shared)
    x = torch.randn(2, 4)
    source = "first = model[0].output.save()\nout = model.output.save()"
    assert compile_cell(source).quiet
    found = assert_same_both_ways(source, capfd, model=model, ids=x)
    assert torch.equal(found["saved"]["first"], shared(x)) and torch.equal(found["saved"]["out"], model(x))


def test_a_target_that_names_nothing_ahead_is_answered_inside_the_hooks():
    """An iterator of the user's is never consumed ahead (targets.py): its loop's reads are hooked as they are
    asked for, in forward order, so the run answers them inside the hooks instead of logging."""
    namespace = {"model": MODEL, "blocks": iter(MODEL.transformer.h)}
    source = "outs = [b.output.save() for b in blocks]"
    assert compile_cell(source).quiet
    assert statements_in_forward(MODEL, source, dict(namespace)) == [False, True, True, True]
    result = nbgrad.trace(MODEL, IDS, source, {"model": MODEL, "blocks": iter(MODEL.transformer.h)})
    outputs = hooked(MODEL, IDS, [f"transformer.h.{i}" for i in range(3)])[0]
    assert [torch.equal(result.saved[f"outs[{i}]"], outputs[f"transformer.h.{i}"]) for i in range(3)] == [True] * 3


def test_an_error_in_a_quiet_statement_points_at_its_line_and_leaves_the_model_clean(capfd):
    source = "a = model.transformer.h[0].output.save()\nb = {[model.transformer.h[1].output]: 0}"
    assert compile_cell(source).quiet
    found = assert_same_both_ways(source, capfd)
    assert found["error"][:2] == ("TypeError", "unhashable type: 'list'")
    assert found["hooks"] == 0 and not any(name.startswith("__nbgrad") for name in found["names"])
    with pytest.raises(TypeError) as raised:
        nbgrad.trace(MODEL, IDS, source, {"model": MODEL})
    last = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert last.filename.startswith("<nbgrad-cell") and last.lineno == 2


class Fails(nn.Module):
    def forward(self, x):
        raise ValueError("the model's own error")


def test_when_the_model_fails_what_ran_before_it_is_kept_as_inside_the_hooks(capfd):
    """The statements woken before the model failed ran inside the hooks: a quiet run answers them from its log
    before the model's error goes on, so the same statements run and the same error is raised; the failed cell
    binds no name either way."""
    model = nn.Sequential(nn.Linear(4, 4), Fails())
    source = "first = model[0].output.save()\nnever = model[1].output.save()"
    assert compile_cell(source).quiet
    found = assert_same_both_ways(source, capfd, model=model, ids=torch.randn(2, 4))
    assert found["error"][:2] == ("ValueError", "the model's own error")
    assert 1 in [run[1] for run in found["runs"]]          # line 1 ran, answered from the log
    assert "first" not in found["names"] and "never" not in found["names"]


# --- fuzzed quiet cells --------------------------------------------------------------------------------------
# The general fuzz grammar (test_fuzz_cells.py) computes in most statements, so few of its cells are quiet. This
# one makes only statements that read and keep, in any order, and each cell runs both ways
# (test_direct_run.assert_same_both_ways). A cell that takes a view or an attribute of a value is not deferred
# (test_inplace_after_event.py): it is quiet exactly when it keeps every value whole

BLOCK = st.sampled_from(["0", "1", "2", "-1"])
VIEW = st.sampled_from(["", "[:, -1]", "[0]", "[:, 1:3]", "[..., :4]"])
ORDER = st.sampled_from(["range(3)", "reversed(range(3))", "[2, 0]", "range(len(model.transformer.h))", "[1]"])
BLOCKS = st.sampled_from(["model.transformer.h", "reversed(model.transformer.h)"])
PART = st.sampled_from(["", ".attn", ".mlp", ".ln_1"])
SAVE = st.sampled_from(["", ".save()"])


@st.composite
def quiet_statement(draw, index: int) -> str:
    name = f"v{index}"
    kind = draw(st.integers(0, 7 if index else 6))
    if kind == 0:
        return f"{name} = model.transformer.h[{draw(BLOCK)}]{draw(PART)}.output{draw(VIEW)}{draw(SAVE)}"
    if kind == 1:
        return f"{name} = [model.transformer.h[i].output{draw(VIEW)}{draw(SAVE)} for i in {draw(ORDER)}]"
    if kind == 2:
        return f"{name} = [b{draw(PART)}.output{draw(SAVE)} for b in {draw(BLOCKS)}]"
    if kind == 3:
        return (f"{name} = {{n: m.output{draw(SAVE)} for n, m in model.named_modules() "
                f"if n.startswith('transformer.h.{draw(st.sampled_from(['', '1', '2.mlp']))}')}}")
    if kind == 4:
        return f"{name} = model.output.logits{draw(VIEW)}{draw(SAVE)}"
    if kind == 5:
        return f"for i in {draw(ORDER)}:\n    {name} = model.transformer.h[i].output{draw(VIEW)}{draw(SAVE)}"
    if kind == 6:     # now and then a block the model does not have: the path error, both ways
        return f"{name} = model.transformer.h[{draw(st.sampled_from(['3', '0', '1']))}].output{draw(SAVE)}"
    return f"{name} = v{draw(st.integers(0, index - 1))}"


@st.composite
def quiet_cells(draw) -> str:
    count = draw(st.integers(1, 4))
    return "\n".join(draw(quiet_statement(index)) for index in range(count)) + "\n"


@FUZZ
@given(quiet_cells())
def test_fuzzed_quiet_cells_give_what_the_runtime_gives(cell):
    program = compile_cell(cell)
    assert program.direct and program.quiet == ("output[" not in cell and "output.logits" not in cell), cell
    with _Printed() as capfd:
        assert_same_both_ways(cell, capfd)
