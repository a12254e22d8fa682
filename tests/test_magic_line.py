"""The magic line: INPUT, LOSS and option values are Python (spaces, brackets, braces), unknown options
are named as such, and `%%trace?` prints the options. Values are checked against plain PyTorch."""
import re

import pytest
import torch
from IPython.core.error import UsageError

from helpers import assert_clean, model_state, tiny_gpt2


@pytest.fixture
def ns(shell):
    model = tiny_gpt2(n_layer=2)
    shell.user_ns.update(line_model=model, line_ids=torch.tensor([[4, 8, 15, 16, 23]]))
    return shell.user_ns


def block_output(model, ids, index=0):
    kept = {}
    handle = model.transformer.h[index].register_forward_hook(lambda m, a, o: kept.setdefault("out", o))
    try:
        model(ids)
    finally:
        handle.remove()
    return kept["out"]


def test_option_value_with_spaces_parses(shell, ns):
    ns["vx"] = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    shell.run_cell_magic("backward", "(vx * vx) --grad-output torch.tensor([1, 2, 3], dtype=torch.long) -q",
                         "g = vx.grad.clone().save()")
    expected_x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    (expected_x * expected_x).backward(torch.tensor([1, 2, 3], dtype=torch.long))
    assert torch.equal(ns["vx"].grad, expected_x.grad)
    assert torch.equal(ns["g"], expected_x.grad)


def test_option_value_given_with_equals_and_spaces(shell, ns):
    ns["wx"] = torch.tensor([2.0, 5.0], requires_grad=True)
    shell.run_line_magic("backward", "wx * 3 --grad-output=torch.tensor([1.0, 0.5]) -q")
    expected_x = torch.tensor([2.0, 5.0], requires_grad=True)
    (expected_x * 3).backward(torch.tensor([1.0, 0.5]))
    assert torch.equal(ns["wx"].grad, expected_x.grad)


def test_braces_in_input_are_python_not_ipython_expansion(shell, ns):
    # IPython would expand `{cut}` to `1` first, making `1.pop()`, a syntax error
    ns["cut"] = 1
    shell.run_cell_magic("trace", "line_model line_ids[:, {cut}.pop():] -q",
                         "cut_hs = line_model.transformer.h[0].output.save()")
    assert torch.equal(ns["cut_hs"], block_output(ns["line_model"], ns["line_ids"][:, 1:]))
    shell.run_cell_magic("trace", 'line_model {"input_ids": line_ids, "use_cache": False} --no-grad -q',
                         "dict_hs = line_model.transformer.h[0].output.save()")
    assert torch.equal(ns["dict_hs"], block_output(ns["line_model"], ns["line_ids"]))
    assert ns["dict_hs"].grad_fn is None


def test_strings_with_option_like_text_stay_in_input(shell, ns):
    tokenizer = {"calls": []}

    class Recorder:
        pad_token = "x"

        def __call__(self, text, **kwargs):
            tokenizer["calls"].append(text)
            return {"input_ids": torch.tensor([[1, 2]])}
    ns["recorder"] = Recorder()
    shell.run_cell_magic("trace", 'line_model "say --graph -q (now" --tokenizer recorder -q',
                         "said = line_model.transformer.h[0].output.save()")
    assert tokenizer["calls"] == ["say --graph -q (now"]
    assert torch.equal(ns["said"], block_output(ns["line_model"], torch.tensor([[1, 2]])))


@pytest.mark.parametrize("magic,line", [
    ("trace", "line_model line_ids --bogus"),
    ("trace", "line_model line_ids --bogus -q"),
    ("backward", "line_ids.sum() --bogus"),
])
def test_unknown_option_is_named(shell, ns, magic, line):
    model = ns["line_model"]
    before = model_state(model)
    with pytest.raises(UsageError) as caught:
        shell.run_cell_magic(magic, line, "y = line_model.transformer.h[0].output.save()")
    message = str(caught.value)
    assert message.startswith(f"unknown option --bogus for %%{magic}"), message
    assert "--quiet" in message and "INPUT" not in message and "NameError" not in message
    assert_clean(model, before)


def test_option_errors_say_what_is_wrong(shell, ns):
    with pytest.raises(UsageError, match=r"--tokenizer needs a value: expression for the tokenizer"):
        shell.run_cell_magic("trace", "line_model line_ids --tokenizer -q", "y = 1")
    with pytest.raises(UsageError, match=r"--no-grad takes no value, but `line_ids` follows it"):
        shell.run_cell_magic("trace", "line_model --no-grad line_ids", "y = 1")
    with pytest.raises(UsageError, match=r"--grad-output `torch.ones\(` is not a Python expression"):
        shell.run_line_magic("backward", "line_ids.sum() --grad-output torch.ones(")
    with pytest.raises(UsageError, match=r"cannot read `line_ids\)` as a Python expression"):
        shell.run_cell_magic("trace", "line_model line_ids) -q", "y = 1")


@pytest.mark.parametrize("magic, says", [("gradflow", "usage: %gradflow MODEL"), ("gradgraph", "usage: %gradgraph EXPR"),
                                         ("show", "usage: %show EXPR")])
def test_a_line_magic_with_nothing_after_it_says_how_to_use_it(shell, ns, magic, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        shell.run_line_magic(magic, "  ")


def test_negative_numbers_and_minus_stay_in_the_expression(shell, ns):
    shell.run_cell_magic("trace", "line_model line_ids[:, -3:] - 1 -q", "neg = line_model.transformer.h[1].output.save()")
    assert torch.equal(ns["neg"], block_output(ns["line_model"], ns["line_ids"][:, -3:] - 1, index=1))


def test_trace_help_prints_the_options(shell, capsys):
    shell.run_cell("%%trace?")
    printed = capsys.readouterr().out
    assert "%%trace MODEL [INPUT] [--no-grad] [-q] [--graph] [--tokenizer EXPR]" in printed    # the cell magic
    for line in ("--no-grad             run under torch.no_grad()", "-q, --quiet           no inline display",
                 "--graph               show the hook graph of the cell and do not run it",
                 "expression for the tokenizer of a text INPUT", "name of a torch.nn.Module in the notebook's"):
        assert line in printed, line


def test_backward_help_prints_the_options(shell, capsys):
    shell.run_cell("%%backward?")
    printed = capsys.readouterr().out
    for text in ("--grad-output GRAD_OUTPUT", "--retain-graph", "--create-graph", "-q, --quiet", "loss"):
        assert text in printed, text
