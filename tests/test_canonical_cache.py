"""cache(names="canonical") and run_with_cache(..., names="canonical"): keys, values equal to plain hooks, and
the residual stream's views (accumulated_resid, decompose_resid, head_outputs)."""
import pytest
import torch

import nbgrad
from nbgrad.errors import NbgradError
from nbgrad.names import FAMILIES
from canonical_models import BUILDERS, IDS, build, hooked_run

DECOMPOSING = sorted(f for f in BUILDERS if FAMILIES[f].get("attn_add") and FAMILIES[f].get("mlp_add"))


@pytest.mark.parametrize("family", DECOMPOSING)
def test_decompose_resid_sums_to_the_last_resid_post(family):
    model = build(family)
    _, cache = nbgrad.run_with_cache(model, IDS, names="canonical")
    last = f"layers.{model.config.num_hidden_layers - 1}.resid_post"
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels[:3] == ["embed", "layers.0.attn_out", "layers.0.mlp_out"]
    torch.testing.assert_close(parts.sum(0), cache[last], atol=1e-5, rtol=1e-5)
    seen = []
    with torch.no_grad():
        hooked_run(model, {f"{FAMILIES[family]['layers']}.{model.config.num_hidden_layers - 1}":
                           lambda m, a, o: seen.append(o[0] if isinstance(o, tuple) else o) and None})
    torch.testing.assert_close(cache[last].detach(), seen[0])


def test_a_canonical_cache_in_a_cell_is_keyed_by_canonical_names_and_stacks_the_stream():
    model = build("llama")
    namespace = {"model": model}
    nbgrad.trace(model, IDS, 'c = cache("layers.*", names="canonical")', namespace, no_grad=True)
    cache = namespace["c"]
    assert "layers.1.resid_mid" in cache and "layers.0.attn.pattern" in cache and "embed" not in cache
    assert cache["layers.0.attn.pattern"].shape == (1, 2, 6, 6)
    stream = cache.accumulated_resid()
    assert stream.shape == (3, 1, 6, 16)
    torch.testing.assert_close(stream[1], cache["layers.1.resid_pre"])
    torch.testing.assert_close(cache.accumulated_resid(apply_ln=True)[2],
                               model.model.norm(cache["layers.1.resid_post"]))
    heads = cache.head_outputs()
    assert heads.shape == (2, 1, 6, 2, 16)
    torch.testing.assert_close(heads[1].sum(2), cache["layers.1.attn_out"])      # Llama's o_proj has no bias
    assert model.config._attn_implementation == "sdpa"


def test_a_pattern_of_keys_keeps_only_those_and_a_missing_part_says_so():
    model = build("gpt2")
    _, cache = nbgrad.run_with_cache(model, IDS, "layers.*.resid_post", names="canonical")
    assert list(cache) == ["layers.0.resid_post", "layers.1.resid_post"]
    with pytest.raises(NbgradError, match="holds no 'layers.0.resid_pre': the family has none"):
        cache.accumulated_resid()
    with pytest.raises(NbgradError, match='names= is "canonical" or None'):
        nbgrad.run_with_cache(model, IDS, names="tl")


GRADS_CELL = 'c = cache("layers.1.*", names="canonical", grads=True)\nmodel.logits[0, -1].sum().backward()'


def _hooked_grads(model, family):
    """Gradients into layer 1's resid_pre, resid_post, attn.z and mlp.post, by register_hook on the real tensors."""
    entry, seen = FAMILIES[family], {}
    block = f"{entry['layers']}.1"

    def keep(name):
        return lambda grad: seen.__setitem__(name, grad)
    forward = {block: lambda m, a, o: (o[0] if isinstance(o, tuple) else o).register_hook(keep("resid_post")) and None}
    pre = {block: lambda m, a, k: (a[0] if a else k["hidden_states"]).register_hook(keep("resid_pre")) and None,
           f"{block}.{entry['attn_out']}": lambda m, a, k: a[0].register_hook(keep("z")) and None,
           f"{block}.{entry['mlp_out']}": lambda m, a, k: a[0].register_hook(keep("mlp_post")) and None}
    model.zero_grad()
    hooked_run(model, forward, pre).logits[0, -1].sum().backward()
    return seen


@pytest.mark.parametrize("family", ["gpt2", "llama", "bloom"])
def test_a_canonical_cache_with_grads_holds_each_value_s_gradient(family):
    model = build(family)
    namespace = {"model": model}
    nbgrad.trace(model, IDS, GRADS_CELL, namespace)
    cache, want = namespace["c"], _hooked_grads(model, family)
    assert _ours(namespace) == ["c", "model"]
    assert set(cache.grads) == set(cache) - {"layers.1.attn.head_out"}
    for key, name in (("resid_pre", "resid_pre"), ("resid_post", "resid_post"), ("mlp.post", "mlp_post")):
        torch.testing.assert_close(cache.grads[f"layers.1.{key}"], want[name], msg=key)
    torch.testing.assert_close(cache.grads["layers.1.attn.z"], want["z"].unflatten(-1, (2, -1)))
    assert cache.grads["layers.1.attn.pattern"].shape == cache["layers.1.attn.pattern"].shape == (1, 2, 6, 6)
    assert cache["layers.1.resid_post"].requires_grad      # the live values, as .save() keeps them


