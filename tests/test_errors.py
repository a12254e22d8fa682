"""Every forward-side error: its message names the cell line, and the model is clean after it."""
import traceback

import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2


@pytest.fixture
def model():
    return tiny_gpt2()


@pytest.fixture
def ids():
    return torch.tensor([[1, 2, 3, 4]])


def check(model, ids, source, error_type, *fragments, **kwargs):
    before = model_state(model)
    with pytest.raises(error_type) as caught:
        nbgrad.trace(model, ids, source, **kwargs)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)
    assert_clean(model, before)
    again = nbgrad.trace(model, ids, "x = model.transformer.h[1].output.save()")
    assert again.saved["x"].shape == (1, 4, 32)
    return caught.value


def test_syntax_error_in_body(model, ids):
    error = check(model, ids, "a = model.transformer.h[0].output\nb = (", SyntaxError)
    assert error.lineno == 2


def test_exception_in_body_points_at_the_cell_line(model, ids):
    error = check(model, ids, "a = model.transformer.h[0].output.save()\nb = a / 0\nc = {}['missing']", KeyError,
                  "missing")
    frames = traceback.extract_tb(error.__traceback__)
    assert frames[-1].lineno == 3 and frames[-1].filename.startswith("<nbgrad-cell-")
    assert frames[-1].line == "c = {}['missing']"
    assert not any("torch/nn" in f.filename for f in frames)


def test_bad_module_index_names_the_range(model, ids):
    check(model, ids, "x = 1\ny = model.transformer.h[12].output.save()", nbgrad.ModulePathError,
          "line 2", "h[12]", "has 4 blocks, indices 0–3")


def test_bad_module_name_suggests_the_nearest(model, ids):
    check(model, ids, "y = model.transformer.hh[0].output", nbgrad.ModulePathError,
          "line 1", "no submodule 'hh'", "nearest: h")


def test_module_not_in_the_model(model, ids):
    other = torch.nn.Linear(2, 2)
    check(model, ids, "y = other.output", nbgrad.OrderError, "line 1", "not part of the traced model",
          namespace={"model": model, "other": other})


def test_bad_input_says_what_input_may_be(model):
    before = model_state(model)
    with pytest.raises(nbgrad.InputError) as caught:
        nbgrad.trace(model, 3.5, "x = model.output")
    assert "INPUT is a float" in str(caught.value) and "list of strings" in str(caught.value)
    assert_clean(model, before)


def test_text_input_without_tokenizer(model):
    with pytest.raises(nbgrad.InputError, match="needs a tokenizer"):
        nbgrad.trace(model, "hello", "x = model.output")


def test_write_that_comes_too_late_names_both_lines(model, ids):
    check(model, ids, """
late = model.transformer.h[3].output
model.transformer.h[1].output[:] = late
""", nbgrad.OrderError, "line 3", "model.transformer.h[1].output is edited too late", "line 2",
          "model.transformer.h[3].output")


def test_replacement_after_the_module_ran(model, ids):
    check(model, ids, """
logits = model.output.logits
model.transformer.h[0].output = logits
""", nbgrad.OrderError, "line 3", "too late", "model.output (line 2)")


def test_keyboard_interrupt_in_body(model, ids):
    before = model_state(model)
    with pytest.raises(KeyboardInterrupt):
        nbgrad.trace(model, ids, "a = model.transformer.h[1].output\nraise KeyboardInterrupt")
    assert_clean(model, before)
    assert nbgrad.trace(model, ids, "b = model.transformer.h[1].output.save()").saved["b"] is not None


def test_interrupt_during_backward(model, ids):
    before = model_state(model)
    with pytest.raises(KeyboardInterrupt):
        nbgrad.trace(model, ids, """
hs = model.transformer.h[1].output
with model.output.logits.sum().backward():
    if hs.grad is not None:
        raise KeyboardInterrupt
""")
    model.zero_grad(set_to_none=True)
    assert_clean(model, before)


def test_magic_errors(shell, model, ids):
    shell.user_ns.update(err_model=model, ids=ids)
    before = model_state(model)
    with pytest.raises(nbgrad.NbgradError, match="unknown model 'nope'"):
        shell.run_cell_magic("trace", "nope ids", "x = 1")
    for not_a_name in ("5", "class"):
        with pytest.raises(nbgrad.NbgradError) as caught:
            shell.run_cell_magic("trace", f"{not_a_name} ids", "x = 1")
        assert str(caught.value).startswith(f"unknown model '{not_a_name}': MODEL is the name of a module in the "
                                            "notebook, such as `model` after `model = nbgrad.load_model()`")
        assert f"`{not_a_name} =" not in str(caught.value)
    with pytest.raises(nbgrad.InputError, match="missing INPUT"):
        shell.run_cell_magic("trace", "err_model", "x = 1")
    with pytest.raises(nbgrad.InputError, match="INPUT `undefined_thing` could not be evaluated"):
        shell.run_cell_magic("trace", "err_model undefined_thing", "x = 1")
    with pytest.raises(ZeroDivisionError):
        shell.run_cell_magic("trace", "err_model ids -q", "x = err_model.transformer.h[0].output\ny = 1 / 0")
    assert_clean(model, before)
    result = shell.run_cell("%%trace err_model ids -q\nz = err_model.transformer.h[0].output[0, 0].sum().item()")
    assert result.success and isinstance(shell.user_ns["z"], float)


