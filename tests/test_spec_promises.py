"""Promises of SPEC §2–§3 that had no test of their own, each against plain PyTorch on the same weights."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2


@pytest.fixture
def model():
    return tiny_gpt2(n_layer=4)


@pytest.fixture
def ids():
    return torch.tensor([[7, 3, 64, 12, 9]])


def forward_with(model, ids, modules, edit=None, grad_edit=None, loss_fn=lambda logits: logits.sum()):
    """Plain hooks: outputs of `modules` (after `edit(i, out)`), gradients into them (after
    `grad_edit(i, grad)`), and the logits. Parameter .grads are cleared afterwards."""
    outputs, grads, handles = {}, {}, []
    for index, module in enumerate(modules):
        def hook(mod, args, output, index=index):
            if edit is not None:
                edited = edit(index, output)
                output = output if edited is None else edited
            outputs[index] = output

            def on_grad(grad, index=index):
                if grad_edit is not None:
                    edited = grad_edit(index, grad)
                    grad = grad if edited is None else edited
                grads[index] = grad
                return grad
            if output.requires_grad:
                output.register_hook(on_grad)
            return output
        handles.append(module.register_forward_hook(hook))
    try:
        logits = model(ids).logits
        if grad_edit is not None or loss_fn is not None:
            loss_fn(logits).backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return outputs, grads, logits


def test_getattr_paths(model, ids):
    before = model_state(model)
    result = nbgrad.trace(model, ids, """
block = getattr(model.transformer, "h")[1].output.save()
mlp = getattr(model.transformer.h[2], "mlp").output.save()
getattr(getattr(model, "transformer"), "h")[0].output[:] *= 2
logits = model.output.logits.save()
""")
    model.zero_grad(set_to_none=True)
    blocks = model.transformer.h
    outputs, _, logits = forward_with(model, ids, [blocks[0], blocks[1], blocks[2].mlp],
                                      edit=lambda i, out: out.mul_(2) if i == 0 else None, loss_fn=None)
    assert not torch.allclose(logits, model(ids).logits)
    assert torch.equal(result.saved["block"], outputs[1])
    assert torch.equal(result.saved["mlp"], outputs[2])
    assert torch.equal(result.saved["logits"], logits)
    assert_clean(model, before)


def test_batch_encoding_input(default_model):
    tokenizer = nbgrad.tokenizer_for(default_model)
    encoding = tokenizer(["The cat sat on it", "A dog"], return_tensors="pt", padding=True)
    assert type(encoding).__name__ == "BatchEncoding" and not bool(encoding["attention_mask"].all())
    result = nbgrad.trace(default_model, encoding, """
hs = model.transformer.h[0].output.save()
logits = model.output.logits.save()
""")
    seen = {}
    handle = default_model.transformer.h[0].register_forward_hook(lambda m, a, o: seen.update(hs=o))
    try:
        expected = default_model(**encoding).logits          # the mask matters for the padded row
    finally:
        handle.remove()
    assert torch.equal(result.saved["hs"], seen["hs"])
    assert torch.equal(result.saved["logits"], expected)
    assert not torch.allclose(expected, default_model(encoding["input_ids"]).logits)


def test_inputs_values_equal_the_call(model):
    ids = torch.tensor([[5, 6, 7, 8]])
    mask = torch.tensor([[0, 1, 1, 1]])
    namespace = {"model": model, "torch": torch}
    nbgrad.trace(model, {"input_ids": ids, "attention_mask": mask}, """
args, kwargs = model.transformer.h[1].inputs
first = model.transformer.h[1].input.save()
first_arg = args[0].clone().save()
n_args = len(args)
names = sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
totals = [float(kwargs[k].float().sum()) for k in names]
others = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
""", namespace)
    called = {}
    handle = model.transformer.h[1].register_forward_pre_hook(
        lambda m, a, k: called.update(args=a, kwargs=k), with_kwargs=True)
    try:
        model(input_ids=ids, attention_mask=mask)
    finally:
        handle.remove()
    assert namespace["n_args"] == len(called["args"])
    assert torch.equal(namespace["first"], called["args"][0])
    assert torch.equal(namespace["first_arg"], called["args"][0])
    tensors = sorted(k for k, v in called["kwargs"].items() if isinstance(v, torch.Tensor))
    assert tensors and namespace["names"] == tensors
    assert namespace["totals"] == [float(called["kwargs"][k].float().sum()) for k in tensors]
    assert namespace["others"] == {k: v for k, v in called["kwargs"].items() if not isinstance(v, torch.Tensor)}


def test_nbgrad_save_keeps_a_value(model, ids):
    namespace = {"model": model, "nbgrad": nbgrad}
    result = nbgrad.trace(model, ids, """
