"""Gradients inside traces and %%backward, each against plain register_hook on the same weights."""
import pytest
import torch
from torch import nn

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2


def raw_grads(model, ids, modules, loss_fn=lambda logits: logits.sum(), edit=None, frozen=False):
    """Gradients flowing into the outputs of `modules` with plain hooks; `edit(index, grad)` may replace one."""
    grads, handles = {}, []
    for index, module in enumerate(modules):
        def forward_hook(mod, args, output, index=index):
            if frozen:
                output.requires_grad_(True)

            def grad_hook(grad, index=index):
                if edit is not None:
                    replaced = edit(index, grad)
                    if replaced is not None:
                        grad = replaced
                grads[index] = grad
                return grad
            output.register_hook(grad_hook)
        handles.append(module.register_forward_hook(forward_hook))
    try:
        loss_fn(model(ids).logits).backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return grads


@pytest.fixture
def model():
    return tiny_gpt2()


@pytest.fixture
def ids():
    return torch.tensor([[5, 17, 42, 8, 61]])


def run(model, ids, source, **options):
    result = nbgrad.trace(model, ids, source, **options)
    model.zero_grad(set_to_none=True)
    return result


def test_block_output_grad_inside_backward_block(model, ids):
    before = model_state(model)
    result = run(model, ids, """
hs = model.transformer.h[1].output
hs.requires_grad_(True)
logits = model.output.logits
with logits.sum().backward():
    g = hs.grad.save()
""")
    expected = raw_grads(model, ids, [model.transformer.h[1]])
    assert torch.allclose(result.saved["g"], expected[0])
    assert_clean(model, before)


@pytest.mark.parametrize("order", ["reverse", "forward"])
def test_several_layers_in_any_order(model, ids, order):
    layers = [3, 2, 1, 0] if order == "reverse" else [0, 1, 2, 3]
    lines = "\n".join(f"    g{i} = model.transformer.h[{i}].output.grad.save()" for i in layers)
    result = run(model, ids, f"logits = model.output.logits\nwith logits.sum().backward():\n{lines}\n")
    expected = raw_grads(model, ids, list(model.transformer.h))
    for i in layers:
        assert torch.allclose(result.saved[f"g{i}"], expected[i]), i


def test_gradients_read_in_forward_order_with_names_bound_in_the_forward(model, ids):
    result = run(model, ids, """
h0 = model.transformer.h[0].output
h3 = model.transformer.h[3].output
with model.output.logits.sum().backward():
    first = h0.grad.save()
    last = h3.grad.save()
""")
    expected = raw_grads(model, ids, [model.transformer.h[0], model.transformer.h[3]])
    assert torch.allclose(result.saved["first"], expected[0])
    assert torch.allclose(result.saved["last"], expected[1])


def test_ablate_gradient_in_place_reaches_earlier_layers(model, ids):
    result = run(model, ids, """
hs = model.transformer.h[2].output
early = model.transformer.h[0].output
with model.output.logits.sum().backward():
    before = hs.grad.clone().save()
    hs.grad[:, 1:] = 0
    after = hs.grad.save()
    early_grad = early.grad.save()
""")

    def ablate(index, grad):
        if index == 1:
            grad = grad.clone()
            grad[:, 1:] = 0
            return grad
    expected = raw_grads(model, ids, [model.transformer.h[0], model.transformer.h[2]], edit=ablate)
    plain = raw_grads(model, ids, [model.transformer.h[0]])
    assert result.saved["before"][:, 1:].abs().sum() > 0
    assert result.saved["after"][:, 1:].abs().sum() == 0
    assert torch.allclose(result.saved["early_grad"], expected[0])
    assert not torch.allclose(result.saved["early_grad"], plain[0])


def test_ablate_gradient_by_replacement(model, ids):
    result = run(model, ids, """
hs = model.transformer.h[2].output
early = model.transformer.h[1].output
with model.output.logits.sum().backward():
    hs.grad = torch.zeros(hs.grad.shape)
    early_grad = early.grad.save()
""", namespace={"model": model, "torch": torch})
    expected = raw_grads(model, ids, [model.transformer.h[1], model.transformer.h[2]],
                         edit=lambda i, g: torch.zeros_like(g) if i == 1 else None)
    assert torch.allclose(result.saved["early_grad"], expected[0])
    assert result.saved["early_grad"].abs().sum() == 0


