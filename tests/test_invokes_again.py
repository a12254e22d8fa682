"""A cell with invokes on text run again as it ran last takes its call from what the last run found (models/prepare.py,
`again`), and the full way (`batch_invokes`) wherever anything that full way reads has changed since."""
import copy
import gc
import weakref

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import nbgrad
from nbgrad.models import prepare
from helpers import alone, assert_clean, model_state
from interrupts import Injector

EIFFEL = "The Eiffel Tower is in the city of"
COLOSSEUM = "The Colosseum is in"
PATCH = """
with invoke(CLEAN):
    clean = model.transformer.h[1].output[:, -1].save()
with invoke(CORRUPT):
    model.transformer.h[1].output[:, -1] = clean
    patched = model.lm_head.output[:, -1].save()
"""


@pytest.fixture(scope="module")
def model():
    return nbgrad.load_model()


@pytest.fixture
def full_ways(monkeypatch):
    """The number of times a cell took the full way (`batch_invokes`), from nothing kept by an earlier test."""
    monkeypatch.setattr(prepare, "_last", {})
    calls = []
    full = prepare.batch_invokes
    monkeypatch.setattr(prepare, "batch_invokes", lambda *args: calls.append(1) or full(*args))
    return calls


def _patched_by_hooks(model, clean: str, corrupt: str) -> torch.Tensor:
    """The patch with plain hooks: CORRUPT run alone with block 1's last position set to CLEAN's."""
    clean_last = alone(model, clean, 1)[0][:, -1]

    def edit(output):
        output[:, -1] = clean_last
    return alone(model, corrupt, 1, edit=edit)[1][:, -1]


