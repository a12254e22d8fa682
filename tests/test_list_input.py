"""A list of prompts of different lengths as INPUT is one batch padded on the left with position ids from the
attention mask, as invokes are: each row equals its prompt run alone with plain hooks, gradients included."""
from __future__ import annotations

import pytest
import torch

import nbgrad
from families import FAMILIES, one_thread, save_checkpoint  # noqa: F401

PROMPTS = ["Hello World, how are you", "Hi there"]
TEXT_FAMILIES = [family for family in FAMILIES if family not in ("t5", "vit")]
CELL = ("h = {block}.output.save()\n"
        "loss = model.output.logits[:, -1].float().pow(2).sum()\n"
        "with loss.backward():\n"
        "    g = h.grad.save()\n")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("list_input")
    return {family: str(save_checkpoint(family, root / family)) for family in TEXT_FAMILIES}


def _alone(model, block, prompt):
    """The oracle: the prompt alone, the block's output and its gradient taken by plain hooks."""
    seen = {}

    def forward_hook(module, args, output):
        seen["h"] = output
        output.register_hook(lambda grad: seen.__setitem__("g", grad))
    handle = block.register_forward_hook(forward_hook)
    try:
        ids = nbgrad.tokenizer_for(model)(prompt, return_tensors="pt")
        logits = model(**ids).logits
        logits[:, -1].float().pow(2).sum().backward()
    finally:
        handle.remove()
    return seen["h"][0].detach(), seen["g"][0], logits[0].detach()


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_each_row_of_a_list_input_equals_its_prompt_alone(checkpoints, family):
    model = nbgrad.load_model(checkpoints[family])
    path = FAMILIES[family][1]
    block = eval(path, {"model": model})
    lengths = [len(nbgrad.tokenizer_for(model)(prompt)["input_ids"]) for prompt in PROMPTS]
    assert lengths[0] > lengths[1]            # the second row is padded
    result = nbgrad.trace(model, PROMPTS, CELL.format(block=path) + "logits = model.output.logits.save()\n")
    width = result.saved["h"].shape[1]
    assert width == max(lengths)
    for row, (prompt, length) in enumerate(zip(PROMPTS, lengths)):
        h, g, logits = _alone(model, block, prompt)
        real = slice(width - length, width)   # padding sits on the left
        torch.testing.assert_close(result.saved["h"][row, real].detach(), h, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(result.saved["g"][row, real], g, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(result.saved["logits"][row, real].detach(), logits, atol=1e-5, rtol=1e-4)


def test_a_list_input_gives_the_same_rows_as_invokes(checkpoints):
    model = nbgrad.load_model(checkpoints["llama"])
    listed = nbgrad.trace(model, PROMPTS, "logits = model.output.logits.save()\n")
    invoked = nbgrad.trace(model, None, "".join(
        f"with invoke({prompt!r}):\n    l{i} = model.output.logits.save()\n" for i, prompt in enumerate(PROMPTS)))
    torch.testing.assert_close(listed.saved["logits"], torch.cat([invoked.saved["l0"], invoked.saved["l1"]]))


def test_the_magic_pads_a_list_input_as_the_function_does(shell, checkpoints):
    model = nbgrad.load_model(checkpoints["gpt2"])
    shell.user_ns.update(model=model, prompts=PROMPTS)
    assert shell.run_cell("%%trace model prompts -q\nlogits = model.output.logits.save()\n",
                          store_history=False).success
    magic = shell.user_ns.pop("logits")
    alone = model(**nbgrad.tokenizer_for(model)(PROMPTS[1], return_tensors="pt")).logits
    torch.testing.assert_close(magic[1, -alone.shape[1]:].detach(), alone[0].detach(), atol=1e-5, rtol=1e-4)
