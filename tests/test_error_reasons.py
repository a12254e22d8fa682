"""Errors say what the cell wrote and why: a statement that comes too late because it reads a name a later
event's statement changes says which name and line; an unrolled loop's per-iteration names read as the cell's own."""
import json

import pytest
import torch

import nbgrad
from nbgrad.errors.naming import LOOP_PREFIX, as_written, loop_name
from helpers import alone, assert_clean, model_state

EIFFEL = "The Eiffel Tower is in the city of"
COLOSSEUM = "The Colosseum is in the city of"
PARIS = "Paris is the capital of"


@pytest.fixture(scope="module")
def model():
    return nbgrad.load_model()


def test_a_list_appended_by_invokes_is_read_by_a_later_invoke(model):
    result = nbgrad.trace(model, None, f"""
outs = []
with invoke({EIFFEL!r}):
    outs.append(model.transformer.h[1].output[:, -1])
with invoke({COLOSSEUM!r}):
    outs.append(model.transformer.h[1].output[:, -1])
with invoke({PARIS!r}):
    model.transformer.h[2].output[:, -1] = torch.stack(outs).mean(0)
    logits = model.lm_head.output[:, -1].save()
""", {"model": model, "torch": torch}, no_grad=True)
    mean = (alone(model, EIFFEL, 1)[0][:, -1] + alone(model, COLOSSEUM, 1)[0][:, -1]) / 2

    def patch(output):
        output[:, -1] = mean
    expected = alone(model, PARIS, 2, edit=patch)[1]
    assert torch.allclose(result.saved["logits"], expected[:, -1], atol=1e-4)


def test_a_read_of_a_list_a_later_event_appends_to_says_which_name_and_line(model):
    before = model_state(model)
    namespace = {"model": model}
    with pytest.raises(nbgrad.OrderError) as caught:
        nbgrad.trace(model, None, f"""
outs = []
with invoke({EIFFEL!r}):
    outs.append(model.transformer.h[1].output[:, -1])
with invoke({COLOSSEUM!r}):
    outs.append(model.transformer.h[3].output[:, -1])
with invoke({PARIS!r}):
    model.transformer.h[2].output[:, -1] = outs[0]
""", namespace)
    assert str(caught.value) == (
        "line 8: model.transformer.h[2].output is edited too late: model.transformer.h[2] has already run and later "
        "modules have used its output; the statement reads `outs`, which line 6 binds or changes, so it could only "
        "run once model.transformer.h[3].output (line 6) existed. Move the edit so it only needs earlier values")
    assert_clean(model, before)
    assert "outs" not in namespace
    assert nbgrad.trace(model, EIFFEL, "h = model.transformer.h[2].output.save()", namespace).saved["h"] is not None


GRAD_LOOP = """
grads = []
for i in range(2):
    attn_out = model.transformer.h[i].attn.output[0]{slice}
    grads.append(attn_out.grad.save())
{backward}"""


@pytest.mark.parametrize("cell, no_grad, message", [
    (GRAD_LOOP.format(slice="", backward=""), False,
     "line 5: attn_out.grad is read, but the cell runs no backward pass: add `loss.backward()` or `with "
     "loss.backward():` to the cell, or use %%backward LOSS in a later cell (`attn_out` of the loop's iteration 1)"),
    (GRAD_LOOP.format(slice="[:, -1]", backward="model.output.logits.sum().backward()"), False,
     "line 5: attn_out.grad was never computed by the backward pass of line 6 (model.output.logits.sum().backward()): "
     "the loss does not depend on attn_out. attn_out is a slice taken after the fact: slicing makes a new tensor that "
     "the loss never used. Read .grad of the tensor itself, then slice the gradient: for attn_out = M.output[0], "
     "write M.output.grad[0] (`attn_out` of the loop's iteration 1)"),
    (GRAD_LOOP.format(slice="", backward="model.output.logits.sum().backward()"), True,
     "line 5: attn_out.grad: the cell ran under --no-grad / torch.no_grad(), so nothing records gradients; drop "
     "--no-grad (`attn_out` of the loop's iteration 1)"),
], ids=["no backward pass", "a slice's gradient", "no grad"])
def test_an_unrolled_loop_error_names_what_the_cell_wrote(model, cell, no_grad, message):
    before = model_state(model)
    with pytest.raises(nbgrad.GradError) as caught:
        nbgrad.trace(model, EIFFEL, cell, {"model": model}, no_grad=no_grad)
    assert str(caught.value) == message
    model.zero_grad(set_to_none=True)       # a backward pass that ran before the error filled the parameters' .grad
    assert_clean(model, before)


def test_a_too_late_edit_in_a_loop_of_invokes_names_the_loops_variable(model):
    before = model_state(model)
    with pytest.raises(nbgrad.OrderError) as caught:
        nbgrad.trace(model, None, f"""
for prompt in [{EIFFEL!r}, {COLOSSEUM!r}]:
    with invoke(prompt):
        later = model.transformer.h[2].output
        model.transformer.h[0].output[:] = later
""", {"model": model})
    assert str(caught.value) == (
        "line 5: model.transformer.h[0].output is edited too late: model.transformer.h[0] has already run and later "
        "modules have used its output; the statement reads `later`, which line 4 binds or changes, so it could only "
        "run once model.transformer.h[2].output (line 4) existed. Move the edit so it only needs earlier values "
        "(`later` of the loop's iteration 1)")
    assert_clean(model, before)


def test_the_hook_graph_of_an_unrolled_loop_names_what_the_cell_wrote(model):
    result = nbgrad.trace(model, EIFFEL, GRAD_LOOP.format(slice="", backward="model.output.logits.sum().backward()"),
                          {"model": model})
    model.zero_grad(set_to_none=True)
    text, data = result.graph.to_text(), result.graph.to_dict()
    assert "  attn_out.grad (iteration 1)  [tensor hook]  line 5 reads" in text
    assert "  attn_out.grad (iteration 2)  [tensor hook]  line 5 reads" in text
    assert ("attn_out.grad (iteration 1)", "backward pass 0") in [(run.woke_by, run.phase) for run in result.graph.runs]
    assert {"kind": "grad", "target": "attn_out", "line": 5, "write": False} in data["nodes"][2]["events"]
    assert LOOP_PREFIX not in text and LOOP_PREFIX not in json.dumps(data)


def test_as_written_says_each_name_and_its_iteration():
    first, second = loop_name(1, 0, "attn_out"), loop_name(12, 3, "_h")
    assert as_written(f"{first}.grad and {second}[0]") == \
        "attn_out.grad and _h[0] (`attn_out` of the loop's iteration 1) (`_h` of the loop's iteration 4)"
    assert as_written(f"{first}.grad", "label") == "attn_out.grad (iteration 1)"
    assert as_written(first, "") == "attn_out"
    assert as_written("x_nbgrad_loop_1_0_y") == "x_nbgrad_loop_1_0_y"        # not a loop's name: left as it is
