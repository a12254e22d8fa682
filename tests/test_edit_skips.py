"""A skip (`M.skip(v)`) in an edit holds for the call that makes it only: a call whose statement does not skip
(a condition now false, a loop now over other blocks) runs the module, equal to plain hooks, and a later trace
cell sees the model as the edit leaves it at that call."""
import pytest
import torch

import nbgrad
from helpers import tiny_gpt2

IDS = torch.tensor([[3, 14, 15, 9]])


@pytest.fixture
def model():
    return tiny_gpt2(n_layer=3)


def plain(model, skipped):
    """The logits with each block in `skipped` passing its input on, by plain forward hooks."""
    handles = [model.transformer.h[i].register_forward_hook(lambda module, args, output: args[0]) for i in skipped]
    try:
        return model(IDS).logits
    finally:
        for handle in handles:
            handle.remove()


SKIP_IN_A_LOOP = "for i in chosen:\n    model.transformer.h[i].skip(model.transformer.h[i].input)\n"
SKIP_UNDER_A_CONDITION = "if on[0]:\n    model.transformer.h[1].skip(model.transformer.h[1].input)\n"


def test_a_skip_in_a_loop_does_not_carry_to_the_next_call(model):
    chosen = [0, 1]
    expected = {(0, 1): plain(model, [0, 1]), (2,): plain(model, [2]), (): plain(model, [])}
    with nbgrad.edit(model, SKIP_IN_A_LOOP, {"model": model, "chosen": chosen}):
        for now in [(0, 1), (2,), (), (0, 1)]:
            chosen[:] = now
            assert torch.allclose(model(IDS).logits, expected[now], atol=1e-6), now
    assert torch.equal(model(IDS).logits, expected[()])


def test_a_skip_under_a_condition_does_not_carry_to_the_next_call_nor_to_a_trace(model):
    on = [True]
    skipped, whole = plain(model, [1]), plain(model, [])
    cell = "logits = model.lm_head.output.save()\n"
    with nbgrad.edit(model, SKIP_UNDER_A_CONDITION, {"model": model, "on": on}):
        assert torch.allclose(model(IDS).logits, skipped, atol=1e-6)
        on[0] = False
        assert torch.allclose(model(IDS).logits, whole, atol=1e-6)
        assert torch.allclose(nbgrad.trace(model, IDS, cell).saved["logits"], whole, atol=1e-6)
        on[0] = True
        assert torch.allclose(nbgrad.trace(model, IDS, cell).saved["logits"], skipped, atol=1e-6)
        on[0] = False
        assert torch.allclose(model(IDS).logits, whole, atol=1e-6)
