"""The gradient of a replaced output (`M.output = t; M.output.requires_grad_()`), read before the backward line
and inside `with loss.backward():`, against plain hooks on the same weights."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state

PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture(scope="module")
def model():
    return nbgrad.load_model()


def hooked(model, replacement):
    """Plain PyTorch: block 1's MLP output replaced by a leaf copy of `replacement`; d logits.sum() / d it."""
    ids = nbgrad.tokenizer_for(model)(PROMPT, return_tensors="pt")["input_ids"]
    leaf = replacement.clone().requires_grad_()
    handle = model.transformer.h[1].mlp.register_forward_hook(lambda module, args, output: leaf)
    try:
        logits = model(ids).logits
    finally:
        handle.remove()
    return torch.autograd.grad(logits.sum(), leaf)[0]


BEFORE_THE_LINE = """
model.transformer.h[1].mlp.output = replacement.clone()
model.transformer.h[1].mlp.output.requires_grad_()
g = model.transformer.h[1].mlp.output.grad.save()
model.output.logits.sum().backward()
"""
IN_THE_BLOCK = """
model.transformer.h[1].mlp.output = replacement.clone()
model.transformer.h[1].mlp.output.requires_grad_()
with model.output.logits.sum().backward():
    g = model.transformer.h[1].mlp.output.grad.save()
"""
IN_AN_INVOKE = f"""
with invoke({PROMPT!r}):
    model.transformer.h[1].mlp.output = replacement.clone()
    model.transformer.h[1].mlp.output.requires_grad_()
    g = model.transformer.h[1].mlp.output.grad.save()
    loss = model.output.logits.sum()
loss.backward()
"""


@pytest.mark.parametrize("source", [BEFORE_THE_LINE, IN_THE_BLOCK, IN_AN_INVOKE],
                         ids=["before-the-backward-line", "in-the-backward-block", "in-an-invoke"])
def test_grad_of_a_replaced_output_equals_plain_hooks(model, source):
    before = model_state(model)
    torch.manual_seed(0)
    length = len(nbgrad.tokenizer_for(model)(PROMPT)["input_ids"])
    replacement = torch.randn(1, length, model.config.n_embd)
    result = nbgrad.trace(model, None if "invoke(" in source else PROMPT, source,
                          {"model": model, "replacement": replacement})
    assert torch.allclose(result.saved["g"], hooked(model, replacement), atol=1e-5)
    model.zero_grad(set_to_none=True)
    assert_clean(model, before)
