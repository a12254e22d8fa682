"""`M.calls[k]`: the k-th call of a module that runs several times in one forward, against plain PyTorch (a forward
hook that counts the module's calls and keeps or edits the k-th, `register_hook` for its gradient), on a recurrent
module of the test's own and on ALBERT, whose one layer group runs once per layer."""
import pytest
import torch
from torch import nn
from transformers import AlbertConfig, AlbertModel

import nbgrad
from nbgrad.errors import NbgradError, OrderError
from helpers import hook_count
from interrupts import Injector

RUNNERS = ["fast", "general"]


class Recurrent(nn.Module):
    """One cell applied three times, then a head."""

    def __init__(self, width=6, steps=3):
        super().__init__()
        self.cell, self.head, self.steps = nn.Linear(width, width), nn.Linear(width, 2), steps

    def forward(self, x):
        for _ in range(self.steps):
            x = torch.tanh(self.cell(x))
        return self.head(x)


@pytest.fixture
def rec():
    torch.manual_seed(3)
    return Recurrent(), torch.randn(2, 6)


def run(model, x, cell, runner="fast", **names):
    namespace = {"model": model, "torch": torch, **names}
    nbgrad.trace(model, x, cell, namespace, runner=runner)
    return namespace


def plain(module, model, x, edit=None, grad_of=None, grad_edit=None):
    """The model run with a forward hook on `module` that keeps each call's output, input and args; `edit`:
    {k: fn(output) -> new output}; `grad_of` the call whose output's gradient `register_hook` keeps (and replaces
    by `grad_edit(g)`), with the head's sum as the loss."""
    outs, ins, grads = [], [], []

    def hook(mod, args, output):
        ins.append(args[0])
        k = len(outs)
        if edit and k in edit:
            output = edit[k](output)
        outs.append(output)
        if grad_of == k:
            output.register_hook(lambda g: (grads.append(g), grad_edit(g) if grad_edit else None)[1])
        return output
    handle = module.register_forward_hook(hook)
    try:
        y = model(x)
        if grad_of is not None:
            y.sum().backward()
    finally:
        handle.remove()
    return outs, ins, y, grads


@pytest.mark.parametrize("runner", RUNNERS)
def test_reads_each_call_by_literal_name_and_loop_variable(rec, runner):
    model, x = rec
    outs, ins, _, _ = plain(model.cell, model, x)
    ns = run(model, x, "a = model.cell.calls[2].output.save()\nb = model.cell.calls[j].output.save()\n"
             "each = [model.cell.calls[k].output.save() for k in range(3)]\nfirst = model.cell.output.save()\n"
             "i1 = model.cell.calls[1].input.save()\nargs2 = model.cell.calls[2].inputs.save()", runner, j=1)
    assert torch.equal(ns["a"], outs[2]) and torch.equal(ns["b"], outs[1])
    assert all(torch.equal(got, want) for got, want in zip(ns["each"], outs)) and len(ns["each"]) == 3
    assert torch.equal(ns["first"], outs[0])           # M.output is the first call
    assert torch.equal(ns["i1"], ins[1]) and torch.equal(ns["args2"][0][0], ins[2])
    assert hook_count(model) == 0


@pytest.mark.parametrize("runner", RUNNERS)
def test_in_any_order(rec, runner):
    model, x = rec
    outs, _, _, _ = plain(model.cell, model, x)
    ns = run(model, x, "late = model.cell.calls[2].output.save()\nearly = model.cell.calls[0].output.save()\n"
             "y = model.output.save()\nmid = model.cell.calls[1].output.save()", runner)
    assert torch.equal(ns["late"], outs[2]) and torch.equal(ns["early"], outs[0]) and torch.equal(ns["mid"], outs[1])


