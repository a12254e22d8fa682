"""Methods of the notebook's objects that read or edit events (SPEC §2, the functions rows): a LoRA adapter whose
`forward` / `__call__` reads `self.module.input` and edits `self.module.output`, and a plain method `obj.patch()`,
called directly by a %%trace cell, pause at those events like a function the cell calls; checked against plain
hooks on the same weights, gradients into the adapter included."""
import pytest
import torch

from helpers import assert_clean, model_state

IDS = torch.tensor([[5, 9, 2, 7, 11]])
TARGET = 3
CLASSES = """
class LoRA(torch.nn.Module):
    def __init__(self, module, dim, rank):
        super().__init__()
        self.module = module
        self.A = torch.nn.Parameter(torch.randn(dim, rank) * 0.1)
        self.B = torch.nn.Parameter(torch.randn(rank, dim) * 0.1)

    def forward(self, alpha=1.0):
        x = self.module.input
        self.module.output = self.module.output + alpha * (x @ self.A @ self.B)


class Ablation:
    def __init__(self, blocks):
        self.blocks = blocks

    def __call__(self, position):
        self.blocks[0].output[:, position] = 0

    def patch(self, layer, value):
        self.blocks[layer].output[:, -1] = value
"""


@pytest.fixture
def notebook(shell, tiny):
    shell.user_ns.update(model=tiny, ids=IDS)
    assert shell.run_cell(CLASSES).success
    torch.manual_seed(1)
    assert shell.run_cell("lora = LoRA(model.transformer.h[1].mlp, 32, 4)\n"
                          "ablate = Ablation(model.transformer.h)").success
    yield shell
    for name in ("LoRA", "Ablation", "lora", "ablate", "loss", "logits", "out", "x", "Scale", "scale", "late"):
        shell.user_ns.pop(name, None)


def hand_patched(model, lora, alpha=1.0):
    """Plain PyTorch: the same adapter as a forward hook on the MLP; (logits, loss, grads of A and B)."""
    def hook(module, args, output):
        return output + alpha * (args[0] @ lora.A @ lora.B)
    handle = lora.module.register_forward_hook(hook)
    try:
        logits = model(IDS).logits
    finally:
        handle.remove()
    loss = torch.nn.functional.cross_entropy(logits[0, -1:], torch.tensor([TARGET]))
    grad_a, grad_b = torch.autograd.grad(loss, [lora.A, lora.B])
    return logits, loss, grad_a, grad_b


@pytest.mark.parametrize("call, alpha", [("lora()", 1.0), ("lora(0.5)", 0.5), ("lora.forward(alpha=0.5)", 0.5)])
def test_a_lora_adapter_trains_like_a_hand_patched_model(notebook, tiny, call, alpha):
    lora = notebook.user_ns["lora"]
    expected_logits, expected_loss, grad_a, grad_b = hand_patched(tiny, lora, alpha)
    before = model_state(tiny)
    result = notebook.run_cell(f"%%trace model ids -q\n{call}\nlogits = model.output.logits.save()\n"
                               f"loss = torch.nn.functional.cross_entropy(logits[0, -1:], torch.tensor([{TARGET}])).save()\n"
                               "loss.backward()")
    assert result.success, result.error_in_exec
    assert torch.allclose(notebook.user_ns["logits"], expected_logits, atol=1e-6)
    assert torch.allclose(notebook.user_ns["loss"], expected_loss, atol=1e-6)
    assert torch.allclose(lora.A.grad, grad_a, atol=1e-6) and torch.allclose(lora.B.grad, grad_b, atol=1e-6)
    assert grad_b.abs().sum() > 0
    tiny.zero_grad(set_to_none=True)
    assert_clean(tiny, before)
    assert not [name for name in notebook.user_ns if name.startswith(("_nbgrad", "__nbgrad"))]


def hooked_blocks(model, edits):
    """Plain hooks: `edits` maps a block to a function that edits its output in place; every block's output."""
    outputs, handles = {}, []
    for index, block in enumerate(model.transformer.h):
        def hook(module, args, output, index=index):
            output = output.clone()
            if index in edits:
                edits[index](output)
            outputs[index] = output
            return output
        handles.append(block.register_forward_hook(hook))
    try:
        logits = model(IDS).logits
    finally:
        for handle in handles:
            handle.remove()
    return outputs, logits


