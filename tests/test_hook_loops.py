"""Loops that only edit or save each block's output run their body from the block's event (compile/hookloops.py,
run/hookloops.py): against plain PyTorch hooks on the same weights, gradients through the edits included; which
loops take that way; and what a model that does not call the blocks as the loop expects gets told."""
import traceback

import pytest
import torch
from torch import nn

import nbgrad
from nbgrad.engine.compile.compiler import compile_cell
from nbgrad.engine.run.hookloops import _EditLoop
from nbgrad.engine.run.runtime import active_runtime
from helpers import hook_count, tiny_gpt2

IDS = torch.tensor([[3, 14, 15, 92, 65, 35]])
STEER = ("for block in model.transformer.h:\n"
         "    block.output[:, -1] += steer\n"
         "model.output.logits[0, -1].max().backward()\n")


@pytest.fixture
def steps(monkeypatch):
    """The blocks whose edit a HookLoop made (None: the statement's own run)."""
    seen = []
    original = _EditLoop.advance
    monkeypatch.setattr(_EditLoop, "advance", lambda self, step, *rest: seen.append(step.position)
                        or original(self, step, *rest))
    return seen


def plain_steering(model, steer):
    def add(module, args, output):
        output[:, -1] += steer
    handles = [block.register_forward_hook(add) for block in model.transformer.h]
    try:
        model(IDS).logits[0, -1].max().backward()
    finally:
        for handle in handles:
            handle.remove()


def test_a_steering_vector_gets_the_gradient_plain_hooks_give_it(steps):
    """The loop of a steering vector optimised over many traced steps: its gradient through the four edits."""
    model = tiny_gpt2()
    steer = torch.full((32,), 0.1, requires_grad=True)
    nbgrad.trace(model, IDS, STEER, {"model": model, "steer": steer})
    assert steps == [0, 1, 2, 3] and hook_count(model) == 0
    ours, steer.grad = steer.grad, None
    model.zero_grad(set_to_none=True)
    plain_steering(model, steer)
    torch.testing.assert_close(ours, steer.grad)
    assert ours.abs().sum() > 0


def test_the_loop_variable_is_left_as_python_leaves_it(steps):
    model = tiny_gpt2()
    namespace = {"model": model}
    cell = "for i in range(len(model.transformer.h)):\n    model.transformer.h[i].output[:, 0] *= i\n"
    nbgrad.trace(model, IDS, cell, namespace)
    assert namespace["i"] == 3 and steps == [0, 1, 2, 3]
    nbgrad.trace(model, IDS, STEER.replace("steer", "1.0"), namespace)
    assert namespace["block"] is model.transformer.h[3]


@pytest.mark.parametrize("cell", [
    "outs = [b.output.save() for b in model.transformer.h]",
    "outs = [model.transformer.h[i].output[:, -1].save() for i in range(len(model.transformer.h))]",
])
def test_lists_of_saved_outputs_take_the_hook_loop(cell):
    model = tiny_gpt2()
    namespace = {"model": model}
    result = nbgrad.trace(model, IDS, cell, namespace)
    assert [type(node.loop).__name__ for node in compile_cell(cell).nodes] == ["HookLoop"]
    seen = []
    handles = [block.register_forward_hook(lambda module, args, output: seen.append(output))
               for block in model.transformer.h]
    try:
        model(IDS)
    finally:
        for handle in handles:
            handle.remove()
    expected = seen if "[:, -1]" not in cell else [output[:, -1] for output in seen]
    assert len(namespace["outs"]) == 4 and list(result.saved) == [f"outs[{index}]" for index in range(4)]
    for ours, plain in zip(namespace["outs"], expected):
        torch.testing.assert_close(ours, plain)
    assert hook_count(model) == 0


@pytest.mark.parametrize("cell", [
    "outs = [b.output[:, i].save() for b in model.transformer.h]",
    "outs = [b.output.save() for b in model.transformer.h if b is not None]",
    "outs = [b.output.sum().save() for b in model.transformer.h]",
    "outs = [b.output for b in model.transformer.h]",
    "outs = [(b.output.save(), 1) for b in model.transformer.h]",
    "for i in range(len(model.transformer.h)):\n    x = model.transformer.h[i].output\n    x[:] *= 2",
    "for i in range(len(model.transformer.h)):\n    model.transformer.h[i].output[:] *= torch.tensor(2.0)",
    "for i in range(2):\n    model.transformer.h[i].output[:] *= 2",
    "for b in model.transformer.h:\n    b.output[:] *= 2\nelse:\n    pass",
    "for b in model.transformer.h:\n    b.mlp.output[:] *= 2",
    "for b in model.transformer.h:\n    b.output[:] *= b.output.mean()",
    "for b in model.transformer.h:\n    b.output = b.output * 2",
    "s = 2\nfor b in model.transformer.h:\n    b.output[:] *= s",
    "for b in model.transformer.h:\n    b.output.grad[:] *= 2\nmodel.output.logits.sum().backward()",
], ids=["a list: an index not constant", "a list: a condition", "a list: a call", "a list: not saved",
        "a list: more than the value", "a name bound", "a call", "not every block", "else", "a submodule",
        "an event read", "a replacement", "a name the cell binds", "a gradient"])
