"""Bad input to the newest public surfaces (nbgrad.scan, nbgrad.edit / %%edit, %names, runner=, --over / --out):
one clear message of nbgrad's that says what is wrong and what to write, never a traceback from deep inside nor a
silent wrong run; the model is clean after each and the next call works."""
import os

import pytest
import torch
from IPython.core.error import UsageError

import nbgrad
from nbgrad.errors import ArgumentError, NbgradError
from helpers import assert_clean, model_state, tiny_gpt2

IDS = torch.tensor([[1, 2, 3]])
SAVE = "h = model.transformer.h[0].output.save()"
EDIT = "model.transformer.h[0].output[:] *= 0.5"


@pytest.fixture
def model():
    return tiny_gpt2(n_layer=2)


@pytest.mark.parametrize("call, run", [
    ("nbgrad.trace", lambda m, source: nbgrad.trace(m, IDS, source)),
    ("nbgrad.scan", lambda m, source: nbgrad.scan(m, IDS, source)),
    ("nbgrad.edit", lambda m, source: nbgrad.edit(m, source)),
    ("nbgrad.backward", lambda m, source: nbgrad.backward(torch.ones(2, requires_grad=True).sum(), source)),
])
@pytest.mark.parametrize("source, said", [(None, "None"), (3, "an int `3`"), (b"x = 1", "a bytes `b'x = 1'`")])
def test_a_source_that_is_not_text(model, call, run, source, said):
    before = model_state(model)
    with pytest.raises(ArgumentError) as caught:
        run(model, source)
    assert str(caught.value).startswith(f"{call}: source is {said}, not a str: give the body of the cell as text")
    assert_clean(model, before)
    assert nbgrad.trace(model, IDS, SAVE).saved["h"].shape == (1, 3, 32)


@pytest.mark.parametrize("value, said", [(None, "None"), ("model", "a str `'model'`")])
def test_scan_of_something_that_is_not_a_module(value, said):
    with pytest.raises(ArgumentError) as caught:
        nbgrad.scan(value, IDS, SAVE)
    assert str(caught.value) == (f"the model to trace is {said}, not a torch.nn.Module: pass the module itself "
                                 f"(e.g. `model = nbgrad.load_model()`)")


def test_scan_with_a_namespace_that_is_not_a_dict(model):
    with pytest.raises(ArgumentError, match=r"^namespace is a list `\[1\]`, not a dict: pass the dict of names"):
        nbgrad.scan(model, IDS, SAVE, [1])


def test_scan_takes_no_folder_and_a_known_runner(model):
    with pytest.raises(NbgradError, match="nbgrad.scan runs the cell here, on fake tensors: `out` does not apply"):
        nbgrad.scan(model, None, SAVE, over=[IDS[0]], out="acts")
    with pytest.raises(ArgumentError, match=r"^runner='slow': a run's runner is \"fast\""):
        nbgrad.scan(model, IDS, SAVE, runner="slow")


@pytest.mark.parametrize("runner", ["slow", None, 1])
def test_an_unknown_runner(model, runner):
    before = model_state(model)
    for call in (lambda: nbgrad.trace(model, IDS, SAVE, runner=runner),
                 lambda: nbgrad.backward(torch.ones(2, requires_grad=True).sum(), "", runner=runner)):
        with pytest.raises(ArgumentError) as caught:
            call()
        assert str(caught.value).startswith(f"runner={runner!r}: a run's runner is \"fast\" (the default")
    assert_clean(model, before)


@pytest.mark.parametrize("out, said", [(5, "an int `5`"), (["acts"], "a list `['acts']`"), ("", "an empty path"),
                                       ("  ", "an empty path")])
def test_an_out_folder_that_is_not_a_path(model, tmp_path, monkeypatch, out, said):
    """Not written as `str(out)` into the working folder (`5/`, `['acts']/`), nor, for "", into the working folder
    itself."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArgumentError) as caught:
        nbgrad.trace(model, None, SAVE, over=[IDS[0], IDS[0]], out=out)
    assert str(caught.value) == (f"--out (out=) is {said}, not a folder: give the path of a folder (made if "
                                 f"missing), e.g. --out acts/")
    assert os.listdir(tmp_path) == []


def test_a_removed_edit_cannot_be_entered_again(model):
    """`with edit:` after `edit.remove()` would run the block without the edit, silently."""
    edit = nbgrad.edit(model, EDIT)
    edit.remove()
    plain = model(IDS).logits
    with pytest.raises(NbgradError) as caught:
        with edit:
            pass
    assert str(caught.value) == ("nbgrad.edit(GPT2LMHeadModel) was removed: it is no longer on the model; install "
                                 "it again with nbgrad.edit(model, source) (or %%edit)")
    assert torch.equal(model(IDS).logits, plain)
    with nbgrad.edit(model, EDIT) as again:          # a fresh one enters, and leaves nothing behind
        assert again.active and not torch.equal(model(IDS).logits, plain)
    assert torch.equal(model(IDS).logits, plain)


def test_names_of_something_that_is_not_a_model(shell):
    shell.user_ns["not_a_model"] = 5
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("names", "not_a_model")
    assert str(caught.value) == ("%names MODEL: `not_a_model` is an int, not a model: give a torch.nn.Module of a "
                                 "known family (nbgrad.names.FAMILIES)")


def test_a_name_the_edit_reads_that_is_not_defined_is_said_when_installed(model):
    """Not a NameError at every later call of the model (plain calls, generate, traces), as it was."""
    before = model_state(model)
    with pytest.raises(NbgradError) as caught:
        nbgrad.edit(model, "d = direction * 2\nmodel.transformer.h[0].output[:] += d", {"model": model})
    assert str(caught.value) == ("line 1: name 'direction' is not defined: an edit reads the notebook's names when "
                                 "it is installed; define direction first (in an earlier cell), then install the edit")
    assert_clean(model, before)
    plain = model(IDS).logits
    with nbgrad.edit(model, "d = direction * 2\nmodel.transformer.h[0].output[:] += d",
                     {"model": model, "direction": torch.ones(32)}):
        assert not torch.equal(model(IDS).logits, plain)
    assert torch.equal(model(IDS).logits, plain)
