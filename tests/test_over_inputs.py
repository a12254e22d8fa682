"""Natural inputs of `--over` and INPUT: a 2-D tensor of ids is one example per row, a 1-D tensor of ids is one
example; a dict and a 1-D tensor given to `--over` are refused with what to write. Values are compared with plain
forward hooks on the same weights."""
import copy

import pytest
import torch

import nbgrad

BODY = "h = model.transformer.h[0].output[:, -1].save()\n"
IDS = torch.tensor([[5, 9, 2, 7], [1, 2, 3, 4], [8, 8, 1, 0]])


def plain_last(model, ids):
    """The oracle: a [1, n] batch of the ids, a plain forward hook on the first block."""
    kept = {}
    handle = model.transformer.h[0].register_forward_hook(lambda m, a, o: kept.__setitem__("h", o[:, -1]))
    try:
        with torch.no_grad():
            model(input_ids=ids.reshape(1, -1))
    finally:
        handle.remove()
    return kept["h"]


@pytest.mark.parametrize("dataset", [IDS, list(IDS), [IDS[0], IDS[1, :2], IDS[2]]],
                         ids=["a 2-D tensor", "a list of 1-D tensors", "1-D tensors of different lengths"])
def test_over_a_tensor_of_ids_runs_once_per_row(default_model, dataset):
    namespace = {"model": default_model}
    nbgrad.trace(default_model, None, BODY, namespace, over=dataset, batch_size=2)
    assert len(namespace["h"]) == len(dataset)
    for value, row in zip(namespace["h"], dataset):
        torch.testing.assert_close(value, plain_last(default_model, row), atol=1e-5, rtol=1e-4)


def test_a_1d_tensor_of_ids_as_input_is_one_example(default_model):
    namespace = {"model": default_model}
    nbgrad.trace(default_model, IDS[0], BODY, namespace)
    torch.testing.assert_close(namespace["h"], plain_last(default_model, IDS[0]), atol=1e-5, rtol=1e-4)


def test_over_a_dict_is_refused_with_what_to_write(default_model):
    namespace = {"model": default_model}
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(default_model, None, BODY, namespace, over={"a": "Hello", "b": "Hi"})
    assert str(caught.value) == ("--over a dict would run the cell over its keys: write `--over list(DATASET.values())` "
                                 "to run it over the values (or `--over list(DATASET)` over the keys)")
    assert "h" not in namespace


def test_over_a_1d_tensor_is_refused_with_what_to_write(default_model):
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(default_model, None, BODY, {"model": default_model}, over=IDS[0])
    assert str(caught.value) == ("--over a tensor runs the cell once per row (each row one example's ids); this one "
                                 "has shape [4]: give a 1-D tensor of ids as INPUT, without --over (or --over [ids] "
                                 "for a dataset of one example)")


def test_new_prompts_are_tokenized_in_one_call_each_row_as_alone(default_model, monkeypatch):
    """A batch's prompts not seen before go to a fast tokenizer as one list (not a call per prompt); each row is
    still the prompt's ids alone, as the tokenizer gives them for that prompt."""
    from nbgrad.models.padding import token_rows
    tokenizer = copy.deepcopy(nbgrad.tokenizer_for(default_model))       # its own cache: every prompt is new
    prompts = ["  leading spaces", "é ü 日本語", "", "x y z", "x y z"]
    alone = [tuple(tokenizer(prompt)["input_ids"]) for prompt in prompts]
    calls = []
    encode = type(tokenizer).__call__
    monkeypatch.setattr(type(tokenizer), "__call__",
                        lambda self, text, **kw: calls.append(text) or encode(self, text, **kw))
    assert token_rows(tokenizer, prompts) == alone
    assert calls == [list(dict.fromkeys(prompts))]
    assert token_rows(tokenizer, prompts[:2]) == alone[:2] and len(calls) == 1       # kept: no call again
