"""Panel labels and data that a notebook user meets: gradients named as gradients whatever was saved,
NaN logits as valid JSON, the magics' help written as the cell magics, `%nbgrad` without a subprocess."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import nbgrad
from nbgrad.views import panel_for_result, show
from nbgrad.views.static import static_html, text_summary


class Vocab:
    def __len__(self):
        return 7

    def decode(self, ids):
        return f"<t{ids[0]}>"


def test_nan_logits_give_null_probabilities_not_invalid_json():
    logits = torch.randn(1, 3, 7, generator=torch.Generator().manual_seed(0))
    logits[0, 1, 2] = float("nan")
    panel = show(logits, "logits", tokenizer=Vocab())
    topk = panel.items[0]["topk"]
    text = json.dumps(panel.payload, allow_nan=False)        # raises on NaN / Infinity
    assert json.loads(text)["items"][0]["topk"]["probs"][1] == [None] * 5
    expected = torch.softmax(logits[0, 0].double(), -1).topk(5)
    assert topk["probs"][0] == pytest.approx(expected.values.tolist(), abs=1e-4)
    assert topk["probs"][2][0] is not None
    html = static_html(panel.payload)
    assert "–" in html and f"{expected.values[0] * 100:.1f}%" in html


def _plain_grads(model, prompt, layers):
    """The oracle: gradients of logits.sum() at the outputs of the given blocks, with plain hooks."""
    kept, handles = {}, []
    for i in layers:
        def keep(module, args, output, i=i):
            output.register_hook(lambda grad, i=i: kept.__setitem__(i, grad))
        handles.append(model.transformer.h[i].register_forward_hook(keep))
    ids = nbgrad.tokenizer_for(model)(prompt, return_tensors="pt")["input_ids"]
    try:
        model(ids).logits.sum().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return kept


def test_gradients_are_labelled_gradients_and_pair_in_any_order(default_model):
    prompt = "The cat sat on the mat"
    result = nbgrad.trace(default_model, prompt, """
with model.output.logits.sum().backward():
    g = model.transformer.h[1].output.grad.save()
    early = model.transformer.h[0].output.grad.save()
    last = nbgrad.save(model.transformer.h[2].output.grad[:, -1])
h = model.transformer.h[1].output.save()
""")
    default_model.zero_grad(set_to_none=True)
    items = {item["name"]: item for item in panel_for_result(result, nbgrad.tokenizer_for(default_model)).items}
    plain = _plain_grads(default_model, prompt, [0, 1, 2])
    assert items["g"]["kind"] == "gradient" and items["g"]["partner"] == "h"
    assert items["h"]["kind"] == "activation"
    assert items["early"]["kind"] == "gradient" and items["early"]["partner"] == "model.transformer.h[0].output"
    assert items["last"]["kind"] == "gradient" and items["last"]["partner"] == "model.transformer.h[2].output"
    for name, grad in (("g", plain[1]), ("early", plain[0]), ("last", plain[2][:, -1])):
        assert items[name]["summary"]["norm"] == pytest.approx(float(grad.double().norm()), rel=1e-5)
    assert "early (gradient of model.transformer.h[0].output)" in text_summary({"items": list(items.values())})


def test_help_reads_as_the_cell_magic_a_user_types(shell):
    trace_help = shell.find_cell_magic("trace").__doc__
    backward_help = shell.find_cell_magic("backward").__doc__
    assert re.search(r"^\s*%%trace MODEL \[INPUT\] \[--no-grad\]", trace_help, re.M), trace_help[:200]
    assert re.search(r"^\s*%%backward LOSS \[--grad-output EXPR\]", backward_help, re.M), backward_help[:200]
    assert not re.search(r"^\s*%trace ", trace_help, re.M) and not re.search(r"^\s*%backward ", backward_help, re.M)


def _listed_state(env) -> str:
    """The oracle: what `jupyter labextension list` says of nbgrad."""
    out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], env=env,
                         capture_output=True, text=True, timeout=120)
    for line in re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr).splitlines():
        if line.split()[:1] == ["nbgrad"]:
            return "disabled" if "disabled" in line.split() else "enabled"
    return "not installed"


def test_extension_state_matches_jupyter_labextension_list(tmp_path, monkeypatch):
    from nbgrad.notebook import status
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "config"))
    env = dict(os.environ)
    state = status.extension_state()
    assert state.split()[0] == _listed_state(env) == "enabled", state
    assert "version 0.1.0" in state
    subprocess.run([sys.executable, "-m", "jupyter", "labextension", "disable", "--level=user", "nbgrad"],
                   env=env, check=True, capture_output=True, timeout=120)
    assert status.extension_state().split()[0] == _listed_state(env) == "disabled"
    subprocess.run([sys.executable, "-m", "jupyter", "labextension", "enable", "--level=user", "nbgrad"],
                   env=env, check=True, capture_output=True, timeout=120)
    assert status.extension_state().split()[0] == _listed_state(env) == "enabled"


def test_nbgrad_magic_starts_no_process(shell, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("%nbgrad started a process")
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    shell.run_cell("%nbgrad").raise_error()


def test_a_token_made_of_a_space_has_a_visible_label(default_model):
    tokenizer = nbgrad.tokenizer_for(default_model)
    result = nbgrad.trace(default_model, "a  b", "logits = model.output.logits.save()\n"
                                                "h = model.transformer.h[0].output.save()")
    decoded = [tokenizer.decode([int(i)]) for i in result.input_ids[0]]
    assert decoded == ["a", " ", " b"]       # the embedded tokenizer's pieces: a lone space in the middle
    items = {item["name"]: item for item in panel_for_result(result, tokenizer).items}
    assert items["logits"]["topk"]["positions"] == ["a", "␣", " b"]
    assert items["h"]["heatmap"]["row_labels"] == ["a", "␣", " b"]
    html = static_html(panel_for_result(result, tokenizer).payload)
    assert "<td>␣</td>" in html
