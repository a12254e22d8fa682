"""Every architecture family loads with `load_model` from a saved tiny checkpoint (its class from
`config.architectures`) and traces like plain forward hooks and `torch.autograd.grad` on the same weights,
in float32, bfloat16 and float16."""
import json
import re

import pytest
import torch
from torch import nn

import nbgrad
from families import ARCHITECTURE, FAMILIES, call_kwargs, model_input, one_thread, save_checkpoint  # noqa: F401
from helpers import hook_count

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
GRAD_CELL = ("h = {block}.output{sub}.save()\n"
             "loss = (model.output.logits.float() ** 2).mean()\n"
             "with loss.backward():\n"
             "    g = h.grad.save()\n")
EDIT_CELL = "{block}.output{sub}[:, 0] = 0\nlogits = model.output.logits.save()\n"


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: str(save_checkpoint(family, root / family)) for family in FAMILIES}


def _block(model, family):
    path = FAMILIES[family][1]
    return eval(path, {"model": model}), path, "[0]" if family == "t5" else ""   # T5 blocks return tuples


def _plain_run(model, family, value, edit=False):
    """The oracle: the block's output captured (or edited) by a plain forward hook."""
    block, _, sub = _block(model, family)
    seen = {}

    def hook(module, args, output):
        hidden = output[0] if sub else output
        if edit:
            hidden[:, 0] = 0
        seen["h"] = hidden
    handle = block.register_forward_hook(hook)
    try:
        logits = model(**call_kwargs(family, model, value)).logits
    finally:
        handle.remove()
    return seen["h"], logits


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_loads_its_own_class_and_traces_like_plain_hooks(checkpoints, family, dtype):
    model = nbgrad.load_model(checkpoints[family], dtype=dtype)
    assert type(model).__name__ == ARCHITECTURE[family] and not model.training
    assert next(model.parameters()).dtype == dtype
    value = model_input(family, model)
    _, path, sub = _block(model, family)
    result = nbgrad.trace(model, value, GRAD_CELL.format(block=path, sub=sub))
    assert hook_count(model) == 0 and all(p.requires_grad for p in model.parameters())

    hidden, logits = _plain_run(model, family, value)
    expected_grad, = torch.autograd.grad((logits.float() ** 2).mean(), hidden)
    torch.testing.assert_close(result.saved["h"], hidden)
    torch.testing.assert_close(result.saved["g"], expected_grad)
    assert result.saved["g"].abs().sum() > 0
    # Saved values keep the model's dtype (transformers keeps T5's `wo` in float32 under float16).
    kept = torch.float32 if (family, dtype) == ("t5", torch.float16) else dtype
    assert result.saved["h"].dtype == kept and result.saved["g"].dtype == kept


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_edit_equals_a_plain_hook_edit(checkpoints, family):
    model = nbgrad.load_model(checkpoints[family])
    value = model_input(family, model)
    _, path, sub = _block(model, family)
    result = nbgrad.trace(model, value, EDIT_CELL.format(block=path, sub=sub), no_grad=True)
    with torch.no_grad():
        _, edited = _plain_run(model, family, value, edit=True)
        _, unedited = _plain_run(model, family, value)
    torch.testing.assert_close(result.saved["logits"], edited)
    assert not torch.allclose(edited, unedited), "the edit must change the logits"


def test_bert_checkpoint_is_a_masked_lm_not_a_causal_one(checkpoints):
    model = nbgrad.load_model(checkpoints["bert"])
    assert type(model).__name__ == "BertForMaskedLM" and not model.config.is_decoder


def test_a_config_that_names_no_architecture_loads_a_causal_lm(tmp_path):
    save_checkpoint("llama", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("architectures")
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert type(nbgrad.load_model(str(tmp_path))).__name__ == "LlamaForCausalLM"


def test_checkpoint_without_tokenizer_loads_with_a_one_line_note(tmp_path, capsys):
    save_checkpoint("llama", tmp_path, with_preprocessor=False)
    model = nbgrad.load_model(str(tmp_path))
    note = [line for line in capsys.readouterr().err.splitlines() if "nbgrad" in line]
    assert note == [f"nbgrad: {tmp_path} has no tokenizer saved with it; it loads without one "
                    "(a text INPUT needs --tokenizer EXPR; tensor and dict INPUTs work)."]
    assert nbgrad.tokenizer_for(model) is None
    ids = torch.tensor([[1, 2, 3]])
    result = nbgrad.trace(model, ids, "h = model.model.layers[0].output.save()")
    with torch.no_grad():
        plain = model(ids, output_hidden_states=True).hidden_states[1]     # after layer 0
    torch.testing.assert_close(result.saved["h"].detach(), plain)
    says = (f"a text INPUT needs a tokenizer, and nbgrad.load_model({str(tmp_path)!r}) found none saved with the "
            f"model: save one there")       # not "load the model with nbgrad.load_model": it was
    with pytest.raises(nbgrad.InputError, match=re.escape(says)):
        nbgrad.trace(model, "Hello", "h = model.model.layers[1].output.save()")
    with pytest.raises(nbgrad.InputError, match=re.escape(says)):
        nbgrad.trace(model, None, "with invoke('Hello'):\n    h = model.model.layers[1].output.save()")


def test_image_model_gets_its_image_processor(checkpoints):
    from transformers.image_processing_base import ImageProcessingMixin
    model = nbgrad.load_model(checkpoints["vit"])
    processor = nbgrad.processor_for(model)
    assert isinstance(processor, ImageProcessingMixin) and nbgrad.tokenizer_for(model) is None
    image = (torch.rand(8, 8, 3, generator=torch.Generator().manual_seed(2)) * 255).to(torch.uint8).numpy()
    pixels = processor(images=image, return_tensors="pt")
    result = nbgrad.trace(model, pixels, "logits = model.output.logits.save()", no_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(result.saved["logits"], model(**pixels).logits)


def test_a_pil_image_goes_through_the_image_processor(checkpoints):
    from PIL import Image
    model = nbgrad.load_model(checkpoints["vit"])
    array = (torch.rand(8, 8, 3, generator=torch.Generator().manual_seed(3)) * 255).to(torch.uint8).numpy()
    image = Image.fromarray(array)
    pixels = nbgrad.processor_for(model)(images=image, return_tensors="pt")
    one = nbgrad.trace(model, image, "logits = model.output.logits.save()", no_grad=True)
    two = nbgrad.trace(model, [image, image], "logits = model.output.logits.save()", no_grad=True)
    with torch.no_grad():
        expected = model(**pixels).logits
    torch.testing.assert_close(one.saved["logits"], expected)
    torch.testing.assert_close(two.saved["logits"], expected.expand(2, -1))


def test_a_pil_image_without_a_processor_is_one_clear_error(tmp_path, capsys):
    from PIL import Image
    save_checkpoint("vit", tmp_path, with_preprocessor=False)
    model = nbgrad.load_model(str(tmp_path))
    with pytest.raises(nbgrad.InputError, match="an image INPUT needs the model's image processor"):
        nbgrad.trace(model, Image.new("RGB", (8, 8)), "logits = model.output.logits.save()")


def test_image_model_without_processor_loads_with_a_note(tmp_path, capsys):
    save_checkpoint("vit", tmp_path, with_preprocessor=False)
    model = nbgrad.load_model(str(tmp_path))
    note = [line for line in capsys.readouterr().err.splitlines() if "nbgrad" in line]
    assert note == [(f"nbgrad: {tmp_path} has no image processor saved with it; "
                                               "it loads without one (give INPUT as a pixel_values tensor).")]
    assert nbgrad.processor_for(model) is None and isinstance(model, nn.Module)
