"""Persistent edits that cannot be, and errors around one: each refused form says why and to use %%trace; an
error or an interrupt in a later call or cell leaves the edit whole, and the next call equals the hand-hooked
one."""
import pytest
import torch

import nbgrad
from nbgrad.engine.edit.edits import active_edits, edit_hooks
from nbgrad.errors import ModulePathError, NbgradError
from helpers import hook_count, steered_logits, tiny_gpt2
from interrupts import Injector

STEER = "model.transformer.h[1].output[:, -1] += torch.arange(32.) / 8"


@pytest.mark.parametrize("source, line, said", [
    ("x = model.transformer.h[0].output.save()", 1, "`.save()` keeps a value after a cell"),
    ("model.transformer.h[0].output[:] = 0\nnbgrad.save(model.transformer.h[1].output)", 2,
     "`.save()` keeps a value after a cell"),
    ("c = cache()\nmodel.transformer.h[0].output[:] = 0", 1, "`cache(...)` keeps every module's value"),
    ("model.transformer.h[0].output[:] = 0\nmodel.output.logits.sum().backward()", 2,
     "a backward pass belongs to one cell's run"),
    ("model.transformer.h[0].output[:] = 0\nstop()", 2, "`stop()` ends one run of a cell early"),
    ("with invoke(ids):\n    model.transformer.h[0].output[:] = 0", 1, "`with invoke(...)` gives one cell's run"),
])
def test_saves_caches_passes_stops_and_invokes_are_refused(tiny, source, line, said):
    with pytest.raises(NbgradError) as raised:
        nbgrad.edit(tiny, source)
    message = str(raised.value)
    assert message.startswith(f"line {line}: {said}") and "an edit has no cell to return to" in message
    assert "read and keep values in a %%trace cell" in message
    assert active_edits(tiny) == [] and hook_count(tiny) == 0


def test_a_read_that_feeds_no_edit_is_refused_with_a_pointer_to_trace(tiny):
    with pytest.raises(NbgradError) as raised:
        nbgrad.edit(tiny, "model.transformer.h[0].output[:] = 0\nx = model.transformer.h[2].output")
    assert str(raised.value) == ("line 2: `model.transformer.h[2].output` is read here and no edit uses it: an edit "
                                 "has no cell to return a value to, it runs at every later call of the model. To "
                                 "look at values, read and keep values in a %%trace cell, which runs with the edit "
                                 "in place")
    assert hook_count(tiny) == 0


def test_a_read_that_feeds_an_edit_is_allowed(tiny, ids):
    source = "h = model.transformer.h[1].output\nh[:, -1] += torch.arange(32.) / 8"
    with nbgrad.edit(tiny, source):
        edited = tiny(ids).logits
    assert torch.equal(edited, steered_logits(tiny, ids))


def test_a_body_that_edits_nothing_is_refused(tiny):
    with pytest.raises(NbgradError, match=r"^an edit writes or edits what a module returns or receives .*; this one "
                                          r"touches no module$"):
        nbgrad.edit(tiny, "scale = 2")


def test_a_path_not_in_the_model_is_refused_when_installed(tiny):
    with pytest.raises(ModulePathError, match=r"^line 1: .*h\[7\].*blocks"):
        nbgrad.edit(tiny, "model.transformer.h[7].output[:] = 0")
    assert active_edits(tiny) == [] and hook_count(tiny) == 0


def test_an_error_in_a_later_cell_leaves_the_edit_whole(tiny, ids):
    expected = steered_logits(tiny, ids)
    with nbgrad.edit(tiny, STEER):
        hooks = edit_hooks(tiny)
        with pytest.raises(ZeroDivisionError):
            nbgrad.trace(tiny, ids, "x = model.transformer.h[2].output\ny = 1 / 0")
        with pytest.raises(ZeroDivisionError):        # raised in the block after the edited one, in the forward
            nbgrad.trace(tiny, ids, "model.transformer.h[2].output[:] = 0\nz = 1 / 0 + model.transformer.h[3].output")
        with pytest.raises(IndexError):               # raised by the model itself
            tiny(torch.tensor([[500]]))
        assert edit_hooks(tiny) == hooks and len(active_edits(tiny)) == 1
        assert torch.equal(tiny(ids).logits, expected)
    assert hook_count(tiny) == 0


