"""`%generate MODEL INPUT [options]` and a `%%generate` cell with an empty body: a plain generation with its
panel, whose tokens equal `model.generate`."""
import pytest
import torch
from IPython.utils.capture import capture_output

import nbgrad
from nbgrad.notebook.generate import empty_body_as_line

PROMPT = "The Eiffel Tower is in the city of"


def _expected(model, prompt=PROMPT, **options):
    encoded = dict(nbgrad.tokenizer_for(model)(prompt, return_tensors="pt"))
    return model.generate(**encoded, do_sample=False, **options)


def _run(shell, cell):
    with capture_output() as captured:
        result = shell.run_cell(cell, store_history=False)
    return result, captured


@pytest.mark.parametrize("cell", ['%%generate model prompt --max-new-tokens 5 --out ids',
                                  '%%generate model prompt --max-new-tokens 5 --out ids\n\n   \n',
                                  '%generate model prompt --max-new-tokens 5 --out ids',
                                  '%generate model "The Eiffel Tower is in the city of" --out ids --max-new-tokens 5'])
def test_a_plain_generation_equals_generate_and_shows_its_panel(shell, default_model, cell):
    shell.user_ns.update(model=default_model, prompt=PROMPT)
    result, captured = _run(shell, cell)
    assert result.success and result.error_in_exec is None, captured.stdout
    expected = _expected(default_model, max_new_tokens=5)
    assert torch.equal(shell.user_ns.pop("ids"), expected)
    continuation = nbgrad.tokenizer_for(default_model).decode(expected[0, -5:])
    texts = [output.data.get("text/plain", "") for output in captured.outputs]
    assert any(f"continuation: {continuation!r}" in text for text in texts), texts
    assert any("application/vnd.nbgrad.panel+json" in output.data for output in captured.outputs)


def test_the_line_form_takes_the_cell_forms_options(shell, default_model):
    shell.user_ns.update(model=default_model, prompt=PROMPT)
    result, captured = _run(shell, '%generate model [prompt, "Hi"] --max-new-tokens 3 --kwargs {"use_cache": False} '
                                   '--out ids -q')
    assert result.success and not captured.outputs
    encoded = nbgrad.tokenizer_for(default_model)([PROMPT, "Hi"], return_tensors="pt", padding=True,
                                                 padding_side="left")
    expected = default_model.generate(**encoded, max_new_tokens=3, do_sample=False, use_cache=False)
    assert torch.equal(shell.user_ns.pop("ids"), expected)


def test_a_sampled_line_generation_follows_the_seed_as_generate(shell, default_model):
    shell.user_ns.update(model=default_model, prompt=PROMPT)
    torch.manual_seed(3)
    assert shell.run_cell("%generate model prompt --sample --max-new-tokens 6 --out ids -q").success
    torch.manual_seed(3)
    encoded = dict(nbgrad.tokenizer_for(default_model)(PROMPT, return_tensors="pt"))
    assert torch.equal(shell.user_ns.pop("ids"), default_model.generate(**encoded, do_sample=True, max_new_tokens=6))


@pytest.mark.parametrize("cell, message", [
    ("%generate", "usage: %generate MODEL INPUT [options]; see %%generate?"),
    ("%generate --max-new-tokens 3", "usage: %generate MODEL INPUT [options]"),
    ("%%generate", "usage: %generate MODEL INPUT [options]"),
    ("%generate model", "missing INPUT: write `%%generate MODEL INPUT`"),
    ("%generate nothing_here 'Hi'", "unknown model 'nothing_here': no such name in the notebook"),
    ("%generate model 'Hi' --max-new-tokens 0", "--max-new-tokens (max_new_tokens=) is how many tokens to generate"),
])
def test_line_errors_say_what_is_wrong(shell, default_model, cell, message):
    shell.user_ns.update(model=default_model)
    before = set(shell.user_ns)
    result, captured = _run(shell, cell)
    assert not result.success
    assert message in str(result.error_in_exec or result.error_before_exec)
    assert set(shell.user_ns) - before <= {"_", "__", "___"}      # the cell bound nothing


def test_only_an_empty_generate_cell_becomes_the_line_form():
    assert empty_body_as_line(['%%generate model "Hi" -q\n', "\n", "  \n"]) == ['%generate model "Hi" -q\n']
    assert empty_body_as_line(["%%generate model p\n"]) == ["%generate model p\n"]
    for lines in (['%%generate model "Hi"\n', "h = model.transformer.h[0].output.save()\n"],
                  ['%%trace model "Hi"\n'], ['%%generated x\n'], ["x = 1\n"], []):
        assert empty_body_as_line(list(lines)) == lines


def test_an_empty_trace_cell_is_still_ipythons_usage_error(shell, default_model):
    shell.user_ns.update(model=default_model)
    result, _ = _run(shell, '%%trace model "Hi"\n')
    assert "%%trace is a cell magic, but the cell body is empty" in str(result.error_before_exec
                                                                          or result.error_in_exec)


def test_unloading_the_extension_removes_the_transform(shell):
    from nbgrad.notebook.magics import load, unload
    assert shell.input_transformers_cleanup.count(empty_body_as_line) == 1
    unload(shell)
    try:
        assert empty_body_as_line not in shell.input_transformers_cleanup
    finally:
        load(shell)
    assert shell.input_transformers_cleanup.count(empty_body_as_line) == 1