def _ours(namespace):
    return sorted(name for name in namespace if not name.startswith("__"))


def test_run_with_cache_takes_grads_device_and_dtype_with_canonical_names():
    model = build("llama")
    _, plain = nbgrad.run_with_cache(model, IDS, "layers.1.*", names="canonical")
    _, cast = nbgrad.run_with_cache(model, IDS, "layers.1.*", names="canonical", device="cpu", dtype=torch.float64)
    assert all(value.dtype == torch.float64 and not value.requires_grad for value in cast.values())
    torch.testing.assert_close(cast["layers.1.resid_post"], plain["layers.1.resid_post"].detach().double())
    _, both = nbgrad.run_with_cache(model, IDS, "layers.1.*", names="canonical", grads=True, dtype=torch.float64,
                                    loss=lambda out: out.logits[0, -1].sum())
    want = _hooked_grads(model, "llama")         # with SDPA: float32's tolerance for the eager run's gradient
    assert both.grads["layers.1.resid_pre"].dtype == torch.float64
    torch.testing.assert_close(both.grads["layers.1.resid_pre"].float(), want["resid_pre"])
    assert both["layers.1.attn.pattern"].dtype == torch.float64 and not both["layers.1.resid_post"].requires_grad
    with pytest.raises(NbgradError, match=r"needs loss="):
        nbgrad.run_with_cache(model, IDS, names="canonical", grads=True)


def test_grads_without_a_backward_pass_say_so():
    model = build("gpt2")
    with pytest.raises(NbgradError, match=r'line 1: cache\(names="canonical", grads=True\): the cell runs no '
                                          r"backward pass; add `loss.backward\(\)`"):
        nbgrad.trace(model, IDS, 'c = cache(names="canonical", grads=True)', {"model": model})
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_over_a_dataset_each_example_has_its_canonical_cache_and_its_gradients():
    model = build("gpt_neox")
    examples = [IDS, torch.tensor([[1, 2, 3, 4, 5, 6]])]
    namespace = {"model": model}
    nbgrad.trace(model, None, 'c = cache("layers.*", names="canonical", grads=True)\n'
                              "model.logits[0, -1].sum().backward()", namespace, over=examples, batch_size=2,
                 progress=False)
    assert _ours(namespace) == ["c", "model"] and len(namespace["c"]) == 2
    for example, cache in zip(examples, namespace["c"], strict=True):
        assert type(cache).__name__ == "CanonicalCache"
        seen = []
        with torch.no_grad():
            hooked_run(model, {"gpt_neox.layers.1": lambda m, a, o: seen.append(o[0] if isinstance(o, tuple) else o)
                               and None}, ids=example)
        torch.testing.assert_close(cache.accumulated_resid()[-1].detach(), seen[0])
        torch.testing.assert_close(cache.decompose_resid().sum(0).detach(), seen[0], atol=1e-5, rtol=1e-5)
        assert cache.head_outputs().shape == (2, 1, 6, 2, 16)
        assert cache.grads["layers.1.resid_post"].shape == (1, 6, 16)


class Unknown(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

    def forward(self, x):
        return self.blocks[0](x)


def test_a_canonical_cache_on_an_unknown_family_is_refused_by_the_names():
    model = Unknown()
    with pytest.raises(NbgradError, match=r"line 1: canonical names: nbgrad does not know the family 'Unknown'"):
        nbgrad.trace(model, torch.ones(1, 4), 'c = cache(names="canonical")', {"model": model})
    with pytest.raises(NbgradError, match=r"^canonical names: nbgrad does not know the family 'Unknown' .*register"):
        nbgrad.run_with_cache(model, torch.ones(1, 4), names="canonical")


def test_the_over_magic_gives_a_canonical_cache_per_example_with_its_gradients(shell):
    model = build("qwen2")
    shell.user_ns.update(tiny_qwen=model, examples=[IDS, torch.tensor([[1, 2, 3, 4, 5, 6]])])
    try:
        result = shell.run_cell('%%trace tiny_qwen --over examples --batch-size 2\n'
                                'cq = cache("layers.1.resid_*", names="canonical", grads=True)\n'
                                "tiny_qwen.logits[0, -1].sum().backward()")
        assert result.success, result.error_in_exec
        caches = shell.user_ns["cq"]
        assert [type(cache).__name__ for cache in caches] == ["CanonicalCache"] * 2
        assert not [name for name in shell.user_ns if name.startswith("nbgrad_")]
        seen = []
        with torch.no_grad():
            hooked_run(model, {"model.layers.1": lambda m, a, o: seen.append(o[0] if isinstance(o, tuple) else o)
                               and None}, ids=shell.user_ns["examples"][1])
        torch.testing.assert_close(caches[1]["layers.1.resid_post"].detach(), seen[0])
        assert caches[1].grads["layers.1.resid_mid"].shape == (1, 6, 16)
    finally:
        for name in ("tiny_qwen", "examples", "cq"):
            shell.user_ns.pop(name, None)
