"""`.grad` of a part of a module's output (`M.output[0].grad`, `M.output[:, -1].grad`), written before the line that
starts the backward pass, inside a backward block or after it: that part of the gradient into what the module
returned, as `register_hook` on the output gives it; for a tuple output, `.grad` of the element. Edits of such a
part edit the gradient that flows on. Refused before ("a slice taken after the fact")."""
import pytest
import torch

import nbgrad
from helpers import hook_count, tiny_gpt2

MODEL = tiny_gpt2(n_layer=3, seed=7)
IDS = torch.tensor([[3, 17, 42, 5, 88, 9], [8, 1, 60, 2, 33, 4]])
LOSS = "model.output.logits[:, -1].max(-1).values.sum()"


def plain_grads(edit=None):
    """register_hook on block 1's output and on its attention's first output: (block 1's gradient, the attention's,
    block 0's); `edit(grad)` replaces block 1's gradient first."""
    kept, handles = {}, []

    def on_block(index):
        def hook(module, args, output):
            def keep(grad):
                if index == 1 and edit is not None:
                    grad = edit(grad.clone())
                kept[index] = grad
                return grad
            output.register_hook(keep)
        return hook
    def on_attention(module, args, output):
        output[0].register_hook(lambda grad: kept.__setitem__("attn", grad))
    handles.append(MODEL.transformer.h[1].attn.register_forward_hook(on_attention))
    for index in (0, 1):
        handles.append(MODEL.transformer.h[index].register_forward_hook(on_block(index)))
    try:
        logits = MODEL(IDS).logits
        logits[:, -1].max(-1).values.sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    MODEL.zero_grad(set_to_none=True)
    return kept[1], kept["attn"], kept[0]


READS = {
    "before the backward line": f"g = model.transformer.h[1].output{{part}}.grad.save()\n{LOSS}.backward()",
    "before a backward block": f"g = model.transformer.h[1].output{{part}}.grad.save()\nwith {LOSS}.backward():\n    pass",
    "inside the block": f"with {LOSS}.backward():\n    g = model.transformer.h[1].output{{part}}.grad.save()",
    "inside, forward order": (f"with {LOSS}.backward():\n    g = model.transformer.h[1].output{{part}}.grad.save()\n"
                              f"    g0 = model.transformer.h[0].output.grad.save()"),
    "after the backward line": f"{LOSS}.backward()\ng = model.transformer.h[1].output{{part}}.grad.save()",
}
PARTS = {"[0]": lambda grad: grad[0], "[:, -1]": lambda grad: grad[:, -1], "[1, 2:]": lambda grad: grad[1, 2:]}


@pytest.mark.parametrize("where", sorted(READS))
@pytest.mark.parametrize("part", sorted(PARTS))
def test_the_grad_of_a_part_of_an_output_is_that_part_of_its_gradient(where, part):
    block, _, _ = plain_grads()
    result = nbgrad.trace(MODEL, IDS, READS[where].format(part=part))
    MODEL.zero_grad(set_to_none=True)
    torch.testing.assert_close(result.saved["g"], PARTS[part](block), rtol=0, atol=0)
    assert hook_count(MODEL) == 0


def test_the_grad_of_an_element_of_a_tuple_output_is_that_elements_gradient():
    _, attention, _ = plain_grads()
    result = nbgrad.trace(MODEL, IDS, f"g = model.transformer.h[1].attn.output[0].grad.save()\n{LOSS}.backward()")
    MODEL.zero_grad(set_to_none=True)
    torch.testing.assert_close(result.saved["g"], attention, rtol=0, atol=0)


def test_an_edit_of_a_part_edits_the_gradient_that_flows_on():
    def zero_last(grad):
        grad[:, -1] = 0
        return grad
    _, _, expected = plain_grads(zero_last)
    cell = (f"model.transformer.h[1].output[:, -1].grad[:] = 0\ng0 = model.transformer.h[0].output.grad.save()\n"
            f"{LOSS}.backward()")
    result = nbgrad.trace(MODEL, IDS, cell)
    MODEL.zero_grad(set_to_none=True)
    torch.testing.assert_close(result.saved["g0"], expected, rtol=0, atol=0)
    assert not torch.equal(expected, plain_grads()[2])       # the edit changes what flows into block 0


@pytest.mark.parametrize("where", ["before", "inside"])
def test_a_part_of_the_gradient_replaced_flows_on_with_the_rest_as_it_came(where):
    def zero_last(grad):
        grad[:, -1] = 0
        return grad
    _, _, expected = plain_grads(zero_last)
    replace = "model.transformer.h[1].output[:, -1].grad = torch.zeros(2, 32)"
    cell = (f"{replace}\ng0 = model.transformer.h[0].output.grad.save()\n{LOSS}.backward()" if where == "before" else
            f"with {LOSS}.backward():\n    {replace}\n    g0 = model.transformer.h[0].output.grad.save()")
    result = nbgrad.trace(MODEL, IDS, cell, {"model": MODEL, "torch": torch})
    MODEL.zero_grad(set_to_none=True)
    torch.testing.assert_close(result.saved["g0"], expected, rtol=0, atol=0)
    assert hook_count(MODEL) == 0


def test_a_part_bound_to_a_name_is_refused_with_what_to_write():
    cell = f"h = model.transformer.h[1].output[0]\ng = h.grad.save()\n{LOSS}.backward()"
    with pytest.raises(nbgrad.GradError, match=r"h is a slice taken after the fact.*Read \.grad of the tensor itself, "
                                               r"then slice the gradient"):
        nbgrad.trace(MODEL, IDS, cell)
    assert hook_count(MODEL) == 0
