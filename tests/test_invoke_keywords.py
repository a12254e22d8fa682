"""`with invoke(input_ids=ids, ...):` (as `tracer.invoke(...)` is written in nnsight) runs the invoke on the model's
keyword arguments, as a dict INPUT is; an invoke with no INPUT, two, or an INPUT of a wrong type is one clear error,
and the model is clean after it."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2

IDS = torch.tensor([[5, 7, 11, 13]])
BODY = "    h = model.transformer.h[1].output.save()\n    logits = model.lm_head.output.save()\n"


@pytest.fixture
def model():
    return tiny_gpt2(n_layer=2)


def plain(model, **kwargs):
    """Block 1's output and the logits by a plain hook, the model called with `kwargs`."""
    seen = {}
    handle = model.transformer.h[1].register_forward_hook(lambda m, a, out: seen.setdefault("h", out))
    try:
        logits = model(**kwargs).logits
    finally:
        handle.remove()
    return seen["h"], logits


@pytest.mark.parametrize("header", ["with invoke(input_ids=ids):", "with tracer.invoke(input_ids=ids):",
                                    "with invoke(**{'input_ids': ids}):", "with invoke(input_ids=ids) as inv:"])
def test_keywords_are_the_models_keyword_arguments(model, header):
    h, logits = plain(model, input_ids=IDS)
    result = nbgrad.trace(model, None, f"{header}\n{BODY}", {"model": model, "ids": IDS})
    assert torch.equal(result.saved["h"], h) and torch.equal(result.saved["logits"], logits)
    assert result.invokes == [{"input_ids": IDS}]


def test_keywords_with_a_mask_and_a_second_invoke(model):
    mask, other = torch.ones(1, 4, dtype=torch.long), torch.tensor([[2, 3, 4, 6]])
    h, logits = plain(model, input_ids=IDS, attention_mask=mask)
    source = ("with invoke(input_ids=ids, attention_mask=mask):\n" + BODY +
              "with invoke(other):\n    other_logits = model.lm_head.output.save()\n")
    result = nbgrad.trace(model, None, source, {"model": model, "ids": IDS, "mask": mask, "other": other})
    assert torch.allclose(result.saved["h"], h, atol=1e-5) and torch.allclose(result.saved["logits"], logits, atol=1e-5)
    assert torch.allclose(result.saved["other_logits"], plain(model, input_ids=other)[1], atol=1e-5)


@pytest.mark.parametrize("header, has", [("invoke()", "no INPUT"), ("invoke(ids, ids)", "2 positional arguments"),
                                         ("invoke(ids, attention_mask=mask)", "an INPUT and keyword arguments"),
                                         ("invoke(*pair)", "1 positional arguments")])
def test_an_invoke_without_one_input(model, header, has):
    before = model_state(model)
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, f"with {header}:\n{BODY}", {"model": model, "ids": IDS, "mask": IDS, "pair": ()})
    assert str(caught.value) == ("line 1: `with invoke(INPUT):` takes one INPUT (a string, a list of strings, a "
                                 "tensor, a dict or a tuple), or the model's keyword arguments "
                                 f"(`invoke(input_ids=ids)`); it has {has}")
    assert_clean(model, before)
    assert nbgrad.trace(model, None, f"with invoke(ids):\n{BODY}", {"model": model, "ids": IDS}).saved["h"].shape \
        == (1, 4, 32)


@pytest.mark.parametrize("value, said", [(3.5, "a float"), (object(), "an object")])
def test_an_invoke_input_of_a_wrong_type(model, value, said):
    before = model_state(model)
    with pytest.raises(nbgrad.InputError) as caught:
        nbgrad.trace(model, None, f"with invoke(bad):\n{BODY}", {"model": model, "bad": value})
    assert str(caught.value).startswith(f"line 1: invoke(bad): INPUT is {said}; INPUT may be")
    assert "a dict or BatchEncoding (keyword arguments)" in str(caught.value)
    assert_clean(model, before)


def test_an_invoke_input_that_is_none(model):
    with pytest.raises(nbgrad.InputError) as caught:
        nbgrad.trace(model, None, f"with invoke(bad):\n{BODY}", {"model": model, "bad": None})
    assert str(caught.value) == ("line 1: invoke INPUT `bad` is None: give the block a string, a list of strings, a "
                                 "tensor, a dict or a tuple")


def test_keywords_in_a_generation(model):
    plain = model.generate(IDS, max_new_tokens=3, do_sample=False, pad_token_id=0)
    result = nbgrad.generate(model, None, "with invoke(input_ids=ids):\n    top = model.lm_head.output[:, -1].save()\n",
                             {"model": model, "ids": IDS}, max_new_tokens=3)
    assert torch.equal(result.output, plain) and len(result.saved["top"]) == 3
