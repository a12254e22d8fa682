"""Every argument of `nbgrad.edit` and every part of a `%%edit` line is checked for its kind before anything is
installed: one message each, no edit and no hook left on the model, and the next edit installs."""
import pytest
import torch
from IPython.core.error import UsageError

import nbgrad
from nbgrad.engine.edit.edits import active_edits
from nbgrad.errors import ArgumentError, NbgradError
from helpers import assert_clean, hook_count, model_state, tiny_gpt2

IDS = torch.tensor([[1, 2, 3]])
EDIT = "model.transformer.h[0].output[:] *= 0.5"


@pytest.fixture
def model():
    return tiny_gpt2(n_layer=2)


def works(model):
    """The next edit installs and edits the model; removed, the model is as it was."""
    plain = model(IDS).logits
    with nbgrad.edit(model, EDIT, label="halve block 0") as again:
        assert again.label == "halve block 0" and not torch.equal(model(IDS).logits, plain)
    assert torch.equal(model(IDS).logits, plain) and active_edits(model) == []


@pytest.mark.parametrize("arguments, said", [
    ((None, EDIT), "the model to trace is None, not a torch.nn.Module: pass the module itself"),
    (("model", EDIT), "the model to trace is a str `'model'`, not a torch.nn.Module"),
    ((IDS, EDIT), "the model to trace is a Tensor `tensor([[1, 2, 3]])`, not a torch.nn.Module"),
    (("MODEL", 5), "nbgrad.edit: source is an int `5`, not a str: give the body of the cell as text"),
    (("MODEL", EDIT, [1]), "namespace is a list `[1]`, not a dict: pass the dict of names"),
    (("MODEL", EDIT, None, 3), "nbgrad.edit: label is an int `3`, not a str: give the text that %nbgrad and the "
                               "sidebar list the edit under"),
    (("MODEL", EDIT, None, None), "nbgrad.edit: label is None, not a str"),
    (("MODEL", EDIT, None, b"x"), "nbgrad.edit: label is a bytes `b'x'`, not a str"),
])
def test_each_argument_of_the_wrong_kind(model, arguments, said):
    before = model_state(model)
    arguments = tuple(model if value == "MODEL" else value for value in arguments)
    with pytest.raises(ArgumentError) as caught:
        if len(arguments) == 4:
            nbgrad.edit(*arguments[:3], label=arguments[3])
        else:
            nbgrad.edit(*arguments)
    assert str(caught.value).startswith(said), str(caught.value)
    assert_clean(model, before)
    assert active_edits(model) == []
    works(model)


@pytest.mark.parametrize("line, error, said", [
    ("", UsageError, "usage: %%edit MODEL [--out NAME]; see %%edit?"),
    ("--out e", UsageError, "usage: %%edit MODEL [--out NAME]; see %%edit?"),
    ("model --bogus", UsageError, "unknown option --bogus for %%edit; its options are --out (see %%edit?)"),
    ("model -q", UsageError, "unknown option -q for %%edit; its options are --out (see %%edit?)"),
    ("model --out", UsageError, "--out needs a value: bind the Edit to NAME"),
    ("model --out 3x", UsageError, "--out takes a name to bind the Edit to, not `3x`"),
    ("model --out e.f", UsageError, "--out takes a name to bind the Edit to, not `e.f`"),
    ("model ids", UsageError, "%%edit MODEL takes no INPUT: `ids` follows MODEL, and an edit applies to every later "
                              "call of the model, whatever its input (see %%edit?)"),
    ("nomodel", NbgradError, "unknown model 'nomodel': MODEL is the name of a module in the notebook"),
    ("mödel", NbgradError, "unknown model 'mödel'"),
    ("ids", NbgradError, "'ids' is a Tensor, not a torch.nn.Module"),
])
def test_each_part_of_the_line_of_the_wrong_kind(shell, line, error, said):
    model = shell.user_ns["model"] = tiny_gpt2(n_layer=2)
    shell.user_ns["ids"] = IDS
    names = set(shell.user_ns)
    with pytest.raises(error) as caught:
        shell.run_cell_magic("edit", line, EDIT)
    assert str(caught.value) == said or str(caught.value).startswith(said), str(caught.value)
    assert set(shell.user_ns) == names and active_edits(model) == [] and hook_count(model) == 0
    edit = shell.run_cell_magic("edit", "model --out e", EDIT)
    assert shell.user_ns.pop("e") is edit and edit.label == "%%edit model --out e"
    edit.remove()
    for name in ("model", "ids"):
        shell.user_ns.pop(name)