@pytest.mark.parametrize("runner", RUNNERS)
def test_edits_change_that_call_only(rec, runner):
    model, x = rec
    v = torch.full((2, 6), 0.25)
    for cell, fn in [("model.cell.calls[1].output[:] = 0", lambda o: torch.zeros_like(o)),
                     ("model.cell.calls[k].output = v", lambda o: v),
                     ("model.cell.calls[2].output[:, 0] *= 3", lambda o: o * torch.tensor([3.] + [1.] * 5))]:
        want_outs, _, want_y, _ = plain(model.cell, model, x, edit={2 if "[2]" in cell else 1: fn})
        ns = run(model, x, cell + "\nouts = [model.cell.calls[i].output.save() for i in range(3)]\n"
                 "y = model.output.save()", runner, v=v, k=1)
        assert torch.allclose(ns["y"], want_y), cell
        assert all(torch.allclose(a, b) for a, b in zip(ns["outs"], want_outs)), cell
    assert hook_count(model) == 0


@pytest.mark.parametrize("runner", RUNNERS)
def test_gradient_of_a_call(rec, runner):
    model, x = rec
    _, _, _, want = plain(model.cell, model, x, grad_of=1)
    model.zero_grad()
    ns = run(model, x, "h = model.cell.calls[1].output\nwith model.output.sum().backward():\n    g = h.grad.save()\n"
             "g0 = model.cell.calls[0].output.grad.save()", runner)
    assert torch.allclose(ns["g"], want[0])
    _, _, _, want0 = plain(model.cell, model, x, grad_of=0)
    assert torch.allclose(ns["g0"], want0[0])


@pytest.mark.parametrize("runner", RUNNERS)
def test_gradient_edit_of_a_call(rec, runner):
    model, x = rec
    plain(model.cell, model, x, grad_of=2, grad_edit=lambda g: g * 0)
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    ns = run(model, x, "h = model.cell.calls[2].output\nwith model.output.sum().backward():\n    h.grad = h.grad * 0\n"
             "w = model.cell.weight.grad.save()", runner)
    assert torch.allclose(ns["w"], want[0])


def tiny_albert():
    torch.manual_seed(0)
    config = AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                          intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    return AlbertModel(config).eval()


def _first(value):
    return value[0] if isinstance(value, tuple) else value


@pytest.mark.parametrize("runner", RUNNERS)
def test_albert_shared_layer_group(runner):
    model = tiny_albert()
    ids = torch.tensor([[3, 7, 11, 4, 9]])
    group = model.encoder.albert_layer_groups[0]
    outs, _, _, _ = plain(group, model, ids)
    assert len(outs) == 3
    ns = run(model, ids, "g = model.encoder.albert_layer_groups[0]\nouts = [g.calls[k].output.save() for k in "
             "range(3)]", runner)
    assert all(torch.equal(_first(a), _first(b)) for a, b in zip(ns["outs"], outs))

    def zero_second(output):
        return (torch.zeros_like(output[0]),) + tuple(output[1:]) if isinstance(output, tuple) else output * 0
    _, _, want, _ = plain(group, model, ids, edit={1: zero_second})
    ns = run(model, ids, "model.encoder.albert_layer_groups[0].calls[1].output[0][:] = 0\n"
             "last = model.output.last_hidden_state.save()"
             if isinstance(outs[0], tuple) else "model.encoder.albert_layer_groups[0].calls[1].output[:] = 0\n"
             "last = model.output.last_hidden_state.save()", runner)
    assert torch.allclose(ns["last"], want.last_hidden_state)
    assert hook_count(model) == 0


def test_cache_lists_every_call_as_calls_reads_it(rec):
    model, x = rec
    ns = run(model, x, "c = cache(model.cell)\neach = [model.cell.calls[k].output.save() for k in range(3)]")
    listed = ns["c"]["model.cell"]
    assert len(listed) == 3 and all(torch.equal(a, b) for a, b in zip(listed, ns["each"]))


