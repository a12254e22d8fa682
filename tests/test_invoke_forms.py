"""Invokes made under an `if`, in a function the cell calls and in a comprehension (SPEC §2, several inputs in
one cell): one batch row set per block entered, each value equal to one trace per patch and to plain hooks."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
OTHER = "Paris is"
LAYERS = 3


@pytest.fixture(scope="module")
def model():
    return nbgrad.load_model()


def ids_of(model, prompt):
    return nbgrad.tokenizer_for(model)(prompt, return_tensors="pt")["input_ids"]


def hooked_last_logits(model, prompt, layer=None, scale=0.0):
    """Plain PyTorch: the last position's logits of `prompt` alone, with block `layer`'s output at the last
    position multiplied by `scale` (no edit when `layer` is None)."""
    def hook(module, args, output):
        output = output.clone()
        output[:, -1] *= scale
        return output
    handle = None if layer is None else model.transformer.h[layer].register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(ids_of(model, prompt)).logits[0, -1]
    finally:
        if handle is not None:
            handle.remove()


def one_trace(model, prompt, layer):
    """The same patch as one trace of its own."""
    return nbgrad.trace(model, prompt, f"model.transformer.h[{layer}].output[:, -1] *= 0\n"
                                       "out = model.lm_head.output[0, -1].save()", {"model": model},
                        no_grad=True).saved["out"]


def test_an_if_in_a_loop_enters_the_invokes_its_test_chooses(model):
    before = model_state(model)
    namespace = {"model": model, "corrupt": CORRUPT, "other": OTHER, "LAYERS": LAYERS}
    result = nbgrad.trace(model, None, """
patched, plain = {}, {}
for layer in range(LAYERS):
    if layer % 2 == 0:
        with invoke(corrupt):
            model.transformer.h[layer].output[:, -1] *= 0
            logits = model.lm_head.output[0, -1]
            patched[layer] = logits.save()
    else:
        with invoke(other):
            plain[layer] = model.lm_head.output[0, -1].save()
""", namespace, no_grad=True)
    assert result.invokes == [CORRUPT, OTHER, CORRUPT]        # one invoke per block entered, in order
    assert sorted(namespace["patched"]) == [0, 2] and sorted(namespace["plain"]) == [1]
    for layer in (0, 2):
        expected = hooked_last_logits(model, CORRUPT, layer)
        assert torch.allclose(namespace["patched"][layer], expected, atol=1e-4), layer
        assert torch.allclose(namespace["patched"][layer], one_trace(model, CORRUPT, layer), atol=1e-4), layer
    assert torch.allclose(namespace["plain"][1], hooked_last_logits(model, OTHER), atol=1e-4)
    assert torch.equal(namespace["logits"], namespace["patched"][2])     # the last iteration that bound it
    assert not [name for name in namespace if name.startswith("_nbgrad")]
    assert_clean(model, before)


def test_an_if_at_the_top_level_takes_its_else(model):
    namespace = {"model": model, "use_clean": False}
    result = nbgrad.trace(model, None, f"""
if use_clean:
    with invoke({CLEAN!r}):
        out = model.lm_head.output[0, -1].save()
else:
    with invoke({OTHER!r}):
        out = model.lm_head.output[0, -1].save()
""", namespace, no_grad=True)
    assert result.invokes == [OTHER]
    assert torch.allclose(namespace["out"], hooked_last_logits(model, OTHER), atol=1e-4)


@pytest.mark.parametrize("source, message", [
    ("limit = 1\nfor layer in range(3):\n    if layer > limit:\n        with invoke('Paris'):\n"
     "            x = model.lm_head.output.save()",
     "line 3: an `if` around `with invoke(...)` is decided before the model runs: `0 > limit` reads `limit`, "
     "which this cell binds; compute it in an earlier cell"),
    ("n = 2\nfor i in range(n):\n    with invoke('Paris'):\n        x = model.lm_head.output.save()",
     "line 2: a `for` loop that makes invokes (or reads `.grad` of a name it binds) runs over its elements before "
     "the model does: `range(n)` reads `n`, which this cell binds; compute it in an earlier cell"),
    ("for i in range(2):\n    if model.lm_head.output.sum() > 0:\n        with invoke('Paris'):\n"
     "            x = model.lm_head.output.save()",
     "line 2: an `if` around `with invoke(...)` is decided before the model runs: "
     "`model.lm_head.output.sum() > 0` could not be evaluated from the notebook's names (AttributeError"),
])
def test_what_decides_the_invokes_must_be_known_before_the_run(model, source, message):
    """A test or an iterable that reads a name the cell binds would see the notebook's old value: refused."""
    before = model_state(model)
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, source, {"model": model, "n": 5, "limit": 0})
    assert message in str(caught.value)
    assert_clean(model, before)