def test_a_cell_run_again_takes_the_last_runs_batch_and_gives_what_plain_hooks_give(model, full_ways):
    before = model_state(model)
    namespace = {"model": model, "CLEAN": EIFFEL, "CORRUPT": COLOSSEUM}
    first = nbgrad.trace(model, None, PATCH, namespace, no_grad=True)
    namespace["CLEAN"] = "".join([EIFFEL[:3], EIFFEL[3:]])      # equal text, another object: the same batch
    second = nbgrad.trace(model, None, PATCH, namespace, no_grad=True)
    assert len(full_ways) == 1
    assert second.invokes == [EIFFEL, COLOSSEUM] and torch.equal(second.input_ids, first.input_ids)
    assert second.input_ids is not first.input_ids         # the first Result holds its copy: a copy of its own
    expected = _patched_by_hooks(model, EIFFEL, COLOSSEUM)
    torch.testing.assert_close(second.saved["patched"], expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(second.saved["patched"], first.saved["patched"], atol=0, rtol=0)
    assert_clean(model, before)
    assert set(namespace) == {"model", "CLEAN", "CORRUPT", "clean", "patched", "__builtins__"}


def test_another_prompt_or_tokenizer_takes_the_full_way(model, full_ways):
    before = model_state(model)
    namespace = {"model": model, "CLEAN": EIFFEL, "CORRUPT": COLOSSEUM}
    nbgrad.trace(model, None, PATCH, namespace, no_grad=True)
    namespace["CORRUPT"] = "The Louvre is in"
    rebound = nbgrad.trace(model, None, PATCH, namespace, no_grad=True)
    assert len(full_ways) == 2 and rebound.invokes == [EIFFEL, "The Louvre is in"]
    torch.testing.assert_close(rebound.saved["patched"], _patched_by_hooks(model, EIFFEL, "The Louvre is in"),
                               atol=1e-4, rtol=1e-4)
    tokenizer = copy.deepcopy(nbgrad.tokenizer_for(model))
    nbgrad.trace(model, None, PATCH, namespace, no_grad=True, tokenizer=tokenizer)
    nbgrad.trace(model, None, PATCH, namespace, no_grad=True, tokenizer=tokenizer)
    assert len(full_ways) == 3
    tokenizer.add_tokens(["Louvre"])            # the tokenizer's state: asked again, and its new id is out of range
    with pytest.raises(nbgrad.InputError, match="outside the model's vocabulary"):
        nbgrad.trace(model, None, PATCH, namespace, no_grad=True, tokenizer=tokenizer)
    assert len(full_ways) == 4
    assert_clean(model, before)


def _small_model(tokenizer):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=64,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return GPT2LMHeadModel(config).eval()


def test_a_model_whose_vocabulary_shrank_is_checked_again(model, full_ways):
    tokenizer = nbgrad.tokenizer_for(model)
    small = _small_model(tokenizer)
    namespace = {"model": small, "CLEAN": EIFFEL, "CORRUPT": COLOSSEUM}
    first = nbgrad.trace(small, None, PATCH, namespace, no_grad=True, tokenizer=tokenizer)
    before = model_state(small)
    nbgrad.trace(small, None, PATCH, namespace, no_grad=True, tokenizer=tokenizer)
    assert len(full_ways) == 1
    small.resize_token_embeddings(int(first.input_ids.max()))      # the largest id of the prompts is out of range now
    with pytest.raises(nbgrad.InputError, match=r"outside the model's vocabulary: model\.transformer\.wte\."):
        nbgrad.trace(small, None, PATCH, namespace, no_grad=True, tokenizer=tokenizer)
    assert len(full_ways) == 2
    assert_clean(small, before)
    small.resize_token_embeddings(len(tokenizer))
    assert nbgrad.trace(small, None, PATCH, namespace, no_grad=True, tokenizer=tokenizer).saved["patched"].shape == \
        (1, len(tokenizer))
    assert len(full_ways) == 3


def test_what_the_last_run_found_keeps_no_model_tokenizer_or_weight_alive(model):
    tokenizer = copy.deepcopy(nbgrad.tokenizer_for(model))
    small = _small_model(tokenizer)
    namespace = {"model": small, "CLEAN": EIFFEL, "CORRUPT": COLOSSEUM}
    nbgrad.trace(small, None, PATCH, namespace, no_grad=True, tokenizer=tokenizer)
    tokenizer_gone = weakref.ref(tokenizer)
    del tokenizer
    gc.collect()
    assert tokenizer_gone() is None
    with pytest.raises(nbgrad.InputError, match="^line 2: a text INPUT needs a tokenizer"):   # (the model has none)
        nbgrad.trace(small, None, PATCH, namespace, no_grad=True)
    model_gone, weight_gone = weakref.ref(small), weakref.ref(small.transformer.wte.weight)
    del small, namespace
    gc.collect()
    assert model_gone() is None and weight_gone() is None


@pytest.mark.parametrize("kept", [False, True], ids=["the full way, then keep", "again"])
def test_an_interrupt_at_any_line_of_the_preparation_leaves_nothing_and_the_next_cell_works(model, kept, monkeypatch):
    """A KeyboardInterrupt at each line prepare.py runs (its every line event), on a cell's first run (`keep`) and on
    a run again (`again`): no hook on the model, no name of ours in the namespace, and the next cell is right."""
    monkeypatch.setattr(prepare, "_last", {})
    before = model_state(model)
    namespace = {"model": model, "CLEAN": EIFFEL, "CORRUPT": COLOSSEUM}
    expected = _patched_by_hooks(model, EIFFEL, COLOSSEUM)

    def run():
        return nbgrad.trace(model, None, PATCH, namespace, no_grad=True)
    if kept:
        run()
    with Injector(record=True) as clean:
        run()
    points = [k for k, (filename, _, _) in enumerate(clean.lines, start=1) if filename == "prepare.py"]
    assert len(points) > 10
    for k in points:
        if not kept:
            prepare._last.clear()
        with pytest.raises(KeyboardInterrupt):
            with Injector(at=k):
                run()
        assert_clean(model, before)
        assert set(namespace) <= {"model", "CLEAN", "CORRUPT", "clean", "patched", "__builtins__"}
        torch.testing.assert_close(run().saved["patched"], expected, atol=1e-4, rtol=1e-4)
