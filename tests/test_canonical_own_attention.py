"""`attn.q/k/v` and `attn.pattern` on the families that compute attention in the attention module's own forward
(GPT-Neo, BLOOM, Falcon with rotary and with ALiBi): reads equal transformers' own record (the key/value cache,
`output_attentions`) and a hand-patched function; writes equal the same edit made by hand; `.grad` equals
`register_hook` / `torch.autograd.grad` on the same tensor."""
import contextlib

import pytest
import torch
import transformers as tf
from transformers.models.falcon import modeling_falcon

import nbgrad
from canonical_models import IDS, build

FAMILIES = ["gpt_neo", "bloom", "falcon", "falcon_alibi"]
READS = "q = model.layers[1].attn.q.save()\nk = model.layers[1].attn.k.save()\n" \
        "v = model.layers[1].attn.v.save()\npattern = model.layers[1].attn.pattern.save()\n"


def _model(family):
    if family != "falcon_alibi":
        return build(family)
    torch.manual_seed(0)
    model = tf.FalconForCausalLM(tf.FalconConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                                 vocab_size=64, alibi=True, multi_query=False)).eval()
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.3, generator=torch.Generator().manual_seed(parameter.numel()))
    return model


@contextlib.contextmanager
def eager(model):
    """The model with its eager attention (transformers' Falcon gives patterns only there)."""
    before = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        yield
    finally:
        model.config._attn_implementation = before


@contextlib.contextmanager
def hand_patched(model, family, edit=None):
    """Each layer's q as the canonical name means it, handed to `edit(layer, q)` (which may edit it in place) by
    the family's own function, patched by hand: GPT-Neo's `_attn`, BLOOM's `_reshape`, Falcon's rotary
    embedding (ALiBi Falcon: its `_split_heads`, whose q is `[batch, pos, heads, d_head]`: see `_heads_first`)."""
    edit, patched = edit or (lambda layer, q: None), []
    blocks = model.transformer.h
    if family == "falcon":
        calls, rotary = [], modeling_falcon.apply_rotary_pos_emb

        def rotated(*args, **kwargs):
            q, k = rotary(*args, **kwargs)
            calls.append(q)
            edit(len(calls) - 1, q)
            return q, k
        modeling_falcon.apply_rotary_pos_emb = rotated
    for layer, block in enumerate(blocks):
        attention = block.attn.attention if family == "gpt_neo" else block.self_attention
        name = {"gpt_neo": "_attn", "bloom": "_reshape"}.get(family, "_split_heads")
        original = getattr(attention, name)
        if family == "gpt_neo":
            def wrapper(q, *rest, layer=layer, original=original):
                edit(layer, q)
                return original(q, *rest)
        elif family == "bloom":
            def wrapper(fused, layer=layer, original=original):
                q, k, v = original(fused)
                edit(layer, q)
                return q, k, v
        elif family == "falcon_alibi":
            def wrapper(fused, layer=layer, original=original):
                q, k, v = original(fused)
                edit(layer, q)
                return q, k, v
        else:
            continue
        setattr(attention, name, wrapper)
        patched.append((attention, name))
    try:
        yield
    finally:
        if family == "falcon":
            modeling_falcon.apply_rotary_pos_emb = rotary
        for attention, name in patched:
            delattr(attention, name)


def _heads_first(family, q):
    """q as the canonical name lays it out (a view: an edit of it is an edit of q)."""
    return q.transpose(1, 2) if family == "falcon_alibi" else q


@pytest.mark.parametrize("family", FAMILIES)
def test_q_k_v_and_pattern_equal_the_cache_output_attentions_and_the_patched_function(family):
    model = _model(family)
    namespace = {"model": model}
    nbgrad.trace(model, IDS, READS, namespace, no_grad=True)
    seen = {}
    with torch.no_grad(), eager(model), hand_patched(
            model, family, lambda layer, q: seen.setdefault(layer, _heads_first(family, q).clone())):
        out = model(IDS, output_attentions=True, use_cache=True)
    layer = out.past_key_values.layers[1]
    torch.testing.assert_close(namespace["k"], layer.keys)
    torch.testing.assert_close(namespace["v"], layer.values)
    torch.testing.assert_close(namespace["pattern"], out.attentions[1])
    torch.testing.assert_close(namespace["q"], seen[1])
    assert namespace["pattern"].shape == (1, 2, 6, 6)
    assert namespace["k"].shape[1] == (1 if family == "falcon" else 2)        # Falcon's multi-query: one key head
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _zero_head_one(module, args, kwargs):       # a zero pattern for head 1 is a zero z for head 1
    z = args[0].unflatten(-1, (2, -1)).clone()
    z[:, :, 1] = 0
    return (z.flatten(-2), *args[1:]), kwargs


@pytest.mark.parametrize("family", FAMILIES)
def test_edits_of_q_and_pattern_equal_the_hand_patched_model(family):
    model = _model(family)
    namespace = {"model": model}
    nbgrad.trace(model, IDS, "model.layers[1].attn.q[:, 0] *= 0\nmodel.layers[0].attn.pattern[:, 1] = 0\n"
                             "logits = model.logits.save()", namespace, no_grad=True)
    out = model.transformer.h[0].self_attention.dense if family != "gpt_neo" else \
        model.transformer.h[0].attn.attention.out_proj
    handle = out.register_forward_pre_hook(_zero_head_one, with_kwargs=True)

    def edit(layer, q):
        if layer == 1:
            _heads_first(family, q)[:, 0] *= 0
    try:
        with torch.no_grad(), eager(model), hand_patched(model, family, edit):
            want = model(IDS).logits
    finally:
        handle.remove()
    torch.testing.assert_close(namespace["logits"], want)
    with torch.no_grad():
        assert not torch.allclose(want, model(IDS).logits)
    assert model.config._attn_implementation == ("sdpa" if family.startswith("falcon") else "eager")


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_of_q_and_pattern_equal_hooks_on_the_same_tensors(family):
    model = _model(family)
    namespace = {"model": model}
    nbgrad.trace(model, IDS, "with model.logits[0, -1].sum().backward():\n"
                             "    gq = model.layers[1].attn.q.grad.save()\n"
                             "    gp = model.layers[1].attn.pattern.grad.save()", namespace)
    seen = {}

    def keep(layer, q):
        if layer == 1:
            q.register_hook(lambda grad: seen.__setitem__("gq", grad))
    with eager(model), hand_patched(model, family, keep):
        out = model(IDS, output_attentions=True)
        gp, = torch.autograd.grad(out.logits[0, -1].sum(), out.attentions[1], retain_graph=True)
        out.logits[0, -1].sum().backward()
    torch.testing.assert_close(namespace["gp"], gp)
    torch.testing.assert_close(namespace["gq"], _heads_first(family, seen["gq"]))