def test_call_and_plain_method_of_an_object_edit_like_hooks(notebook, tiny):
    before = model_state(tiny)
    result = notebook.run_cell("%%trace model ids -q\nablate(1)\nablate.patch(2, 0.5)\n"
                               "out = model.transformer.h[2].output.save()\nlogits = model.output.logits.save()")
    assert result.success, result.error_in_exec

    def zero(output):
        output[:, 1] = 0

    def half(output):
        output[:, -1] = 0.5
    outputs, logits = hooked_blocks(tiny, {0: zero, 2: half})
    assert torch.equal(notebook.user_ns["out"], outputs[2])
    assert torch.allclose(notebook.user_ns["logits"], logits, atol=1e-6)
    assert_clean(tiny, before)


def test_a_class_and_its_object_made_in_the_cell_itself(notebook, tiny):
    result = notebook.run_cell("%%trace model ids -q\nclass Scale:\n    def __init__(self, block):\n"
                               "        self.block = block\n    def __call__(self, factor):\n"
                               "        self.block.output[:] *= factor\n"
                               "scale = Scale(model.transformer.h[3])\nscale(2.0)\nout = model.transformer.h[3].output.save()\n"
                               "late = Ablation(model.transformer.h)\nlate.patch(1, 0.0)")
    assert result.success, result.error_in_exec

    def double(output):
        output *= 2.0

    def zero_last(output):
        output[:, -1] = 0.0
    outputs, _ = hooked_blocks(tiny, {1: zero_last, 3: double})
    assert torch.allclose(notebook.user_ns["out"], outputs[3], atol=1e-6)


@pytest.mark.parametrize("cell", [
    "class Twice(LoRA):\n    def forward(self):\n        self.inner()\n    def inner(self):\n"
    "        self.module.output[:] = 0\nTwice(model.transformer.h[0].mlp, 32, 2)()",
    "x = list(map(ablate, [1]))",
])
def test_a_method_called_some_other_way_gets_the_hint(notebook, tiny, cell):
    """An object called by another method (or by `map`) runs as plain Python: its event read is an AttributeError
    with the note that says which calls pause."""
    before = model_state(tiny)
    result = notebook.run_cell(f"%%trace model ids -q\n{cell}")
    assert isinstance(result.error_in_exec, AttributeError)
    note = "\n".join(getattr(result.error_in_exec, "__notes__", []))
    assert "the methods of the notebook's objects (`adapter()`, `obj.patch()`) that the cell calls directly" in note
    assert "called some other way" in note
    assert_clean(tiny, before)
    assert notebook.run_cell("%%trace model ids -q\nablate(0)\nout = model.transformer.h[0].output.save()").success


def test_a_method_in_a_run_over_a_dataset(notebook, tiny):
    before = model_state(tiny)
    notebook.user_ns["rows"] = [IDS, IDS.flip(1), IDS + 1]
    try:
        result = notebook.run_cell("%%trace model --over rows --batch-size 2 -q\nablate(1)\n"
                                   "out = model.transformer.h[0].output.save()")
        assert result.success, result.error_in_exec
        for k, ids in enumerate(notebook.user_ns["rows"]):
            kept = {}
            handle = tiny.transformer.h[0].register_forward_hook(lambda m, a, o: kept.__setitem__("out", o))
            try:
                tiny(ids)
            finally:
                handle.remove()
            expected = kept["out"].clone()
            expected[:, 1] = 0
            assert torch.allclose(notebook.user_ns["out"][k], expected, atol=1e-6), k
        assert_clean(tiny, before)
    finally:
        notebook.user_ns.pop("rows")


def test_an_object_reached_through_a_loop_variable_runs_as_plain_python(notebook, tiny):
    """Only a call of the object by its own name pauses: through a loop variable it gets the hint."""
    result = notebook.run_cell("%%trace model ids -q\nfor adapter in [ablate]:\n    adapter(1)")
    assert isinstance(result.error_in_exec, AttributeError)
    assert "called some other way" in "\n".join(getattr(result.error_in_exec, "__notes__", []))
