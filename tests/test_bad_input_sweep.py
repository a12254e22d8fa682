"""Every magic and every public entry point fed wrong input: an unknown model, something that is not a module, an
empty or broken body, an unknown option or one without its value, an INPUT of a wrong kind, a path that is not
there, names beyond ASCII. Each gives one clear error (nbgrad's, IPython's usage error, or the user's own
SyntaxError / NameError), never an internal traceback; the model has no hook after it, the namespace holds nothing
new, and the next cell works."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from IPython.core.error import UsageError

import nbgrad
from nbgrad.errors import ArgumentError, InputError, ModulePathError, NbgradError
from helpers import assert_clean, hook_count, model_state, tiny_gpt2

SAVE = "h = model.transformer.h[0].output.save()"
EDIT = "model.transformer.h[0].output[:] *= 0.5"
NEXT = "kept = model.transformer.h[1].output.save()"

# (id, cell or line magic, its line, its body, the error, a fragment of its message)
MAGICS = [
    ("trace: unknown model", "trace", "nomodel ids", SAVE, NbgradError, "unknown model 'nomodel'"),
    ("trace: not a module", "trace", "num ids", SAVE, NbgradError, "'num' is an int, not a torch.nn.Module"),
    ("trace: syntax error", "trace", "model ids", "h = ((", SyntaxError, "was never closed"),
    ("trace: unknown option", "trace", "model ids --bogus", SAVE, UsageError, "unknown option --bogus for %%trace"),
    ("trace: option without value", "trace", "model ids --tokenizer", SAVE, UsageError, "--tokenizer needs a value"),
    ("trace: INPUT of a wrong kind", "trace", "model 3.5", SAVE, InputError, "INPUT is a float; INPUT may be"),
    ("trace: INPUT of no dimensions", "trace", "model torch.tensor(3)", SAVE, InputError,
     "INPUT is a tensor of no dimensions (the one number 3)"),
    ("trace: no INPUT", "trace", "model", SAVE, InputError, "missing INPUT"),
    ("trace: no MODEL", "trace", "", SAVE, UsageError, "usage: %%trace MODEL INPUT"),
    ("trace: a path not in the model", "trace", "model ids", "h = model.transformer.hh[0].output.save()",
     ModulePathError, "model.transformer.hh is not in the model"),
    ("trace: a unicode model name", "trace", "mödel ids", SAVE, NbgradError, "unknown model 'mödel'"),
    ("trace: a unicode name unbound", "trace", "model ids", "h = model.transformer.h[0].output * größe",
     NameError, "größe"),
    ("trace: invoke with two INPUTs", "trace", "model", "with invoke(ids, ids):\n    " + SAVE, NbgradError,
     "takes one INPUT"),
    ("over: unknown option", "trace", "model --over rows --bogus", SAVE, UsageError, "unknown option --bogus"),
    ("over: without its value", "trace", "model --over", SAVE, UsageError, "--over needs a value"),
    ("over: not a dataset", "trace", "model --over 5", SAVE, InputError, "--over takes a list of prompts"),
    ("over: a batch size of 0", "trace", "model --over rows --batch-size 0", SAVE, ArgumentError,
     "--batch-size must be a positive integer"),
    ("over: an unbound dataset", "trace", "model --over nothing", SAVE, InputError, "`nothing` could not be evaluated"),
    ("over: an example of a wrong kind", "trace", "model --over [3.5]", SAVE, NbgradError,
     "example 0 (INPUT 3.5): INPUT is a float"),
    ("over: a syntax error", "trace", "model --over rows", "h = ((", SyntaxError, "was never closed"),
    ("backward: not a tensor", "backward", "num", "pass", ArgumentError, "LOSS is an int `5`, not a tensor"),
    ("backward: unbound LOSS", "backward", "nothing", "pass", InputError, "LOSS `nothing` could not be evaluated"),
    ("backward: unknown option", "backward", "x.sum() --bogus", "pass", UsageError, "unknown option --bogus"),
    ("backward: option without value", "backward", "x.sum() --grad-output", "pass", UsageError,
     "--grad-output needs a value"),
    ("backward: syntax error", "backward", "x.sum()", "x.grad = ((", SyntaxError, "was never closed"),
    ("backward: no LOSS", "backward", "", "pass", UsageError, "usage: %%backward LOSS"),
    ("generate: unknown model", "generate", "nomodel ids", SAVE, NbgradError, "unknown model 'nomodel'"),
    ("generate: not a module", "generate", "num ids", SAVE, NbgradError, "'num' is an int"),
    ("generate: syntax error", "generate", "model ids", "h = ((", SyntaxError, "was never closed"),
    ("generate: unknown option", "generate", "model ids --bogus", SAVE, UsageError, "unknown option --bogus"),
    ("generate: option without value", "generate", "model ids --max-new-tokens", SAVE, UsageError,
     "--max-new-tokens needs a value"),
    ("generate: a count that is not one", "generate", "model ids --max-new-tokens -1", SAVE, InputError,
     "a whole number of at least 1, not -1"),
    ("generate: INPUT of a wrong kind", "generate", "model 3.5", SAVE, InputError, "INPUT is a float"),
    ("generate: kwargs not a dict", "generate", "model ids --kwargs 5", SAVE, InputError,
     "--kwargs must be a dict of `generate` keywords, not an int"),
    ("generate: --out not a name", "generate", "model ids --out 3x", SAVE, UsageError,
     "--out takes a name to bind the token ids to; `3x` is not one"),
    ("trace: --out without --over", "trace", "model ids --out acts", SAVE, ArgumentError,
     "--out (out=) is for a run over a dataset"),
    ("over: a folder that cannot be made", "trace", "model --over rows --out /proc/nope/acts", SAVE, ArgumentError,
     "--out /proc/nope/acts: the folder cannot be written"),
    ("trace: a flag with a value", "trace", "model ids --no-grad=1", SAVE, UsageError, "--no-grad takes no value"),
    ("trace: INPUT and invokes", "trace", "model ids", "with invoke(ids):\n    " + SAVE, InputError,
     "INPUT on the %%trace line and `with invoke(...)` blocks together"),
    ("trace: an unbound invoke INPUT", "trace", "model", "with invoke(nothing):\n    " + SAVE, InputError,
     "invoke INPUT `nothing` could not be evaluated"),
    ("trace: a skip of None", "trace", "model ids", "model.transformer.h[0].skip(None)", NbgradError,
     "None is no output"),
    ("trace: a cache of a number", "trace", "model ids", "c = cache(5)", NbgradError,
     "cache(modules=...) takes a glob"),
    ("edit: unknown model", "edit", "nomodel", EDIT, NbgradError, "unknown model 'nomodel'"),
    ("edit: not a module", "edit", "num", EDIT, NbgradError, "'num' is an int, not a torch.nn.Module"),
    ("edit: syntax error", "edit", "model", "model.transformer.h[0].output[:] *= (", SyntaxError, "never closed"),
    ("edit: unknown option", "edit", "model --bogus", EDIT, UsageError, "unknown option --bogus for %%edit"),
    ("edit: option without value", "edit", "model --out", EDIT, UsageError, "--out needs a value"),
    ("edit: a path not in the model", "edit", "model", "model.transformer.hh[0].output[:] = 0", ModulePathError,
     "model.transformer.hh is not in the model"),
    ("edit: a save", "edit", "model", SAVE, NbgradError, "an edit has no cell to return to"),
    ("names: not a model", "names", "num", None, UsageError, "`num` is an int, not a model"),
    ("names: unbound", "names", "nothing", None, InputError, "MODEL `nothing` could not be evaluated"),
    ("names: an option", "names", "model --bogus", None, UsageError, "%names MODEL takes no options"),
    ("names: nothing", "names", "", None, UsageError, "%names MODEL: give a model"),
    ("names: a unicode name", "names", "mödel", None, InputError, "name 'mödel' is not defined"),
    ("source: not a module", "source", "num", None, NbgradError, "takes a module or a Python function, not an int"),
    ("source: a path not in the model", "source", "model.transformer.hh", None, InputError,
     "MODULE `model.transformer.hh` could not be evaluated: AttributeError"),
    ("source: an option", "source", "model -q", None, UsageError, "%source MODULE takes no options"),
    ("source: nothing", "source", "", None, UsageError, "%source MODULE: give a module"),
    ("nbgrad: an option", "nbgrad", "--bogus", None, UsageError, "%nbgrad takes nothing after it, not `--bogus`"),
]


@pytest.fixture
def notebook(shell):
    model = tiny_gpt2(n_layer=2)
    values = {"model": model, "ids": torch.tensor([[1, 2, 3]]), "num": 5, "x": torch.ones(3, requires_grad=True),
              "rows": [torch.tensor([1, 2]), torch.tensor([3, 4])]}
    shell.user_ns.update(values)
    yield shell, model
    for name in list(values) + ["kept"]:
        shell.user_ns.pop(name, None)


def next_cell_works(shell, model):
    shell.run_cell_magic("trace", "model ids -q", NEXT)
    assert shell.user_ns.pop("kept").shape == (1, 3, 32)
    assert hook_count(model) == 0


@pytest.mark.parametrize("case", MAGICS, ids=[case[0] for case in MAGICS])
def test_each_magic_with_wrong_input(notebook, case):
    shell, model = notebook
    _, magic, line, body, error, fragment = case
    names, before = set(shell.user_ns), model_state(model)
    with pytest.raises(error) as caught:
        if body is None:
            shell.run_line_magic(magic, line)
        else:
            shell.run_cell_magic(magic, line, body)
    assert fragment in str(caught.value), str(caught.value)
    assert set(shell.user_ns) == names
    assert_clean(model, before)
    next_cell_works(shell, model)


X = torch.ones(3, requires_grad=True)
IDS = torch.tensor([[1, 2, 3]])
# (id, a call of the model, the error, a fragment of its message)
CALLS = [
    ("trace: not a module", lambda m: nbgrad.trace(5, IDS, SAVE), ArgumentError, "the model to trace is an int"),
    ("trace: source not text", lambda m: nbgrad.trace(m, IDS, None), ArgumentError, "source is None, not a str"),
    ("trace: syntax error", lambda m: nbgrad.trace(m, IDS, "h = (("), SyntaxError, "was never closed"),
    ("trace: INPUT of a wrong kind", lambda m: nbgrad.trace(m, 3.5, SAVE), InputError, "INPUT is a float"),
    ("trace: a tokenizer that is not one", lambda m: nbgrad.trace(m, "hi", SAVE, tokenizer=5), ArgumentError,
     "--tokenizer (tokenizer=) is an int `5`, not a tokenizer"),
    ("trace: namespace not a dict", lambda m: nbgrad.trace(m, IDS, SAVE, [1]), ArgumentError,
     "namespace is a list"),
    ("trace: a path not in the model", lambda m: nbgrad.trace(m, IDS, "h = model.transformer.hh.output"),
     ModulePathError, "model.transformer.hh is not in the model"),
    ("trace: over a number", lambda m: nbgrad.trace(m, None, SAVE, over=5), InputError, "--over takes a list"),
    ("trace: an unknown engine", lambda m: nbgrad.trace(m, None, SAVE, over=[IDS[0]], engine="spark"), ArgumentError,
     "--engine is 'local' or 'ray', not 'spark'"),
    ("backward: not a tensor", lambda m: nbgrad.backward(5), ArgumentError, "LOSS is an int `5`, not a tensor"),
    ("backward: syntax error", lambda m: nbgrad.backward(X.sum(), "x.grad = (("), SyntaxError, "never closed"),
    ("generate: not a module", lambda m: nbgrad.generate(5, IDS, SAVE), NbgradError, "int has none"),
    ("generate: source not text", lambda m: nbgrad.generate(m, IDS, None), ArgumentError,
     "nbgrad.generate: source is None, not a str"),
    ("generate: namespace not a dict", lambda m: nbgrad.generate(m, IDS, SAVE, [1]), ArgumentError,
     "namespace is a list"),
    ("generate: a tokenizer that is not one", lambda m: nbgrad.generate(m, "hi", SAVE, tokenizer=[1]),
     ArgumentError, "--tokenizer (tokenizer=) is a list `[1]`, not a tokenizer"),
    ("generate: a count that is text", lambda m: nbgrad.generate(m, IDS, SAVE, max_new_tokens="3"), InputError,
     "not '3'"),
    ("edit: not a module", lambda m: nbgrad.edit(5, EDIT), ArgumentError, "the model to trace is an int"),
    ("edit: a label that is not text", lambda m: nbgrad.edit(m, EDIT, label=3), ArgumentError,
     "label is an int `3`, not a str"),
    ("edit: an empty body", lambda m: nbgrad.edit(m, ""), NbgradError, "this one touches no module"),
    ("scan: not a module", lambda m: nbgrad.scan(5, IDS, SAVE), ArgumentError, "the model to trace is an int"),
    ("scan: an unknown option", lambda m: nbgrad.scan(m, IDS, SAVE, bogus=1), ArgumentError,
     "nbgrad.scan (the options of nbgrad.trace): unknown option bogus=; its options are no_grad, tokenizer"),
    ("scan: a misspelt option", lambda m: nbgrad.scan(m, IDS, SAVE, tokeniser=None), ArgumentError,
     "nbgrad.scan (the options of nbgrad.trace): unknown option tokeniser=; did you mean tokenizer=? its options"),
    ("scan: INPUT of a wrong kind", lambda m: nbgrad.scan(m, 3.5, SAVE), InputError, "INPUT is a float"),
    ("remote: not a name", lambda m: nbgrad.remote(5), NbgradError, "takes a model name or path"),
    ("remote: num_gpus as text", lambda m: nbgrad.remote("gpt2", num_gpus="two"), ArgumentError,
     "num_gpus= is a str `'two'`, not a number of GPUs"),
    ("remote: a name that is not text", lambda m: nbgrad.remote("gpt2", name=5), ArgumentError,
     "name= is an int `5`, not a name"),
    ("remote: resources not a dict", lambda m: nbgrad.remote("gpt2", resources=["GPU"]), ArgumentError,
     "resources= is a list `['GPU']`, not a dict"),
    ("load_model: a path that is not there", lambda m: nbgrad.load_model("/nonexistent/checkpoint"), NbgradError,
     "load_model: there is no folder '/nonexistent/checkpoint'"),
    ("load_model: not a name", lambda m: nbgrad.load_model(5), ArgumentError, "load_model takes a hub name"),
]


@pytest.mark.parametrize("case", CALLS, ids=[case[0] for case in CALLS])
def test_each_call_with_wrong_input(case):
    model = tiny_gpt2(n_layer=2)
    _, call, error, fragment = case
    before = model_state(model)
    with pytest.raises(error) as caught:
        call(model)
    assert fragment in str(caught.value), str(caught.value)
    assert_clean(model, before)
    assert nbgrad.trace(model, IDS, NEXT).saved["kept"].shape == (1, 3, 32)


MODEL = [tiny_gpt2(n_layer=2)]       # one model for every example hypothesis draws
WRONG_INPUTS = st.one_of(st.floats(), st.integers(), st.booleans(), st.binary(max_size=4),
                         st.complex_numbers(), st.sets(st.integers(), max_size=2),
                         st.lists(st.one_of(st.floats(), st.integers(), st.none()), min_size=1, max_size=3),
                         st.integers(0, 96).map(torch.tensor))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=WRONG_INPUTS)
def test_any_input_of_a_wrong_kind_is_an_input_error(value):
    """Neither text, ids of [batch, positions], a dict nor a tuple (nor None, a missing INPUT): one InputError,
    whatever it is."""
    model = MODEL[0]
    before = model_state(model)
    with pytest.raises(InputError) as caught:
        nbgrad.trace(model, value, SAVE)
    assert str(caught.value).startswith("INPUT is ")
    assert_clean(model, before)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.text(max_size=12))
def test_any_text_runs_or_says_it_is_empty(default_model, prompt):
    """Unicode of any kind is tokenized and run (one row per token), or an empty prompt is refused."""
    before = model_state(default_model)
    ids = nbgrad.tokenizer_for(default_model)(prompt, return_tensors="pt")["input_ids"]
    if ids.shape[-1] == 0:
        with pytest.raises(InputError, match="INPUT is an empty string"):
            nbgrad.trace(default_model, prompt, "h = model.transformer.h[0].output.save()")
    else:
        saved = nbgrad.trace(default_model, prompt, "h = model.transformer.h[0].output.save()").saved["h"]
        assert saved.shape[:2] == ids.shape
    assert_clean(default_model, before)



@pytest.mark.parametrize("cell, line, meant", [("x = model.transformer.h[0].output\nx.save(1)\n", 2, ""),
                                               ("x = model.transformer.h[0].output.sav()\n", 1,
                                                "did you mean `.save()`? ")])
def test_a_save_not_written_as_the_cells_save_gets_a_note(cell, line, meant):
    """A tensor has no `.save` of its own (plain PyTorch says the same): the note says how a save is written."""
    model = MODEL[0]
    before = model_state(model)
    with pytest.raises(AttributeError, match="'Tensor' object has no attribute 'sav") as caught:
        nbgrad.trace(model, IDS, cell)
    attribute = "save" if "save(1)" in cell else "sav"
    assert caught.value.__notes__ == [f"nbgrad: line {line}: {meant}`x.save()` keeps x after the cell, and takes no "
                                      f"arguments (`nbgrad.save(x)` is the same); a tensor has no `.{attribute}` of "
                                      f"its own"]
    assert_clean(model, before)