hs = nbgrad.save(model.transformer.h[1].output)
same = nbgrad.save(hs) is hs
doubled = nbgrad.save(model.transformer.h[2].output * 2)
""", namespace)
    outputs, _, _ = forward_with(model, ids, [model.transformer.h[1], model.transformer.h[2]], loss_fn=None)
    assert torch.equal(namespace["hs"], outputs[0]) and torch.equal(result.saved["hs"], outputs[0])
    assert torch.equal(result.saved["doubled"], outputs[1] * 2)
    assert namespace["same"] is True
    assert nbgrad.save(3) == 3          # outside a cell it returns its argument


def test_mul_edit_of_an_output(model, ids):
    result = nbgrad.trace(model, ids, """
model.transformer.h[1].output.mul_(0.25)
logits = model.output.logits.save()
""")
    model.zero_grad(set_to_none=True)
    _, _, logits = forward_with(model, ids, [model.transformer.h[1]], edit=lambda i, out: out.mul_(0.25),
                                loss_fn=None)
    assert torch.equal(result.saved["logits"], logits)
    assert not torch.allclose(logits, model(ids).logits)


def test_mul_edit_of_a_grad(model, ids):
    result = nbgrad.trace(model, ids, """
late = model.transformer.h[3].output
early = model.transformer.h[0].output
with model.output.logits.sum().backward():
    late.grad.mul_(-3)
    g = early.grad.save()
""")
    model.zero_grad(set_to_none=True)
    _, grads, _ = forward_with(model, ids, [model.transformer.h[0], model.transformer.h[3]],
                               grad_edit=lambda i, g: g * -3 if i == 1 else None)
    _, plain, _ = forward_with(model, ids, [model.transformer.h[0]])
    assert torch.allclose(result.saved["g"], grads[0], atol=1e-6)
    assert not torch.allclose(result.saved["g"], plain[0])


def test_mul_edit_of_a_module_output_grad_by_its_path(model, ids):
    result = nbgrad.trace(model, ids, """
with model.output.logits.sum().backward():
    model.transformer.h[3].output.grad.mul_(-3)
    g = model.transformer.h[0].output.grad.save()
""")
    model.zero_grad(set_to_none=True)
    _, grads, _ = forward_with(model, ids, [model.transformer.h[0], model.transformer.h[3]],
                               grad_edit=lambda i, g: g * -3 if i == 1 else None)
    assert torch.allclose(result.saved["g"], grads[0], atol=1e-6)


def test_a_flag_change_between_reads_keeps_any_order(model, ids):
    flags = [p.requires_grad for p in model.parameters()]
    result = nbgrad.trace(model, ids, """
late = model.transformer.h[1].output.clone().save()
model.transformer.h[0].mlp.c_fc.weight.requires_grad_(False)
early = model.transformer.h[0].output.clone().save()
""")
    outputs, _, _ = forward_with(model, ids, [model.transformer.h[0], model.transformer.h[1]], loss_fn=None)
    assert torch.equal(result.saved["early"], outputs[0]) and torch.equal(result.saved["late"], outputs[1])
    assert [p.requires_grad for p in model.parameters()] == flags


def test_grad_of_a_derived_tensor_that_is_no_module_output(model, ids):
    result = nbgrad.trace(model, ids, """
probs = model.lm_head.output.softmax(-1)
picked = probs[0, -1, 5]
with picked.log().backward():
    g = probs.grad.save()
""")
    model.zero_grad(set_to_none=True)
    probs = model(ids).logits.softmax(-1)
    (expected,) = torch.autograd.grad(probs[0, -1, 5].log(), probs)
    assert torch.allclose(result.saved["g"], expected)


@pytest.mark.parametrize("order", ["forward", "reverse", "edit after the read it changes"])
def test_backward_body_in_any_order(model, ids, order):
    outputs, _, logits = forward_with(model, ids, [model.transformer.h[0], model.transformer.h[3]], loss_fn=None)
    namespace = {"h0": outputs[0], "h3": outputs[1]}
    bodies = {
        "forward": "g0 = h0.grad.clone().save()\ng3 = h3.grad.clone().save()",
        "reverse": "g3 = h3.grad.clone().save()\ng0 = h0.grad.clone().save()",
        "edit after the read it changes": "g0 = h0.grad.clone().save()\nh3.grad[:, :2] = 0\ng3 = h3.grad.clone().save()",
    }
    nbgrad.backward(logits.sum(), bodies[order], namespace)
    model.zero_grad(set_to_none=True)
    edit = None
    if order.startswith("edit"):
        def edit(index, grad):
            if index == 1:
                grad = grad.clone()
                grad[:, :2] = 0
                return grad
    _, grads, _ = forward_with(model, ids, [model.transformer.h[0], model.transformer.h[3]], grad_edit=edit)
    assert torch.allclose(namespace["g0"], grads[0], atol=1e-6)
    assert torch.allclose(namespace["g3"], grads[1], atol=1e-6)