def test_an_error_raised_by_the_edit_itself_names_its_line_and_leaves_it_whole(tiny, ids):
    edit = nbgrad.edit(tiny, "model.transformer.h[0].output[:] = 0\nmodel.transformer.h[1].output = torch.zeros(5)")
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="normalized_shape") as raised:
                tiny(ids)
            assert raised.value.__notes__ == [
                "nbgrad: raised while nbgrad.edit(GPT2LMHeadModel) was on the model (line 2 replaced "
                "model.transformer.h[1].output of shape (1, 6, 32) with a value of shape (5,); the model failed after "
                "that); `.remove()` takes it off"]
        assert len(active_edits(tiny)) == 1
    finally:
        edit.remove()
    assert hook_count(tiny) == 0


def test_an_interrupt_at_any_line_of_a_call_leaves_the_edit_whole(ids):
    model = tiny_gpt2()
    expected = steered_logits(model, ids)
    edit = nbgrad.edit(model, STEER)
    hooks = edit_hooks(model)
    with Injector(record=True) as clean:
        model(ids)
    k = 1
    try:
        while k <= clean.count:
            with pytest.raises(KeyboardInterrupt):
                with Injector(at=k):
                    model(ids)
            assert torch.equal(model(ids).logits, expected), f"after an interrupt at line event {k}"
            assert edit_hooks(model) == hooks
            k += 1
    finally:
        edit.remove()
    assert hook_count(model) == 0 and torch.equal(model(ids).logits, model(ids).logits)


def test_an_interrupt_cutting_a_call_short_is_repaired_by_remove(ids):
    model = tiny_gpt2()
    before = model(ids).logits
    edit = nbgrad.edit(model, STEER)
    with Injector(record=True) as clean:
        model(ids)
    for k in range(1, clean.count + 1, 3):
        with pytest.raises(KeyboardInterrupt):
            with Injector(at=k):
                model(ids)
        edit.remove()
        assert hook_count(model) == 0 and torch.equal(model(ids).logits, before), k
        edit = nbgrad.edit(model, STEER)
    edit.remove()


def test_a_name_the_body_reads_that_is_not_bound_is_said_when_installed(tiny):
    with pytest.raises(NbgradError, match=r"^line 1: model.transformer.h\[i\].output: the module cannot be found "
                                          r"when the edit is installed \(NameError: name 'i' is not defined\)$"):
        nbgrad.edit(tiny, "model.transformer.h[i].output[:] = 0")
    assert hook_count(tiny) == 0


def test_an_interrupt_at_any_line_of_a_later_trace_leaves_the_edit_whole(ids):
    model = tiny_gpt2()
    cell = "h = model.transformer.h[1].output[:, -1].save()\nmodel.transformer.h[2].output[:, 0] = 0\n"
    expected = steered_logits(model, ids)
    edit = nbgrad.edit(model, STEER)
    hooks = edit_hooks(model)
    nbgrad.trace(model, ids, cell)                  # compiled once: the counted lines are those of a run
    with Injector(record=True) as clean:
        nbgrad.trace(model, ids, cell)
    try:
        for k in range(1, clean.count + 1, 2):
            with pytest.raises(KeyboardInterrupt):
                with Injector(at=k):
                    nbgrad.trace(model, ids, cell)
            assert torch.equal(model(ids).logits, expected), f"after an interrupt at line event {k}"
            assert edit_hooks(model) == hooks and active_edits(model) == [edit]
    finally:
        edit.remove()
    assert hook_count(model) == 0


def test_an_edit_of_a_module_the_call_never_runs_says_so_at_each_call_and_stays_whole():
    from torch import nn

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            return self.used(x)
    model = TwoHeads()
    edit = nbgrad.edit(model, "model.unused.output[:] = 0")
    for _ in range(2):
        with pytest.raises(NbgradError) as raised:
            model(torch.ones(1, 3))
        assert str(raised.value) == ("line 1: model.unused.output never came: model.unused never ran during this call "
                                     "of the model (in nbgrad.edit(TwoHeads); `.remove()` takes it off)")
    edit.remove()
    assert hook_count(model) == 0


def test_a_gradient_read_that_feeds_no_edit_is_refused(tiny):
    with pytest.raises(NbgradError) as raised:
        nbgrad.edit(tiny, "g = model.transformer.h[0].output.grad")
    assert str(raised.value).startswith("line 1: `model.transformer.h[0].output.grad` is read here and no edit uses "
                                        "it: an edit has no cell to return a value to")
    assert hook_count(tiny) == 0
