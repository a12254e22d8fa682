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
