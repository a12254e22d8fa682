"""An error about a canonical name says it as the cell wrote it (`model.layers[7]`), and the model's own path
second at most: a misspelled name, an index past the last layer (written, or reached in a loop), a name the family
lacks; in a trace and in an edit. The model is clean after each and the next cell runs."""
import pytest

import nbgrad
from nbgrad.engine.edit.edits import active_edits
from nbgrad.errors import ModulePathError, NbgradError
from canonical_models import IDS, build
from helpers import assert_clean, model_state

SAVE = "x = model.layers[1].resid_post.save()"


@pytest.fixture(scope="module")
def llama():
    return build("llama")


def refused(model, source, error_type, message, run=nbgrad.trace):
    before = model_state(model)
    with pytest.raises(error_type) as caught:
        run(model, source) if run is nbgrad.edit else run(model, IDS, source)
    assert str(caught.value) == message
    assert_clean(model, before)
    assert active_edits(model) == []
    assert nbgrad.trace(model, IDS, SAVE).saved["x"].shape == (1, 6, 16)


@pytest.mark.parametrize("run", [nbgrad.trace, nbgrad.edit])
@pytest.mark.parametrize("index", ["7", "-3", "2"])
def test_a_layer_past_the_last(llama, run, index):
    refused(llama, f"model.layers[{index}].resid_post[:] *= 2", ModulePathError,
            f"line 1: model.layers[{index}] is not in the model: model.layers has 2 layers, indices 0–1 (or -2–-1) "
            f"(model.model.layers[{index}] in the model's own paths)", run)


def test_a_layer_past_the_last_reached_in_a_loop(llama):
    refused(llama, "x = [model.layers[i].resid_post.save() for i in range(5)]", ModulePathError,
            "line 1: model.layers[i].resid_post: IndexError: index 2 is out of range (model.model.layers[i].output "
            "in the model's own paths)")


@pytest.mark.parametrize("written, nearest", [("model.layers[0].resid_pots", "resid_post, resid_pre, resid_mid"),
                                              ("model.layers[1].attn.qq", "q"),
                                              ("model.layers[1].mlp.postt", "post"),
                                              ("model.layers[0].ln3.output", "ln2, ln1")])
def test_a_misspelled_name(llama, written, nearest):
    name = written.removesuffix(".output")
    refused(llama, f"x = {written}.save()", NbgradError,
            f"line 1: canonical names: {name} is not a canonical name; nearest: {nearest}")


def test_a_name_the_family_lacks():
    refused(build("gptj"), "x = model.layers[0].resid_mid.save()", NbgradError,
            "line 1: canonical names: model.layers[0].resid_mid: the gptj family has no resid_mid (attention and MLP "
            "run in parallel from the same input, so the stream has no point between them)")


def test_a_name_the_family_lacks_in_llama(llama):
    refused(llama, "x = model.pos_embed.output.save()", NbgradError,
            "line 1: canonical names: model.pos_embed: the llama family has no pos_embed (no learned positions)")


def test_a_layer_past_the_last_reached_in_a_loop_of_a_generation(llama):
    before = model_state(llama)
    with pytest.raises(ModulePathError) as caught:
        nbgrad.generate(llama, IDS, "x = [model.layers[i].resid_post.save() for i in range(5)]", max_new_tokens=2)
    assert str(caught.value) == ("line 1: model.layers[i].resid_post: IndexError: index 2 is out of range (at "
                                 "generation step 0) (model.model.layers[i].output in the model's own paths)")
    assert_clean(llama, before)
    assert len(nbgrad.generate(llama, IDS, SAVE, max_new_tokens=2).saved["x"]) == 2