def test_loops_that_do_more_run_as_statements(cell):
    assert all(node.loop is None for node in compile_cell(cell).nodes)


def test_a_path_rebound_to_another_container_runs_the_statement(steps):
    """PATH must be a plain ModuleList when the cell runs: a list of blocks is the statement's to walk."""
    model = tiny_gpt2()
    blocks = list(model.transformer.h)
    holder = nn.Module()
    holder.__dict__["h"] = blocks            # an attribute, not a registered module: no plain ModuleList
    namespace = {"model": model, "holder": holder}
    nbgrad.trace(model, IDS, "for b in holder.h:\n    b.output[:] *= 2\nlogits = model.output.logits.save()",
                 namespace)
    assert steps == []
    expected = nbgrad.trace(model, IDS, "for b in model.transformer.h:\n    b.output[:] *= 2\n"
                                        "logits = model.output.logits.save()", {"model": model}).saved["logits"]
    assert steps == [0, 1, 2, 3]
    torch.testing.assert_close(namespace["logits"], expected)


class Skipping(nn.Module):
    """Calls its layers in the order given, not all of them, or not in the order of the list."""

    def __init__(self, order):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.order = order

    def forward(self, x):
        for index in self.order:
            x = self.layers[index](x)
        return x


def both_ways(model, cell) -> list:
    """(namespace, Result or the nbgrad error raised) of the cell run as a HookLoop, then as the statement."""
    outcomes = []
    for runner in ("fast", "general"):
        namespace = {"model": model}
        try:
            outcome = nbgrad.trace(model, torch.ones(1, 4), cell, namespace, runner=runner)
        except nbgrad.NbgradError as error:
            outcome = error
        outcomes.append((namespace, outcome))
        assert hook_count(model) == 0
    return outcomes


def test_a_block_the_model_never_calls_is_said_as_the_statement_says_it():
    (_, hook_loop), (_, statement) = both_ways(Skipping([0, 1]),
                                               "for layer in model.layers:\n    layer.output[:] *= 2\n")
    assert isinstance(hook_loop, nbgrad.OrderError) and str(hook_loop) == str(statement)
    assert "line 2" in str(hook_loop) and "model.layers[2]" in str(hook_loop).replace("layer.output", "")


def test_a_list_of_blocks_called_out_of_order_is_in_the_lists_order():
    """Reads may come in any order: a block that runs before its turn is read when the list gets to it."""
    model = Skipping([2, 0, 1])
    outcomes = both_ways(model, "outs = [layer.output.save() for layer in model.layers]\n")
    x = torch.ones(1, 4)
    plain = {}
    for index in model.order:
        x = plain[index] = model.layers[index](x)
    for namespace, result in outcomes:
        assert list(result.saved) == ["outs[0]", "outs[1]", "outs[2]"]
        for index in range(3):
            torch.testing.assert_close(namespace["outs"][index], plain[index])


def test_blocks_called_out_of_order_get_the_statements_message():
    (_, hook_loop), (_, statement) = both_ways(Skipping([1, 0, 2]),
                                               "for layer in model.layers:\n    layer.output[:] *= 2\n")
    assert isinstance(hook_loop, nbgrad.OrderError) and str(hook_loop) == str(statement)
    assert "a loop that edits must visit the modules in the order the model calls them" in str(hook_loop)


def test_an_error_in_the_body_is_the_cells_at_its_line_and_the_next_cell_works(steps):
    model = tiny_gpt2()
    namespace = {"model": model, "wrong": torch.ones(5)}
    with pytest.raises(RuntimeError) as raised:
        nbgrad.trace(model, IDS, "x = 1\nfor b in model.transformer.h:\n    b.output[:, 0] += wrong\n", namespace)
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert frames[-1].filename.startswith("<nbgrad-cell-") and frames[-1].lineno == 3
    assert frames[-1].line == "b.output[:, 0] += wrong" and not any("torch/nn" in f.filename for f in frames)
    assert hook_count(model) == 0 and steps == [0]
    logits = nbgrad.trace(model, IDS, "logits = model.output.logits.save()", namespace).saved["logits"]
    torch.testing.assert_close(logits, model(IDS).logits)


SCALE = ("for i in range(len(model.transformer.h)):\n    model.transformer.h[i].output[:] *= 0.5\n"
         "logits = model.output.logits.save()\n")          # bench/overhead.py's (c)