def test_a_call_past_the_last_names_line_module_k_and_count(rec):
    model, x = rec
    with pytest.raises(OrderError) as caught:
        run(model, x, "y = model.output.save()\nh = model.cell.calls[5].output.save()")
    assert str(caught.value) == ("line 2: model.cell.calls[5].output never came: model.cell ran 3 times in this "
                                 "forward, so it has no call 5 (calls[k] counts from 0: k is at most 2)")
    with pytest.raises(OrderError, match=r"model.head ran once in this forward, so it has no call 1 \(calls\[k\] "
                                         r"counts from 0: k is at most 0\)"):
        run(model, x, "h = model.head.calls[1].output.save()")
    assert hook_count(model) == 0


def test_negative_and_slice_indices_are_refused_when_compiled(rec):
    model, x = rec
    with pytest.raises(NbgradError) as caught:
        nbgrad.trace(model, x, "y = model.output.save()\nh = model.cell.calls[-1].output.save()", graph=True)
    assert str(caught.value).startswith("line 2: `model.cell.calls[-1]`: .calls[k] counts a module's calls from 0, "
                                        "and k may not be negative: the number of times it runs is not known "
                                        "before the forward ends")
    with pytest.raises(NbgradError, match=r"`model.cell.calls\[1:\]`: .calls\[k\] takes one call's index k"):
        run(model, x, "h = model.cell.calls[1:].output.save()")
    with pytest.raises(NbgradError, match=r"line 1: `.calls\[-2\]`: k counts M's calls from 0; a negative k would "
                                          r"count from the last call"):
        run(model, x, "h = model.cell.calls[k].output.save()", k=-2)
    with pytest.raises(NbgradError, match=r"`.calls\[k\]` takes the calls of a module; Parameter is not one"):
        run(model, x, "h = model.cell.weight.calls[0].output.save()")
    assert hook_count(model) == 0


def test_output_of_a_module_called_again_says_so_once(rec, capsys):
    model, x = rec
    run(model, x, "a = model.cell.output.save()\nb = model.head.output.save()")
    said = capsys.readouterr().err
    assert said.count("nbgrad:") == 1
    assert ("nbgrad: line 1: model.cell ran more than once in this forward; model.cell.output is its first call. "
            "Read the k-th call (k from 0) as model.cell.calls[k].output") in said
    run(model, x, "b = model.head.output.save()\nc = model.cell.calls[1].output.save()")
    assert "nbgrad:" not in capsys.readouterr().err
    for runner in RUNNERS:           # a one-read cell, which the fast runner answers from its own hook
        run(model, x, "a = model.cell.output.save()", runner)
        assert capsys.readouterr().err.count("model.cell ran more than once in this forward") == 1, runner


CALLS_CELL = ("a = model.cell.calls[0].output.save()\nmodel.cell.calls[1].output[:] = 0\n"
              "h = model.cell.calls[2].output\nwith model.output.sum().backward():\n    g = h.grad.save()")
NEXT_CELL = "n = model.cell.calls[1].output.save()\ny = model.output.save()"
# Every call of the cell hooked ahead (k of a loop), its inputs and outputs
LOOP_CELL = ("i = [model.cell.calls[k].input.save() for k in (2, 0, 1)]\n"
             "o = [model.cell.calls[k].output.save() for k in reversed(range(3))]")


