"""`.grad` of a tensor the cell also edits in place. The edit belongs to the forward pass whichever line
comes first (later modules see it, SPEC §2), and `.grad` is the gradient that flows into the value the
tensor holds when the backward pass starts. Checked against plain hooks on the same weights."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state

MODULES = {
    "a view (Conv1D output)": "model.transformer.h[0].mlp.c_fc",
    "a block output": "model.transformer.h[1]",
}
EDITS = {
    "slice assignment": ("{t}[:, 1] = 0.0", lambda out: out.__setitem__((slice(None), 1), 0.0)),
    "in-place method": ("{t}.mul_(0.5)", lambda out: out.mul_(0.5)),
    "augmented assignment": ("{t} *= 0.5", lambda out: out.mul_(0.5)),
}
CELLS = {
    # the edit written after the line that reads the gradient
    "name, grad read first": "h = {m}.output\ng = h.grad.save()\n{edit_h}\n"
                             "logits = model.output.logits.save()\nlogits.sum().backward()",
    "path, grad read first": "h = {m}.output\ng = h.grad.save()\n{edit_m}\n"
                             "logits = model.output.logits.save()\nlogits.sum().backward()",
    "name, backward block": "h = {m}.output\n{edit_h}\nlogits = model.output.logits.save()\n"
                            "with logits.sum().backward():\n    g = h.grad.save()",
}


def plain(model, ids, module, edit):
    """The module's output edited in place by a plain forward hook: the logits, and d logits.sum() / d
    (the edited output)."""
    seen = {}

    def hook(mod, args, output):
        edit(output)
        seen["out"] = output
    handle = module.register_forward_hook(hook)
    try:
        logits = model(ids).logits
    finally:
        handle.remove()
    grad, = torch.autograd.grad(logits.sum(), seen["out"])
    return logits.detach(), grad


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("module", MODULES)
def test_grad_of_a_tensor_edited_in_place(tiny, ids, module, edit, cell):
    before = model_state(tiny)
    path = MODULES[module]
    template, edit_fn = EDITS[edit]
    source = CELLS[cell].format(m=path, edit_h=template.format(t="h"), edit_m=template.format(t=f"{path}.output"))
    result = nbgrad.trace(tiny, ids, source)
    tiny.zero_grad(set_to_none=True)
    logits, grad = plain(tiny, ids, eval(path, {"model": tiny}), edit_fn)
    tiny.zero_grad(set_to_none=True)
    assert torch.allclose(result.saved["logits"], logits, atol=1e-5), "the edit did not reach the forward pass"
    assert torch.allclose(result.saved["g"], grad, atol=1e-5)
    assert_clean(tiny, before)


def test_the_edit_runs_in_the_forward_pass_and_the_read_in_the_backward_pass(tiny, ids):
    result = nbgrad.trace(tiny, ids, CELLS["name, grad read first"].format(
        m="model.transformer.h[0].mlp.c_fc", edit_h="h[:, 1] = 0.0", edit_m=""))
    tiny.zero_grad(set_to_none=True)
    phases = {(run.line, run.phase) for run in result.graph.runs}
    assert (3, "forward") in phases and (3, "backward pass 0") not in phases     # h[:, 1] = 0.0
    assert (2, "backward pass 0") in phases                                     # g = h.grad.save()


GUARD = """
import torch, nbgrad
x = torch.randn(2, 3, 4, requires_grad=True)
out = torch.nn.Linear(4, 4)(x)
out[:, 1] = 0.0            # a view (Linear on a 3-D input) edited in place: torch.register_hook on it crashes
try:
    nbgrad.backward((x * 2).sum(), "g = out.grad.save()", {"x": x, "out": out})
except nbgrad.GradError as error:
    print(error)
"""


def test_a_view_edited_in_place_is_hooked_without_crashing_the_kernel():
    """Plain PyTorch dies with a segmentation fault when it hooks such a view; nbgrad gives the error.
    In a child process, so that a regression fails this test instead of killing the test run."""
    import subprocess
    import sys
    from pathlib import Path
    done = subprocess.run([sys.executable, "-c", GUARD], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "line 1: out.grad was never computed by the backward pass" in done.stdout
    assert done.stdout.strip().endswith("the loss does not depend on out"), done.stdout   # no view hint: it was edited


@pytest.mark.parametrize("made, hint", [
    ("h[:, -1]", "part is a slice taken after the fact"),
    ("h.view(-1)", "part is a view made from another tensor after the fact"),
])
def test_a_part_taken_after_the_fact_says_so(tiny, ids, made, hint):
    source = (f"h = model.transformer.h[1].output\npart = {made}\nlogits = model.output.logits\n"
              "with logits.sum().backward():\n    g = part.grad.save()")
    with pytest.raises(nbgrad.GradError) as caught:
        nbgrad.trace(tiny, ids, source)
    message = str(caught.value)
    assert message.startswith("line 5: part.grad was never computed by the backward pass of line 4")
    assert hint in message


def test_an_augmented_assignment_of_a_gradient_edits_what_flows_on(tiny, ids):
    """`h1.grad *= 0.5` (it used to stop the compiler) halves the gradient block 0 receives."""
    result = nbgrad.trace(tiny, ids, "h0 = model.transformer.h[0].output\nh1 = model.transformer.h[1].output\n"
                                     "with model.output.logits.sum().backward():\n"
                                     "    h1.grad *= 0.5\n    g = h0.grad.save()")
    tiny.zero_grad(set_to_none=True)
    seen = {}

    def keep(index):
        def hook(module, args, output):
            seen[index] = output
            if index == 1:
                output.register_hook(lambda grad: grad * 0.5)
        return hook
    handles = [tiny.transformer.h[i].register_forward_hook(keep(i)) for i in (0, 1)]
    try:
        logits = tiny(ids).logits
    finally:
        for handle in handles:
            handle.remove()
    expected, = torch.autograd.grad(logits.sum(), seen[0])
    assert torch.allclose(result.saved["g"], expected, atol=1e-5)


def test_a_gradient_edited_in_place_by_its_one_reader_is_a_copy(tiny, ids):
    """`mlp.grad[:, 0] = 0`, the one statement waiting for that gradient: the cell edits a copy, which flows on in
    its place, as a plain hook returning an edited clone does. Autograd hands the MLP's output and the residual
    branch one tensor: editing it would change both, which every parameter's gradient tells apart."""
    nbgrad.trace(tiny, ids, "mlp = model.transformer.h[1].mlp.output\n"
                            "with model.output.logits.sum().backward():\n    mlp.grad[:, 0] = 0")
    ours = {name: param.grad.clone() for name, param in tiny.named_parameters()}
    tiny.zero_grad(set_to_none=True)

    def edited(grad):
        grad = grad.clone()
        grad[:, 0] = 0
        return grad

    def hook(module, args, output):
        output.register_hook(edited)
    handle = tiny.transformer.h[1].mlp.register_forward_hook(hook)
    try:
        tiny(ids).logits.sum().backward()
    finally:
        handle.remove()
    plain = {name: param.grad for name, param in tiny.named_parameters()}
    tiny.zero_grad(set_to_none=True)
    assert ours.keys() == plain.keys()
    for name, grad in plain.items():
        assert torch.allclose(ours[name], grad, atol=1e-6), name
