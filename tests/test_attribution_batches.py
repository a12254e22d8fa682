"""nbgrad.attribution_patching on a batch of clean / corrupt pairs with a metric over the batch: each pair's
scores equal one call on that pair alone, and `scores` is their mean; exact checks patch every pair."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2

PAIRS = 8
CLEAN = torch.randint(0, 90, (PAIRS, 6), generator=torch.Generator().manual_seed(4))
CORRUPT = CLEAN.clone()
CORRUPT[:, 2] = (CLEAN[:, 2] + 17) % 90          # one token differs in every pair
ANSWERS = torch.randint(0, 90, (PAIRS, 2), generator=torch.Generator().manual_seed(5))


def per_pair(logits):
    """The tutorials' logit difference, one value per pair of the batch."""
    rows = torch.arange(logits.shape[0])
    return logits[rows, -1, ANSWERS[:, 0]] - logits[rows, -1, ANSWERS[:, 1]]


def batch_mean(logits):
    return per_pair(logits).mean()


def alone(model, pair, **options):
    def metric(logits):
        return logits[0, -1, ANSWERS[pair, 0]] - logits[0, -1, ANSWERS[pair, 1]]
    return nbgrad.attribution_patching(model, CLEAN[pair:pair + 1], CORRUPT[pair:pair + 1], metric,
                                       sites="transformer.h.*", **options)


@pytest.mark.parametrize("metric", [per_pair, batch_mean], ids=["one value per pair", "mean over pairs"])
def test_each_pair_equals_one_call_on_that_pair_and_scores_are_their_mean(metric):
    model = tiny_gpt2()
    before = model_state(model)
    batched = nbgrad.attribution_patching(model, CLEAN, CORRUPT, metric, sites="transformer.h.*")
    singles = [alone(model, pair) for pair in range(PAIRS)]
    expected = torch.stack([single.scores for single in singles])
    assert batched.pairs.shape == (PAIRS, len(singles[0].sites), CLEAN.shape[1])
    assert expected[:, :, 2:].abs().max() > 1e-4          # the pairs' scores are not all zero
    torch.testing.assert_close(batched.pairs, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(batched.scores, expected.mean(0), atol=1e-5, rtol=1e-4)
    assert batched.sites == singles[0].sites and batched.labels[0] == singles[0].labels[0]
    assert "8 pairs: the scores are their mean" in repr(batched)
    assert_clean(model, before)


def test_whole_sites_per_pair():
    model = tiny_gpt2()
    batched = nbgrad.attribution_patching(model, CLEAN, CORRUPT, per_pair, sites="transformer.h.*", positions=False)
    expected = torch.stack([alone(model, pair, positions=False).scores for pair in range(PAIRS)])
    torch.testing.assert_close(batched.pairs, expected, atol=1e-5, rtol=1e-4)


def test_exact_checks_patch_every_pair_and_equal_the_mean_of_one_patch_per_pair():
    model = tiny_gpt2()
    batched = nbgrad.attribution_patching(model, CLEAN, CORRUPT, batch_mean, sites="transformer.h.*", check_top=2)
    checked = torch.nonzero(~torch.isnan(batched.exact)).tolist()
    assert len(checked) == 2
    modules = dict(model.named_modules())
    for site_index, column in checked:
        module = modules[batched.sites[site_index]]
        effects = []
        for pair in range(PAIRS):
            kept = {}
            handle = module.register_forward_hook(lambda m, i, o: kept.__setitem__("clean", o.detach().clone()))
            with torch.no_grad():
                model(CLEAN[pair:pair + 1])
            handle.remove()

            def patch(m, i, output):
                output = output.clone()
                output[:, column] = kept["clean"][:, column]
                return output
            with torch.no_grad():
                plain = model(CORRUPT[pair:pair + 1]).logits[0, -1]
                handle = module.register_forward_hook(patch)
                patched = model(CORRUPT[pair:pair + 1]).logits[0, -1]
                handle.remove()
            answer = ANSWERS[pair]
            effects.append(float((patched[answer[0]] - patched[answer[1]]) - (plain[answer[0]] - plain[answer[1]])))
        assert batched.exact[site_index, column] == pytest.approx(sum(effects) / PAIRS, abs=1e-5)


def test_batch_errors_say_what_to_do():
    model = tiny_gpt2()
    with pytest.raises(nbgrad.InputError, match="clean has 8 rows and corrupt has 7 rows: attribution patching compares "
                                                "them pair by pair; give one corrupt prompt per clean prompt"):
        nbgrad.attribution_patching(model, CLEAN, CORRUPT[:7], batch_mean)
    with pytest.raises(nbgrad.InputError, match="clean has 1 row and corrupt has 8 rows: "):
        nbgrad.attribution_patching(model, CLEAN[:1], CORRUPT, batch_mean)
    with pytest.raises(nbgrad.InputError, match=r"over 8 pairs the metric returns one value per pair \(a tensor "
                                                r"\[8\]\) or their mean \(a scalar\); it returned \(8, 2\)"):
        nbgrad.attribution_patching(model, CLEAN, CORRUPT, lambda logits: logits[:, -1, :2])
