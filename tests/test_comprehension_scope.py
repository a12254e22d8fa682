"""A comprehension's variable is its own scope: a later loop that reuses the name does not wait for the
comprehension (which gave a false OrderError). Checked against plain tensor hooks on the same weights."""
import torch

import nbgrad
from helpers import assert_clean, model_state

CELL = """h = model.transformer.h
g = [{var}.output.grad.save() for {var} in reversed(h)]
for b in reversed(h):
    b.mlp.output.grad[:] = 0
model.output.logits[0, -1].max().backward()
"""


def plain_grads(model, ids):
    """The oracle: each block's output gradient, with the gradient into every MLP's output set to zero."""
    kept, handles = {}, []

    def zero_mlp_grad(module, args, out):
        out.register_hook(torch.zeros_like)

    def keep_block_grad(index):
        def hook(module, args, out):
            out.register_hook(lambda grad: kept.__setitem__(index, grad))
        return hook
    for index, block in enumerate(model.transformer.h):
        handles += [block.mlp.register_forward_hook(zero_mlp_grad), block.register_forward_hook(keep_block_grad(index))]
    try:
        model(input_ids=ids).logits[0, -1].max().backward()
    finally:
        for handle in handles:
            handle.remove()
    return [kept[index] for index in reversed(range(len(model.transformer.h)))]


def test_a_comprehension_variable_reused_by_a_later_loop_is_no_order_error(default_model):
    model = default_model
    before = model_state(model)
    ids = torch.tensor([[5, 9, 2, 7, 11]])
    expected = plain_grads(model, ids)
    model.zero_grad(set_to_none=True)
    for var in ("b", "c"):          # the same name as the loop's, and another: the same values
        namespace = {"model": model}
        nbgrad.trace(model, ids, CELL.format(var=var), namespace)
        assert len(namespace["g"]) == len(expected)
        for got, want in zip(namespace["g"], expected):
            torch.testing.assert_close(got, want)
        model.zero_grad(set_to_none=True)
    assert_clean(model, before)


def test_a_name_read_outside_the_comprehension_still_orders_the_statements(default_model):
    """`[x * k for k in ...]` reads the cell's `x`: a later statement rebinding x still waits for it."""
    ids = torch.tensor([[5, 9, 2]])
    kept = {}
    handle = default_model.transformer.h[0].register_forward_hook(lambda m, a, out: kept.update(x=out[0, -1, 0].item()))
    try:
        with torch.no_grad():
            default_model(input_ids=ids)
    finally:
        handle.remove()
    namespace = {"model": default_model}
    nbgrad.trace(default_model, ids, "x = model.transformer.h[0].output[0, -1, 0].item()\n"
                 "ys = [x * k for k in range(3)]\nx = model.transformer.h[1].output[0, -1, 0].item()\n", namespace)
    assert namespace["ys"] == [0, kept["x"], kept["x"] * 2] and namespace["x"] != kept["x"]
