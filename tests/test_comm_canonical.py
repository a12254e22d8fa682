"""The sidebar's tree for a model of a known family: each module's canonical name beside its own path (what a click
inserts), and the canonical values read there; a model of no known family as before. A remote model
(`nbgrad.remote`'s handle) is listed with its mark and where it lives, its tree drawn from the skeleton."""
import json

import pytest
import torch
from torch import nn

import nbgrad
from canonical_models import BUILDERS, IDS, build
from helpers import tiny_gpt2
from nbgrad.names import canonical_source
from nbgrad.notebook import comm


def nodes(tree):
    yield tree
    for child in tree["children"]:
        yield from nodes(child)


def by_path(tree):
    return {node["path"]: node for node in nodes(tree)}


def tree_of(model, name="model"):
    reply = comm.answer({"request": "models"}, {name: model})
    json.dumps(reply)                                   # what the comm sends is JSON
    assert reply["reply"] == "models" and len(reply["models"]) == 1, reply
    return reply["models"][0]


def test_a_gpt2_tree_shows_canonical_names_and_values_beside_its_own_paths():
    tree = by_path(tree_of(nbgrad.load_model()))
    assert tree["model"]["family"] == "gpt2" and tree["model"]["values"] == ["logits"]
    assert tree["model.transformer.h[3].attn"]["canonical"] == "model.layers[3].attn"
    assert tree["model.transformer.h[3]"]["canonical"] == "model.layers[3]"
    assert tree["model.transformer.h"]["canonical"] == "model.layers"
    assert {tree[path]["canonical"] for path in ("model.transformer.wte", "model.transformer.wpe", "model.lm_head",
                                                 "model.transformer.ln_f", "model.transformer.h[0].ln_2")} == \
        {"model.embed", "model.pos_embed", "model.unembed", "model.ln_final", "model.layers[0].ln2"}
    assert tree["model.transformer.h[3]"]["values"] == ["resid_pre", "resid_mid", "resid_post"]
    assert tree["model.transformer.h[3].attn"]["values"] == ["q", "k", "v", "pattern", "z", "head_out"]
    assert tree["model.transformer.h[3].mlp"]["values"] == ["post"]
    # Modules the vocabulary has no name for keep their own path only.
    assert "canonical" not in tree["model.transformer.h[3].attn.c_attn"]
    assert "values" not in tree["model.transformer.h[3].attn.c_attn"]


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_every_name_the_tree_offers_is_the_module_it_stands_beside(family):
    """For every family: the canonical path a click inserts compiles to the clicked module's own path, and every
    value listed is one the family has (a cell may write it); what the family lacks is not offered."""
    model = build(family)
    tree = tree_of(model)
    namespace = {"model": model}
    assert tree["family"] == model.config.model_type
    named = [node for node in nodes(tree) if "canonical" in node]
    assert len([node for node in named if node["canonical"].startswith("model.layers[")]) >= 2 * 2
    for node in named:
        written = f"x = {node['canonical']}.output\n"
        assert canonical_source(written, model, namespace) == f"x = {node['path']}.output\n", node["path"]
    for node in nodes(tree):
        for value in node.get("values", []):
            text = f"x = {node.get('canonical', node['path'])}.{value}\n"
            assert canonical_source(text, model, namespace) != text, text
    blocks = [node for node in named if node["canonical"] in ("model.layers[0]", "model.layers[1]")]
    parallel = family in ("gptj", "falcon", "phi") or (family == "gpt_neox" and model.config.use_parallel_residual)
    assert all(("resid_mid" in block["values"]) != parallel for block in blocks), [b["values"] for b in blocks]


def test_what_a_family_lacks_is_not_offered():
    bloom = by_path(tree_of(build("bloom")))
    assert bloom["model.transformer.h[0].self_attention"]["values"] == ["q", "k", "v", "pattern", "z", "head_out"]
    assert "resid_mid" not in by_path(tree_of(build("gpt_neox")))["model.gpt_neox.layers[0]"]["values"]  # parallel
    assert "canonical" not in bloom.get("model.transformer.word_embeddings_layernorm", {})
    llama = tree_of(build("llama"))
    assert not any(node.get("canonical") == "model.pos_embed" for node in nodes(llama))
    opt = by_path(tree_of(build("opt")))               # no MLP module of its own: its `post` is on the block
    assert opt["model.model.decoder.layers[1]"]["values"] == ["resid_pre", "resid_mid", "resid_post", "mlp.post"]


def test_an_inserted_canonical_path_reads_what_plain_hooks_on_the_real_module_see():
    """What the sidebar inserts for block 2 (its attention's output, its resid_mid) run in a cell equals plain
    PyTorch hooks on the modules the rows stand for."""
    model = tiny_gpt2()
    tree = by_path(tree_of(model))
    block = tree["model.transformer.h[2]"]
    attn = f"{tree['model.transformer.h[2].attn']['canonical']}.output"
    mid = f"{block['canonical']}.{block['values'][1]}"
    assert (attn, mid) == ("model.layers[2].attn.output", "model.layers[2].resid_mid")
    namespace = {"model": model}
    nbgrad.trace(model, IDS, f"a = {attn}[0].save()\nm = {mid}.save()\n", namespace)
    seen = {}
    handles = [model.transformer.h[2].attn.register_forward_hook(lambda m, i, o: seen.update(a=o[0].detach())),
               model.transformer.h[2].ln_2.register_forward_pre_hook(lambda m, i: seen.update(m=i[0].detach()))]
    try:
        model(IDS)
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(namespace["a"], seen["a"]) and torch.equal(namespace["m"], seen["m"])


def test_canonical_paths_start_with_the_models_own_name():
    tree = by_path(tree_of(tiny_gpt2(), name="gpt"))
    assert tree["gpt.transformer.h[1].mlp"]["canonical"] == "gpt.layers[1].mlp"


def test_a_model_of_no_known_family_shows_its_own_paths_only():
    tree = tree_of(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)))
    assert not [node["path"] for node in nodes(tree) if {"canonical", "values", "family"} & set(node)]
    assert [node["path"] for node in nodes(tree)] == ["model", "model[0]", "model[1]", "model[2]"]


class OddNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(2, 2)])


def test_a_family_entry_that_cannot_be_read_leaves_the_tree_without_canonical_names():
    nbgrad.names.register(OddNet, {"layers": 5})            # not a path: reading the entry fails
    tree = tree_of(OddNet())
    assert [node["path"] for node in nodes(tree)] == ["model", "model.blocks", "model.blocks[0]"]
    assert "error" not in tree and not [node for node in nodes(tree) if {"canonical", "family"} & set(node)]