@pytest.mark.parametrize("cell", [CALLS_CELL, LOOP_CELL], ids=["calls", "loop"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_an_interrupt_at_every_line_leaves_nothing(rec, runner, cell):
    model, x = rec
    outs, _, want_y, _ = plain(model.cell, model, x)
    flags = [p.requires_grad for p in model.parameters()]
    run(model, x, cell, runner)          # compiled once
    with Injector() as counter:
        run(model, x, cell, runner)
    problems = []
    for k in range(1, counter.count + 1):
        namespace = {"model": model, "torch": torch}
        try:
            with Injector(k):
                nbgrad.trace(model, x, cell, namespace, runner=runner)
        except KeyboardInterrupt:
            pass
        model.zero_grad(set_to_none=True)
        left = [name for name in namespace if name.startswith("__nbgrad")]
        if hook_count(model) or left or [p.requires_grad for p in model.parameters()] != flags:
            problems.append((k, hook_count(model), left))
            continue
        after = run(model, x, NEXT_CELL, runner)
        if not (torch.equal(after["n"], outs[1]) and torch.equal(after["y"], want_y)):
            problems.append((k, "next cell differs"))
    assert counter.count > 50 and not problems, problems[:3]


def test_in_invokes_each_counts_its_own_rows(rec):
    model, x = rec
    one, _, _, _ = plain(model.cell, model, x[:1])
    two, _, _, _ = plain(model.cell, model, x[1:])
    ns = run(model, None, "with invoke(xs[:1]):\n    a = model.cell.calls[1].output.save()\n"
             "with invoke(xs[1:]):\n    b = model.cell.calls[2].output.save()", xs=x)
    assert torch.allclose(ns["a"], one[1]) and torch.allclose(ns["b"], two[2])
    ns = run(model, None, "with invoke(xs[:1]):\n    a = [model.cell.calls[k].output.save() for k in reversed(range(3))]\n"
             "with invoke(xs[1:]):\n    b = [model.cell.calls[k].output.save() for k in (1, 2, 0)]", xs=x)
    assert all(torch.allclose(a, o) for a, o in zip(ns["a"], one[::-1])) and len(ns["a"]) == 3
    assert all(torch.allclose(b, two[k]) for b, k in zip(ns["b"], (1, 2, 0))) and len(ns["b"]) == 3


def test_each_generation_step_counts_from_zero():
    from helpers import tiny_gpt2
    model, ids = tiny_gpt2(n_layer=2), torch.tensor([[1, 2, 3]])
    kept = []
    handle = model.transformer.h[0].register_forward_hook(lambda m, a, o: kept.append(o))
    try:
        model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    finally:
        handle.remove()
    ns = {"model": model}
    nbgrad.generate(model, ids, "a = model.transformer.h[0].calls[0].output.save()", ns, max_new_tokens=3)
    assert len(ns["a"]) == len(kept) == 3
    assert all(torch.allclose(a, _first(b)) for a, b in zip(ns["a"], kept)) and hook_count(model) == 0


def test_a_persistent_edit_of_a_call_edits_it_at_every_call_of_the_model(rec):
    model, x = rec
    _, _, want, _ = plain(model.cell, model, x, edit={1: lambda o: o * 0})
    edit = nbgrad.edit(model, "model.cell.calls[1].output[:] = 0")
    try:
        first, second = model(x), model(x)
    finally:
        edit.remove()
    assert torch.allclose(first, want) and torch.allclose(second, want) and hook_count(model) == 0


def test_a_persistent_edit_says_the_calls_hint_once_an_install(rec, capsys):
    """An edit of `M.output` of a module called again is told once, not at every call of the model: each call is
    a run of its own, and what was said is kept with the edit."""
    model, x = rec
    hint = "model.cell ran more than once in this forward"
    for _ in range(2):
        edit = nbgrad.edit(model, "model.cell.output[:] = 0")
        try:
            model(x), model(x), model(x)
        finally:
            edit.remove()
        assert capsys.readouterr().err.count(hint) == 1
    assert hook_count(model) == 0


def test_calls_without_an_event_after_it_says_what_to_write(rec):
    model, x = rec
    for cell, line in [("a = model.cell.calls[1].outptu.save()", 1), ("y = model.output.save()\n"
                                                                    "c = model.cell.calls[1].outptu", 2)]:
        with pytest.raises(AttributeError, match="'Linear' object has no attribute 'calls'") as caught:
            run(model, x, cell)
        assert caught.value.__notes__ == [f"nbgrad: line {line}: `.calls[k]`, the k-th call of a module, is read with "
                                          f"one of its events right after it, in the same expression: "
                                          f"`M.calls[k].output`, `.input` or `.inputs`"]
    assert hook_count(model) == 0


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_call_bound_to_a_name_reads_edits_and_gives_its_gradient(rec, runner):
    model, x = rec
    outs, _, _, _ = plain(model.cell, model, x)
    ns = run(model, x, "c = model.cell.calls[1]\na = c.output.save()\ni = c.input.save()", runner)
    assert torch.equal(ns["a"], outs[1]) and torch.equal(ns["i"], torch.tanh(outs[0]))
    want_outs, _, want_y, _ = plain(model.cell, model, x, edit={1: lambda o: torch.zeros_like(o)})
    ns = run(model, x, "c = model.cell.calls[1]\nc.output[:] = 0\nb = c.output.save()\ny = model.output.save()", runner)
    assert torch.equal(ns["b"], want_outs[1]) and torch.allclose(ns["y"], want_y)
    _, _, _, want = plain(model.cell, model, x, grad_of=1)
    model.zero_grad(set_to_none=True)
    ns = run(model, x, "c = model.cell.calls[1]\nwith model.output.sum().backward():\n    g = c.output.grad.save()",
             runner)
    assert torch.allclose(ns["g"], want[0]) and hook_count(model) == 0


def test_grad_of_an_indexed_output_says_how_to_write_it(rec):
    """`h = M.output[0]` is a tensor the loss never used: a `register_hook` on it never fires, so nbgrad refuses
    h.grad and says to slice the module output's gradient, which equals plain PyTorch's."""
    model, x = rec
    fired = []

    def hook(module, args, output):
        output[0].register_hook(fired.append)
    handle = model.head.register_forward_hook(hook)
    try:
        model(x).sum().backward()
    finally:
        handle.remove()
    assert fired == []
    with pytest.raises(nbgrad.errors.GradError) as caught:
        run(model, x, "h = model.head.output[0]\nwith model.output.sum().backward():\n    g = h.grad.save()")
    assert str(caught.value) == ("line 3: h.grad was never computed by the backward pass of line 2 "
                                 "(model.output.sum().backward()): the loss does not depend on h. h is a slice taken "
                                 "after the fact: slicing makes a new tensor that the loss never used. Read .grad of "
                                 "the tensor itself, then slice the gradient: for h = M.output[0], write "
                                 "M.output.grad[0]")
    ns = run(model, x, "h = model.head.output\nwith model.output.sum().backward():\n    g = h.grad[0].save()")
    assert torch.equal(ns["g"], torch.ones(2)) and hook_count(model) == 0


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_loop_reading_calls_in_reverse_order(rec, runner):
    """k of a loop is known only as it runs: every call of M is hooked ahead, so the loop may read them in any order
    (and their inputs, and their gradients); an edit of a call that has run is too late, as for any module."""
    model, x = rec
    outs, ins, _, _ = plain(model.cell, model, x)
    ns = run(model, x, "each = [model.cell.calls[k].output.save() for k in reversed(range(3))]", runner)
    assert len(ns["each"]) == 3 and all(torch.equal(a, b) for a, b in zip(ns["each"], outs[::-1]))
    ns = run(model, x, "each = [model.cell.calls[k].input.save() for k in (2, 0, 1)]", runner)
    assert all(torch.equal(a, ins[k]) for a, k in zip(ns["each"], (2, 0, 1)))
    _, _, _, want = plain(model.cell, model, x, grad_of=1)
    model.zero_grad(set_to_none=True)
    ns = run(model, x, "hs = [model.cell.calls[k].output for k in reversed(range(3))]\n"
                       "with model.output.sum().backward():\n    g = hs[1].grad.save()", runner)
    assert torch.allclose(ns["g"], want[0])
    with pytest.raises(nbgrad.OrderError, match="line 2: model.cell.calls\\[k\\].output is edited too late"):
        run(model, x, "for k in (2, 1):\n    model.cell.calls[k].output[:] = 0", runner)
    assert hook_count(model) == 0