def test_grad_statements_before_the_backward_line(model, ids):
    result = run(model, ids, """
hs = model.transformer.h[1].output
g = hs.grad.save()
hs.grad[:] = hs.grad * 2
early = model.transformer.h[0].output.grad.save()
model.output.logits.sum().backward()
""")
    expected = raw_grads(model, ids, [model.transformer.h[0], model.transformer.h[1]],
                         edit=lambda i, g: g * 2 if i == 1 else None)
    assert torch.allclose(result.saved["early"], expected[0])
    assert torch.allclose(result.saved["g"] * 2, expected[1])


def test_two_backward_passes_each_reads_its_own(model, ids):
    result = run(model, ids, """
hs = model.transformer.h[1].output
logits = model.output.logits
with logits.sum().backward(retain_graph=True):
    first = hs.grad.save()
with (logits * 2).sum().backward():
    second = hs.grad.save()
""")
    expected = raw_grads(model, ids, [model.transformer.h[1]])
    assert torch.allclose(result.saved["first"], expected[0])
    assert torch.allclose(result.saved["second"], 2 * expected[0], rtol=1e-4, atol=1e-5)


def test_a_backward_block_inside_another_reads_its_own_pass(model, ids):
    """The inner `with` block's `.grad` is the inner pass's gradient, the outer block's the outer's (a nested
    block once took the outer pass for its body)."""
    result = run(model, ids, """
hs = model.transformer.h[1].output
logits = model.output.logits
with logits.sum().backward(retain_graph=True):
    outer = hs.grad.save()
    with (logits * 2).sum().backward(retain_graph=True):
        inner = hs.grad.save()
""")
    expected = raw_grads(model, ids, [model.transformer.h[1]])
    assert torch.allclose(result.saved["outer"], expected[0])
    assert torch.allclose(result.saved["inner"], 2 * expected[0], rtol=1e-4, atol=1e-5)
    assert [node.block for node in result.graph.nodes] == [None, None, None, 0, 0, 1]


def test_two_passes_as_statements(model, ids):
    result = run(model, ids, """
hs = model.transformer.h[1].output
logits = model.output.logits
one = hs.grad.save()
logits.sum().backward(retain_graph=True)
two = hs.grad.save()
(logits * 3).sum().backward()
""")
    expected = raw_grads(model, ids, [model.transformer.h[1]])
    assert torch.allclose(result.saved["one"], expected[0])
    assert torch.allclose(result.saved["two"], 3 * expected[0], rtol=1e-4, atol=1e-5)


def test_standalone_backward_cell_reads_grad_of_saved_tensor(shell, model, ids):
    shell.user_ns.update(net=model, ids=ids)
    shell.run_cell_magic("trace", "net ids -q", """
hs = net.transformer.h[1].output.requires_grad_(True).save()
logits = net.output.logits.save()
""")
    before = model_state(model)
    shell.run_cell_magic("backward", "logits.sum() -q", "g = hs.grad.save()")
    # backward() accumulates into parameters, as in PyTorch
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    model.zero_grad(set_to_none=True)
    expected = raw_grads(model, ids, [model.transformer.h[1]])
    assert torch.allclose(shell.user_ns["g"], expected[0])
    assert model_state(model)[0] == before[0]


def test_retain_grad_inside_trace_then_grad_after(model, ids):
    result = run(model, ids, """
hs = model.transformer.h[2].output.save()
hs.retain_grad()
model.output.logits.sum().backward()
""")
    expected = raw_grads(model, ids, [model.transformer.h[2]])
    assert torch.allclose(result.saved["hs"].grad, expected[0])


def test_autograd_lessons_on_plain_tensors(shell):
    ns = shell.user_ns
    shell.run_cell("x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)\nz = (x ** 2).sum()")
    (once,) = torch.autograd.grad((ns["x"] ** 2).sum(), ns["x"])
    shell.run_line_magic("backward", "z -q")
    assert torch.equal(ns["x"].grad, once)
    # accumulation over a second pass, then zero_()
    shell.run_cell("z = (x ** 2).sum()")
    shell.run_line_magic("backward", "z -q")
    assert torch.equal(ns["x"].grad, once + once)
    ns["x"].grad.zero_()
    # vector-Jacobian product
    shell.run_cell("y = x * torch.tensor([1.0, 10.0, 100.0])\nv = torch.tensor([1.0, 1.0, 0.5])")
    (vjp,) = torch.autograd.grad(ns["y"], ns["x"], grad_outputs=ns["v"], retain_graph=True)
    shell.run_line_magic("backward", "y --grad-output v -q")
    assert torch.equal(ns["x"].grad, vjp)