def as_the_forward_ends(model, cell, namespace, **options) -> tuple:
    """(the run's Result, [(blocks logged, the loop's rows in the timeline)] as the final norm runs: once the blocks
    have all run, before the model returns)."""
    seen = []

    def probe(module, args, output):
        run = active_runtime()
        seen.append((len(run.forward.logged or ()), [row for row in run.timeline if row[1] is not None]))
    handle = model.transformer.ln_f.register_forward_hook(probe)
    try:
        return nbgrad.trace(model, IDS, cell, namespace, **options), seen
    finally:
        handle.remove()


def test_an_edit_loop_alone_in_the_forward_leaves_its_bookkeeping_to_the_models_end(steps):
    """Each block's hook only edits and logs (run/hookloops.py, `on_block`): as the forward ends, the four blocks are
    logged and none has its row yet. The core answers them once the model has returned: the run order is the general
    runner's, row for row, and the logits are plain hooks'."""
    model = tiny_gpt2()
    fast, seen = as_the_forward_ends(model, SCALE, {"model": model})
    assert seen == [(4, [])] and steps == [0, 1, 2, 3] and hook_count(model) == 0
    general, seen = as_the_forward_ends(model, SCALE, {"model": model}, runner="general")
    assert len(seen) == 1 and seen[0][0] == 0 and len(seen[0][1]) == 4
    assert str(fast.graph) == str(general.graph) and "forward: line 1 woken by" in str(fast.graph)

    def halve(module, args, output):
        output[:] *= 0.5
    handles = [block.register_forward_hook(halve) for block in model.transformer.h]
    try:
        plain = model(IDS).logits
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(fast.saved["logits"], plain) and torch.equal(general.saved["logits"], plain)


@pytest.mark.parametrize("cell", [
    "x = model.transformer.h[1].output[:, -1].save()\n" + SCALE,
    SCALE + "y = model.transformer.h[2].output[:, 0].save()\n",
    "c = cache(\"transformer.h.*\")\n" + SCALE,
    SCALE + "model.output.logits.sum().backward()\n",
], ids=["a read of a block before", "a read of a block after", "a cache", "a backward pass"])
def test_an_edit_loop_with_more_to_do_inside_the_forward_answers_each_block_at_its_event(cell):
    """Anything else waiting on an event of the forward (or started once the loop is done, or a cache, or gradients):
    no log, and the run is the general runner's."""
    model = tiny_gpt2()
    runs = []
    for runner in ("fast", "general"):
        namespace = {"model": model}
        result, seen = as_the_forward_ends(model, cell, namespace, runner=runner)
        runs.append((namespace, result))
        assert seen[0][0] == 0 and hook_count(model) == 0
        model.zero_grad(set_to_none=True)
    (fast_names, fast), (general_names, general) = runs
    assert str(fast.graph) == str(general.graph) and list(fast.saved) == list(general.saved)
    for name in fast.saved:
        torch.testing.assert_close(fast.saved[name], general.saved[name])


def test_an_error_in_a_later_blocks_body_is_said_as_the_general_runner_says_it(steps):
    """The blocks before are answered first (their rows), then the failing block's row and its error, at its line."""
    model = tiny_gpt2()
    cell = "for i in range(len(model.transformer.h)):\n    model.transformer.h[i].output[:] *= scales[i]\n"
    errors = []
    for runner in ("fast", "general"):
        with pytest.raises(IndexError) as raised:
            nbgrad.trace(model, IDS, cell, {"model": model, "scales": [1.0, 2.0, 3.0]}, runner=runner)
        errors.append(raised.value)
        assert hook_count(model) == 0
    assert steps == [0, 1, 2, 3]
    assert str(errors[0]) == str(errors[1]) and str(errors[0].nbgrad_graph) == str(errors[1].nbgrad_graph)
    frames = [traceback.extract_tb(error.__traceback__)[-1] for error in errors]
    assert [(frame.filename.startswith("<nbgrad-cell-"), frame.lineno) for frame in frames] == [(True, 2), (True, 2)]
    assert str(errors[0].nbgrad_graph).count("line 1 woken by") == 4
    logits = nbgrad.trace(model, IDS, "logits = model.output.logits.save()", {"model": model}).saved["logits"]
    torch.testing.assert_close(logits, model(IDS).logits)


def test_a_block_called_twice_takes_the_events_own_way_from_there():
    """A module the model calls again (a recurrent layer) is edited at its first call, as the statement edits it."""
    (fast_names, fast), (general_names, general) = both_ways(
        Skipping([0, 1, 1, 2]), "for layer in model.layers:\n    layer.output[:] *= 2\ny = model.output.save()\n")
    torch.testing.assert_close(fast_names["y"], general_names["y"])
    assert str(fast.graph) == str(general.graph)
