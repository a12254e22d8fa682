"""`%names` of a part of a model (`model.transformer`, `model.transformer.h[0].attn`, a name bound to a block)
lists the model's canonical names that lie in that part, with the part's layer index, never a name beside itself;
a part that holds none says so."""
import pytest

from canonical_models import build
from helpers import tiny_gpt2


@pytest.fixture
def names(shell, capsys):
    def run(line):
        shell.run_line_magic("names", line)
        return capsys.readouterr().out.splitlines()
    shell.user_ns["model"] = tiny_gpt2(n_layer=2)
    yield run
    for name in ("model", "blk", "llama"):
        shell.user_ns.pop(name, None)


def rows(lines):
    return [line.split() for line in lines[1:]]


def test_a_block_lists_its_layers_names(names):
    lines = names("model.transformer.h[1].attn")
    assert lines[0] == "model.transformer.h[1].attn: GPT2Attention in model (GPT2LMHeadModel, family 'gpt2')"
    assert [row[0] for row in rows(lines)] == ["model.layers[1].attn"] + [
        f"model.layers[1].attn.{name}" for name in ("q", "k", "v", "pattern", "z", "head_out")]
    assert rows(lines)[0] == ["model.layers[1].attn", "model.transformer.h[1].attn"]
    assert rows(lines)[5][1] == "model.transformer.h[1].attn.c_proj.input.unflatten(-1,"


def test_the_base_model_lists_every_layer_name_but_the_head(names):
    listed = dict(row[:2] for row in rows(names("model.transformer")))
    assert listed["model.embed"] == "model.transformer.wte" and listed["model.layers"] == "model.transformer.h"
    assert listed["model.layers[i].resid_mid"] == "model.transformer.h[i].ln_2.input"
    assert "model.unembed" not in listed and "model.logits" not in listed and "model.n_layers" not in listed
    assert all(canonical != real for canonical, real in listed.items())


def test_a_name_bound_to_a_block_and_a_leaf_module(shell, names):
    shell.user_ns["blk"] = shell.user_ns["model"].transformer.h[0]
    listed = dict(row[:2] for row in rows(names("blk")))
    assert listed["model.layers[0].resid_post"] == "model.transformer.h[0].output"
    assert len(listed) == 14
    assert names("model.lm_head")[1:] == ["  model.unembed                    model.lm_head"]


def test_a_part_that_holds_no_canonical_name(names):
    assert names("model.transformer.h[0].mlp.act") == [
        "model.transformer.h[0].mlp.act: NewGELUActivation in model (GPT2LMHeadModel, family 'gpt2'): no canonical "
        "name of model lies in it (%names model lists them all)"]


def test_a_llama_base_model_and_block(shell, names):
    shell.user_ns["llama"] = build("llama")
    listed = dict(row[:2] for row in rows(names("llama.model")))
    assert listed["llama.embed"] == "llama.model.embed_tokens" and listed["llama.ln_final"] == "llama.model.norm"
    block = dict(row[:2] for row in rows(names("llama.model.layers[1]")))
    assert block["llama.layers[1].resid_mid"] == "llama.model.layers[1].post_attention_layernorm.input"
    assert block["llama.layers[1].mlp.post"] == "llama.model.layers[1].mlp.down_proj.input"
