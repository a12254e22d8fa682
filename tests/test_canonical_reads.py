"""Every canonical name, on a tiny model of every family in nbgrad.names.FAMILIES, reads what plain PyTorch
reads on the real path: forward hooks for modules and the residual stream, the family's own attention function
(registered by the test) for q, k, v and patterns."""
import pytest
import torch

import nbgrad
from nbgrad.names import FAMILIES
from canonical_models import IDS, AttentionProbe, build, first, hooked_run

FAMILY_NAMES = sorted(BUILDERS_ := __import__("canonical_models").BUILDERS)

CELL = """
pre = [model.layers[i].resid_pre.save() for i in range(model.n_layers)]
post = [block.resid_post.save() for block in model.layers]
mlp_post = model.layers[1].mlp.post.save()
z = model.layers[1].attn.z.save()
head_out = model.layers[1].attn.head_out.save()
logits = model.logits.save()
embed = model.embed.output.save()
final = model.ln_final.output.save()
"""
MID = "mid = model.layers[1].resid_mid.save()\n"
ATTENTION = "q = model.layers[1].attn.q.save()\nk = model.layers[1].attn.k.save()\n" \
            "v = model.layers[1].attn.v.save()\npattern = model.layers[1].attn.pattern.save()\n"


def test_the_table_holds_at_least_twelve_families_and_every_one_is_tested():
    assert len(FAMILIES) >= 12
    assert set(FAMILIES) == set(FAMILY_NAMES)


def _run(model, cell):
    namespace = {"model": model}
    nbgrad.trace(model, IDS, cell, namespace, no_grad=True)
    return namespace


def _paths(model):
    entry = FAMILIES[model.config.model_type]
    layers = entry["layers"]
    return entry, [f"{layers}.{i}" for i in range(len(model.get_submodule(layers)))]


def _oracle(model):
    entry, blocks = _paths(model)
    seen = {"pre": [], "post": []}
    pre = {block: (lambda m, a, k: seen["pre"].append((a[0] if a else k["hidden_states"]).detach()))
           for block in blocks}
    pre[f"{blocks[1]}.{entry['mlp_out']}"] = lambda m, a, k: seen.__setitem__("mlp_post", a[0].detach())
    pre[f"{blocks[1]}.{entry['attn_out']}"] = lambda m, a, k: seen.__setitem__("z_flat", a[0].detach())
    if entry.get("resid_mid") and "mid" in _cell(model):
        pre[f"{blocks[1]}.{entry['resid_mid']}"] = lambda m, a, k: seen.__setitem__("mid", a[0].detach())
    forward = {block: (lambda m, a, o: seen["post"].append(first(o).detach())) for block in blocks}
    forward[entry["embed"]] = lambda m, a, o: seen.__setitem__("embed", o.detach())
    forward[entry["ln_final"]] = lambda m, a, o: seen.__setitem__("final", o.detach())
    with torch.no_grad():
        seen["logits"] = hooked_run(model, forward, pre).logits
    return seen


def _cell(model) -> str:
    from nbgrad.names.detect import ModelFacts
    entry = FAMILIES[model.config.model_type]
    facts = ModelFacts(model, entry)
    return CELL + (MID if not facts.parallel and entry.get("resid_mid") else "") + \
        (ATTENTION if entry.get("attention") else "")


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_canonical_read_equals_plain_hooks(family):
    model = build(family)
    saved = _run(model, _cell(model))
    want = _oracle(model)
    for name in ("pre", "post"):
        assert len(saved[name]) == len(want[name])
        for got, expected in zip(saved[name], want[name]):
            torch.testing.assert_close(got, expected)
    for name in ("mlp_post", "logits", "embed", "final") + (("mid",) if "mid" in saved else ()):
        torch.testing.assert_close(saved[name], want[name], msg=name)
    heads, dim = saved["z"].shape[-2:]
    torch.testing.assert_close(saved["z"], want["z_flat"].view(*want["z_flat"].shape[:-1], heads, dim))
    entry, blocks = _paths(model)
    out = model.get_submodule(f"{blocks[1]}.{entry['attn_out']}")
    weight = out.weight if hasattr(out, "nf") else out.weight.T          # [heads * dim, d_model]
    expected = torch.einsum("bphd,hdm->bphm", saved["z"], weight.view(heads, dim, -1))
    torch.testing.assert_close(saved["head_out"], expected)
    if "bias" in dir(out) and out.bias is not None:      # the heads' outputs and the bias make the projection
        torch.testing.assert_close(saved["head_out"].sum(2) + out.bias, out(want["z_flat"]))


@pytest.mark.parametrize("family", [name for name in FAMILY_NAMES if FAMILIES[name].get("attention")])
def test_q_k_v_and_pattern_equal_the_family_attention_function(family):
    model = build(family)
    probe = AttentionProbe(model)
    with torch.no_grad():
        probe.run()
    saved = _run(model, ATTENTION)
    for name in ("q", "k", "v", "pattern"):
        torch.testing.assert_close(saved[name], probe.seen[1][name], msg=name)
    assert saved["k"].shape[1] == model.config.num_key_value_heads if hasattr(model.config, "num_key_value_heads") \
        else saved["k"].shape[1] == saved["q"].shape[1]
    assert model.config._attn_implementation != "eager" or family in ("gpt_neo", "bloom", "gemma2", "gemma3_text")