def test_nbgrad_error_renders_as_one_message(shell, model, ids, capsys):
    shell.user_ns.update(err_model=model, ids=ids)
    result = shell.run_cell("%%trace err_model ids\nx = err_model.transformer.h[7].output")
    assert isinstance(result.error_in_exec, nbgrad.ModulePathError)
    lines = result.error_in_exec._render_traceback_()
    assert "line 1" in lines[0] and "indices 0–3" in lines[0]
    assert "caused by IndexError" in lines[1]


def test_magic_line_parsing_keeps_python_expressions(shell, model):
    shell.user_ns.update(err_model=model, parse_ids=torch.tensor([[1, 2, 3]]))
    shell.run_cell_magic("trace", 'err_model {"input_ids": parse_ids} --no-grad -q',
                         "a = err_model.transformer.h[0].output.save()")
    assert shell.user_ns["a"].grad_fn is None and shell.user_ns["a"].shape[:2] == (1, 3)


def test_module_event_inside_a_function_nbgrad_cannot_pause_in_is_a_clear_error(model, ids):
    check(model, ids, "x = 1\nlast = lambda m: m.transformer.h[-1].output\ny = last(model)",
          nbgrad.NbgradError, "line 2", "inside a function that nbgrad cannot pause in", "top level of the cell")


def test_cell_functions_keep_plain_pytorch_grad_and_backward(model, ids):
    namespace = {"model": model, "torch": torch}
    nbgrad.trace(model, ids, """
def step(t):
    loss = (t * 3).sum()
    loss.backward()
    return t.grad
w = torch.ones(2, requires_grad=True)
g = step(w).clone().save()
""", namespace)
    assert torch.equal(namespace["g"], torch.full((2,), 3.0))


def test_grad_of_a_module_or_a_site_names_the_gradient_it_means(model, ids):
    """A module, or a site held in a name, has no `.grad` of its own: the error says which `.grad` the cell
    means, the gradient into what it returns (a site written out, `X.source.SITE.grad`, is that one: see
    test_source_sites.py)."""
    check(model, ids, "b = model.transformer.h[0]\ng = b.grad.save()\nmodel.output.logits.sum().backward()",
          nbgrad.GradError, "line 2", "b is a module (GPT2Block), which has no gradient of its own",
          "is b.output.grad")
    check(model, ids, "s = model.transformer.h[0].attn.source.self_c_attn_1\n"
          "with model.output.logits.sum().backward():\n    s.grad[:] = 0", nbgrad.GradError, "line 3",
          "s is a site of a forward", "is s.output.grad")
    check(model, ids, "x = model.transformer.h[0].attn.source.self_c_attn_1.outptu", AttributeError,
          "the site GPT2Attention.source.self_c_attn_1 has no attribute 'outptu': a site has .output")
    from nbgrad.engine.run.sites import Site
    assert not hasattr(Site.__new__(Site), "output")       # one with no fields yet (a copy being made): no recursion


@pytest.mark.parametrize("cell, name", [("x = cache", "cache"), ("f = stop\nf()", "stop")])
def test_cache_or_stop_used_as_a_value_says_it_is_a_call(model, ids, cell, name):
    before = model_state(model)
    with pytest.raises(NameError, match=f"name '{name}' is not defined") as caught:
        nbgrad.trace(model, ids, cell, {"model": model})
    assert f"nbgrad: `{name}` is a call a %%trace body makes where it is needed" in "\n".join(caught.value.__notes__)
    assert_clean(model, before)


def test_nbgrad_error_shows_its_notes_in_ipython(shell, model, ids):
    """A note added to one of nbgrad's errors (by the user's code, or a library on the way out) is shown: IPython
    renders nbgrad's errors with `_render_traceback_`, which drops what it does not list."""
    shell.user_ns.update(err_model=model, ids=ids)
    result = shell.run_cell("try:\n    nbgrad.trace(err_model, ids, 'x = model.transformer.h[7].output')\n"
                            "except nbgrad.ModulePathError as error:\n    error.add_note('while sweeping layer 7')\n"
                            "    raise\n")
    lines = result.error_in_exec._render_traceback_()
    assert "indices 0–3" in lines[0] and lines[1] == "while sweeping layer 7" and "caused by IndexError" in lines[2]
