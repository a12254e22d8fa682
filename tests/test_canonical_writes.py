"""Writes, in-place edits and gradients of canonical names on every family equal the same edit made by hand
with plain PyTorch hooks on the real path (or the family's own attention function, edited by the test)."""
import pytest
import torch

import nbgrad
from nbgrad.names import FAMILIES
from nbgrad.names.detect import ModelFacts
from canonical_models import BUILDERS, IDS, AttentionProbe, build, hooked_run

FAMILY_NAMES = sorted(BUILDERS)


def _logits(model, cell):
    namespace = {"model": model}
    nbgrad.trace(model, IDS, cell + "\nlogits = model.logits.save()", namespace, no_grad=True)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    return namespace["logits"]


def _block(model, i):
    return f"{FAMILIES[model.config.model_type]['layers']}.{i}"


def _quiet(hook):
    """A hook that does its work and returns None (the model's value stays the one it edited)."""
    return lambda *arguments: (hook(*arguments), None)[1]


def _tuple_aware(edit):
    def hook(module, args, output):
        tensor = output[0] if isinstance(output, tuple) else output
        edit(tensor)
        return output
    return hook


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_writes_to_the_stream_z_and_mlp_post_equal_hand_made_hooks(family):
    model = build(family)
    entry = FAMILIES[family]
    got = _logits(model, "model.layers[0].resid_post[:, 2] = 0\n"
                         "model.layers[1].attn.z = model.layers[1].attn.z * 0.5\n"
                         "model.layers[1].attn.z[:, :, 1] = 0\n"
                         "model.layers[0].mlp.post[:] *= 3")

    def z_edit(module, args, kwargs):
        z = args[0].unflatten(-1, (2, -1)) * 0.5
        z[:, :, 1] = 0
        return (z.flatten(-2), *args[1:]), kwargs
    with torch.no_grad():
        want = hooked_run(model, {_block(model, 0): _tuple_aware(lambda t: t[:, 2].zero_())},
                          {f"{_block(model, 1)}.{entry['attn_out']}": z_edit,
                           f"{_block(model, 0)}.{entry['mlp_out']}": _quiet(lambda m, a, k: a[0].mul_(3))}).logits
    torch.testing.assert_close(got, want)
    with torch.no_grad():
        assert not torch.allclose(got, model(IDS).logits)


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if FAMILIES[f].get("resid_mid")])
def test_an_edit_of_resid_mid_equals_a_pre_hook_on_the_real_module(family):
    model = build(family)
    if ModelFacts(model, FAMILIES[family]).parallel:
        pytest.skip("attention and MLP run in parallel in this configuration")
    got = _logits(model, "model.layers[1].resid_mid[:, 1] *= -1")
    path = f"{_block(model, 1)}.{FAMILIES[family]['resid_mid']}"
    with torch.no_grad():
        want = hooked_run(model, pre={path: _quiet(lambda m, a, k: a[0][:, 1].mul_(-1))}).logits
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if FAMILIES[f].get("attention")])
def test_edits_of_q_and_pattern_equal_the_edited_attention_function(family):
    model = build(family)
    got = _logits(model, "model.layers[1].attn.q[:, 0] *= 0\nmodel.layers[0].attn.pattern[:, 1] = 0")
    calls = []

    def edit(module, query, key, value):
        calls.append(module)
        if len(calls) == 2:
            query[:, 0] *= 0

    def zero_head(module, args, kwargs):            # a zero pattern for head 1 is a zero z for head 1
        z = args[0].unflatten(-1, (2, -1)).clone()
        z[:, :, 1] = 0
        return (z.flatten(-2), *args[1:]), kwargs
    probe = AttentionProbe(model, edit)
    handle = model.get_submodule(f"{_block(model, 0)}.{FAMILIES[family]['attn_out']}").register_forward_pre_hook(
        zero_head, with_kwargs=True)
    try:
        with torch.no_grad():
            want = probe.run().logits
    finally:
        handle.remove()
    torch.testing.assert_close(got, want)
    assert model.config._attn_implementation != "nbgrad_test_probe"


GRADS = """
with model.logits[0, -1].sum().backward():
    g_post = model.layers[0].resid_post.grad.save()
    g_z = model.layers[1].attn.z.grad.save()
    g_pre = model.layers[1].resid_pre.grad.save()
    model.layers[1].resid_post.grad[:, 0] = 0
    g_embed = model.embed.output.grad.save()
"""


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_gradients_and_their_edits_equal_register_hook(family):
    model = build(family)
    namespace = {"model": model}
    nbgrad.trace(model, IDS, GRADS, namespace)
    seen, entry = {}, FAMILIES[family]

    def keep(name, edit=None):
        def tensor_hook(grad):
            if edit is not None:
                grad = grad.clone()
                edit(grad)
            seen[name] = grad
            return grad
        return tensor_hook
    forward = {_block(model, 0): _tuple_aware(lambda o: o.register_hook(keep("g_post"))),
               _block(model, 1): _tuple_aware(lambda o: o.register_hook(keep("g_last", lambda g: g[:, 0].zero_()))),
               entry["embed"]: _quiet(lambda m, a, o: o.register_hook(keep("g_embed")))}
    pre = {f"{_block(model, 1)}.{entry['attn_out']}": _quiet(lambda m, a, k: a[0].register_hook(keep("g_z"))),
           _block(model, 1): _quiet(lambda m, a, k: (a[0] if a else k["hidden_states"]).register_hook(keep("g_pre")))}
    model.zero_grad()
    hooked_run(model, forward, pre).logits[0, -1].sum().backward()
    for name in ("g_post", "g_pre", "g_embed"):
        torch.testing.assert_close(namespace[name], seen[name], msg=name)
    torch.testing.assert_close(namespace["g_z"], seen["g_z"].unflatten(-1, (2, -1)))


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen3", "gpt_neox", "phi3"])
def test_gradients_of_q_and_pattern_equal_hooks_in_the_family_attention_function(family):
    model = build(family)
    namespace = {"model": model}
    nbgrad.trace(model, IDS, "with model.logits[0, -1].sum().backward():\n"
                             "    gq = model.layers[1].attn.q.grad.save()\n"
                             "    gp = model.layers[1].attn.pattern.grad.save()", namespace)
    seen, calls = {}, []

    class Hooking(AttentionProbe):
        def __call__(self, module, query, key, value, *args, **kwargs):
            calls.append(module)
            output, pattern = self.eager(module, query, key, value, *args, **kwargs)
            if len(calls) == 2:
                query.register_hook(lambda grad: seen.__setitem__("gq", grad))
                pattern.register_hook(lambda grad: seen.__setitem__("gp", grad))
            return output, pattern
    model.zero_grad()
    Hooking(model).run().logits[0, -1].sum().backward()
    torch.testing.assert_close(namespace["gq"], seen["gq"])
    torch.testing.assert_close(namespace["gp"], seen["gp"])