def test_backward_api_reports_leaf_grads_and_accumulation():
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    first = nbgrad.backward((x * w).sum(), namespace={"x": x, "w": w})
    assert set(first.leaf_grads) == {"x", "w"} and first.accumulated == set()
    second = nbgrad.backward((x * w).sum(), namespace={"x": x, "w": w})
    assert second.accumulated == {"x", "w"}
    assert torch.equal(x.grad, 2 * w.detach())


def test_editing_a_parameter_gradient_equals_a_clamping_hook():
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(16, 4) * 5
    handle = net[0].weight.register_hook(lambda g: g.clamp(-0.1, 0.1))
    net(x).sum().backward()
    handle.remove()
    expected = net[0].weight.grad.clone()
    net.zero_grad(set_to_none=True)
    loss = net(x).sum()
    nbgrad.backward(loss, "net[0].weight.grad = net[0].weight.grad.clamp(-0.1, 0.1)", {"net": net})
    assert torch.allclose(net[0].weight.grad, expected)
    assert net[0].weight.grad.abs().max() <= 0.1


def test_frozen_weights_still_give_gradients_from_a_marked_output(model, ids):
    for param in model.parameters():
        param.requires_grad_(False)
    before = model_state(model)
    result = run(model, ids, """
hs = model.transformer.h[1].output.requires_grad_(True)
early = model.transformer.h[3].output
with model.output.logits.sum().backward():
    g = hs.grad.save()
    g3 = early.grad.save()
""")
    expected = raw_grads(model, ids, [model.transformer.h[1], model.transformer.h[3]], frozen=True)
    assert torch.allclose(result.saved["g"], expected[0])
    assert torch.allclose(result.saved["g3"], expected[1])
    assert_clean(model, before)


def test_create_graph_gradient_penalty():
    torch.manual_seed(4)
    critic = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(5, 3, requires_grad=True)
    (grad,) = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
    expected_penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
    (expected,) = torch.autograd.grad(expected_penalty, critic[0].weight)
    ns = {"critic": critic, "x": x}
    nbgrad.backward(critic(x).sum(), "penalty = ((x.grad.norm(2, dim=1) - 1) ** 2).mean().save()", ns,
                    create_graph=True)
    critic.zero_grad(set_to_none=True)
    (got,) = torch.autograd.grad(ns["penalty"], critic[0].weight)
    assert torch.allclose(ns["penalty"], expected_penalty)
    assert torch.allclose(got, expected)


# --- errors: each with its cell line, tested for its message; the model is clean after each -----

def expect_error(model, ids, source, error_type, *fragments, ran_backward=False, **options):
    before = model_state(model)
    with pytest.raises(error_type) as caught:
        nbgrad.trace(model, ids, source, **options)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    if ran_backward:        # a pass that ran accumulated into the parameters, as in PyTorch
        assert any(p.grad is not None for p in model.parameters())
        model.zero_grad(set_to_none=True)
    assert_clean(model, before)
    after = nbgrad.trace(model, ids, "ok = model.transformer.h[0].output.save()")
    assert after.saved["ok"].shape[-1] == 32
    return message


def test_error_non_scalar_loss(model, ids):
    expect_error(model, ids, "logits = model.output.logits\nlogits.backward()", nbgrad.GradError,
                 "line 2", "shape (1, 5, 97)", ".sum()", "--grad-output")


def test_error_loss_without_grad_under_no_grad(model, ids):
    expect_error(model, ids, "model.output.logits.sum().backward()", nbgrad.GradError,
                 "line 1", "--no-grad", no_grad=True)


def test_error_loss_without_grad_frozen_model(model, ids):
    for param in model.parameters():
        param.requires_grad_(False)
    expect_error(model, ids, "x = 1\nmodel.output.logits.sum().backward()", nbgrad.GradError,
                 "line 2", "frozen", "requires_grad_(True)")


def test_error_backward_loss_without_grad_names_the_input(shell):
    shell.run_cell("a = torch.ones(3)\nb = torch.ones(3) * 2\nunused = torch.ones(4)")
    with pytest.raises(nbgrad.GradError) as caught:
        shell.run_line_magic("backward", "(a * b).sum() -q")
    assert str(caught.value) == ("the loss does not require grad, so there is nothing to backpropagate: it is "
                                 "computed from a, b, which have requires_grad=False; create them with "
                                 "requires_grad=True (or call .requires_grad_())")


