"""The sidebar's comm answers only well-formed requests; model loading; the installed extension."""
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

import nbgrad
from nbgrad.notebook import comm
from helpers import tiny_gpt2


@pytest.mark.parametrize("message", [
    None, 42, "models", ["models"], {"request": "eval", "code": "import os"}, {"request": "__import__('os')"},
    {"request": ["models"]}, {"request": "models", "code": "1/0"}, {"request": "models", "id": {"a": 1}},
    {"request": "models", "id": "x" * 10_000}, {"request": "models" * 1000}, {},
])
def test_malformed_or_hostile_messages_get_an_error_reply(message):
    reply = comm.answer(message, {"model": tiny_gpt2()})
    assert set(reply) == {"error"} and isinstance(reply["error"], str) and len(reply["error"]) < 300


def test_no_code_runs_from_a_message(tmp_path):
    marker = tmp_path / "pwned"
    reply = comm.answer({"request": f"__import__('pathlib').Path({str(marker)!r}).touch()"}, {})
    assert "error" in reply and not marker.exists()


def test_models_request_gives_the_module_tree_with_traced_shapes():
    model = tiny_gpt2()
    ids = torch.tensor([[1, 2, 3]])
    result = nbgrad.trace(model, ids, "hs = model.transformer.h[1].output\n"
                                      "with model.output.logits.sum().backward():\n    g = hs.grad.save()")
    comm.after_cell(None, model, result)
    reply = comm.answer({"request": "models", "id": 7}, {"model": model, "_hidden": model, "x": 3})
    assert reply["reply"] == "models" and reply["id"] == 7 and len(reply["models"]) == 1
    tree = reply["models"][0]
    assert tree["path"] == "model" and tree["type"] == "GPT2LMHeadModel"
    assert tree["total"] == sum(p.numel() for p in model.parameters())
    transformer = next(c for c in tree["children"] if c["name"] == "transformer")
    blocks = next(c for c in transformer["children"] if c["name"] == "h")
    block1 = blocks["children"][1]
    assert block1["path"] == "model.transformer.h[1]"
    assert block1["output"] == [1, 3, 32] and block1["grad"] == [1, 3, 32]
    assert blocks["children"][0]["output"] is None


def test_ping():
    assert comm.answer({"request": "ping"}, {}) == {"reply": "pong", "id": None}


def test_from_pretrained_path_on_a_saved_directory(tmp_path):
    source = nbgrad.load_model()
    tokenizer = nbgrad.tokenizer_for(source)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tokenizer), n_positions=64)
    torch.manual_seed(5)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model = nbgrad.load_model(str(tmp_path), dtype=torch.float64)
    assert isinstance(model, GPT2LMHeadModel) and not model.training
    assert next(model.parameters()).dtype == torch.float64
    assert nbgrad.tokenizer_for(model) is not None
    result = nbgrad.trace(model, "Hello World", "h = model.transformer.h[1].output.save()")
    assert result.saved["h"].dtype == torch.float64


def test_embedded_model_is_the_same_every_time():
    first, second = nbgrad.load_model(), nbgrad.load_model()
    assert first is not second
    for a, b in zip(first.state_dict().values(), second.state_dict().values()):
        assert torch.equal(a, b)
    assert first.config.n_layer == 4 and 64 <= first.config.n_embd <= 128
    tokenizer = nbgrad.tokenizer_for(first)
    assert tokenizer.decode(tokenizer("Hello World")["input_ids"]) == "Hello World"


def test_text_input_uses_a_tokenizer_attribute():
    model = tiny_gpt2()
    model.tokenizer = AutoTokenizer.from_pretrained(str(nbgrad.models.DEFAULT_MODEL_DIR))
    model.resize_token_embeddings(len(model.tokenizer))
    result = nbgrad.trace(model, "Hello", "h = model.transformer.h[0].output.save()")
    assert result.saved["h"].shape[1] == len(model.tokenizer("Hello")["input_ids"])


def test_installed_extension_is_listed_enabled_and_ok():
    out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    line = next((l for l in text.splitlines() if l.split()[:1] == ["nbgrad"]), None)
    assert line is not None, text
    assert "enabled" in line and "OK" in line


def test_nbgrad_line_magic_reports_state(shell, capsys):
    shell.run_line_magic("nbgrad", "")
    out = capsys.readouterr().out
    assert f"nbgrad {nbgrad.__version__}" in out
    assert f"JupyterLab extension: enabled (version {nbgrad.__version__};" in out
    assert "hooks live: 0" in out