def test_error_backward_non_scalar(shell):
    shell.run_cell("p = torch.ones(2, 3, requires_grad=True)\nq = p * 2")
    with pytest.raises(nbgrad.GradError) as caught:
        shell.run_line_magic("backward", "q -q")
    assert "shape (2, 3)" in str(caught.value) and "--grad-output" in str(caught.value) and ".sum()" in str(caught.value)


def test_error_grad_of_a_slice_taken_after_the_fact(model, ids):
    expect_error(model, ids, """
hs = model.transformer.h[1].output[0]
with model.output.logits.sum().backward():
    g = hs.grad.save()
""", nbgrad.GradError, "line 4", "hs.grad was never computed", "slice", "does not depend on hs", ran_backward=True)


def test_error_grad_of_tensor_the_loss_does_not_use(model, ids):
    expect_error(model, ids, """
other = (model.transformer.h[1].output * 2)
with model.transformer.h[1].output.sum().backward():
    g = other.grad.save()
""", nbgrad.GradError, "line 4", "other.grad was never computed", "does not depend on other", ran_backward=True)


def test_error_second_backward_without_retain_graph(model, ids):
    expect_error(model, ids, """
logits = model.output.logits
logits.sum().backward()
logits.sum().backward()
""", nbgrad.GradError, "line 4", "second time", "the backward pass of line 3 (logits.sum().backward())",
                 "retain_graph=True", ran_backward=True)


def test_error_second_backward_names_the_pass_that_freed_the_graph(model, ids):
    """The pass that ran first and freed the graph is the inner block's, not the outer one that already
    keeps its graph: the message names it, and doing what it says works."""
    source = """
logits = model.output.logits
with logits.sum().backward(retain_graph=True):
    a = model.transformer.h[1].output.grad.save()
    with (logits * 2).sum().backward({}):
        b = model.transformer.h[1].output.grad.save()
"""
    message = expect_error(model, ids, source.format(""), nbgrad.GradError, "line 3", "second time",
                           "the backward pass of line 5 ((logits * 2).sum().backward())", ran_backward=True)
    assert "Pass retain_graph=True to that backward" in message
    fixed = run(model, ids, source.format("retain_graph=True"))
    assert torch.allclose(fixed.saved["b"], 2 * fixed.saved["a"], rtol=1e-4, atol=1e-5)


def test_error_grad_read_without_backward_pass(model, ids):
    expect_error(model, ids, "g = model.transformer.h[0].output.grad", nbgrad.GradError,
                 "line 1", "no backward pass")


def test_error_gradient_edit_too_late(model, ids):
    expect_error(model, ids, """
h0 = model.transformer.h[0].output
h3 = model.transformer.h[3].output
with model.output.logits.sum().backward():
    g0 = h0.grad
    h3.grad[:] = g0.mean()
""", nbgrad.OrderError, "line 6", "h3.grad", "too late", "line 5", ran_backward=True)


def test_gradients_of_a_list_read_in_forward_order_with_a_loop_index(model, ids):
    result = run(model, ids, """
outs = [model.transformer.h[i].output for i in range(4)]
with model.output.logits.sum().backward():
    grads = [outs[i].grad.save() for i in range(4)]
""")
    expected = raw_grads(model, ids, list(model.transformer.h))
    for i in range(4):
        assert torch.allclose(result.saved[f"grads[{i}]"], expected[i])


def test_module_output_grads_in_forward_order_inside_a_loop(model, ids):
    namespace = {"model": model}
    run(model, ids, """
for i in range(4):
    model.transformer.h[i].output.requires_grad_(True)
with model.output.logits.sum().backward():
    norms = [model.transformer.h[i].output.grad.norm().item() for i in range(4)]
""", namespace=namespace)
    expected = raw_grads(model, ids, list(model.transformer.h))
    assert namespace["norms"] == pytest.approx([expected[i].norm().item() for i in range(4)], rel=1e-5)


def test_late_gradient_request_says_why(model, ids):
    expect_error(model, ids, """
hs = [model.transformer.h[i].output for i in range(4)]
with model.output.logits.sum().backward():
    g2 = hs[2].grad.save()
    g3 = [x for x in hs][3 + int(g2.sum() * 0)].grad.save()
""", nbgrad.GradError, "line 5", "flowed past", ran_backward=True)
