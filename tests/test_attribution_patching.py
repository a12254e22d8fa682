"""nbgrad.attribution_patching: equal to the formula on runs written with plain hooks, zero for
identical inputs, exact where the metric is linear in the site, and its exact checks equal patching
written by hand."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2

CLEAN = torch.tensor([[3, 14, 15, 92, 65, 35, 8]])
CORRUPT = torch.tensor([[3, 14, 27, 92, 65, 35, 8]])


def logit_difference(logits):
    return logits[0, -1, 5] - logits[0, -1, 7]


def first_tensor(output):
    return output[0] if isinstance(output, tuple) else output


def run_with_hooks(model, ids, names, grads=False):
    """Plain PyTorch: the outputs of named modules, and with grads=True their gradients of the metric."""
    modules = dict(model.named_modules())
    acts = {}

    def keep(name):
        def hook(module, inputs, output):
            if name not in acts:
                tensor = first_tensor(output)
                if grads:
                    tensor.retain_grad()
                acts[name] = tensor
        return hook
    handles = [modules[n].register_forward_hook(keep(n)) for n in names]
    try:
        value = logit_difference(model(ids).logits)
        if grads:
            value.backward()
    finally:
        for handle in handles:
            handle.remove()
    return acts, value


def patched_metric(model, ids, name, position, clean_value):
    """Plain PyTorch: the metric with one module's output at one position replaced."""
    def hook(module, inputs, output):
        tensor = first_tensor(output).clone()
        tensor[:, position] = clean_value[:, position]
        return (tensor,) + tuple(output[1:]) if isinstance(output, tuple) else tensor
    handle = dict(model.named_modules())[name].register_forward_hook(hook)
    try:
        with torch.no_grad():
            return float(logit_difference(model(ids).logits))
    finally:
        handle.remove()


def test_scores_equal_the_formula_on_runs_with_plain_hooks():
    model = tiny_gpt2()
    before = model_state(model)
    result = nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, sites="transformer.h.*")
    assert_clean(model, before)
    clean, _ = run_with_hooks(model, CLEAN, result.sites)
    corrupt, _ = run_with_hooks(model, CORRUPT, result.sites, grads=True)
    model.zero_grad(set_to_none=True)
    assert "transformer.h.0" in result.sites and "transformer.h.3.mlp.c_fc" in result.sites
    for row, name in enumerate(result.sites):
        expected = ((clean[name] - corrupt[name]) * corrupt[name].grad).sum(-1)[0]
        assert torch.allclose(result.scores[row], expected.detach(), atol=1e-6), name
    assert result.labels[0] == result.sites and len(result.labels[1]) == CLEAN.shape[1]
    assert result.scores.abs().sum() > 0


def test_one_clean_forward_and_one_corrupt_forward_whatever_the_number_of_sites():
    model = tiny_gpt2()
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference)
        assert len(calls) == 2
        calls.clear()
        nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, check_top=3)
        assert len(calls) == 2 + 1 + 3     # and the corrupt reference, then one run per checked pair
    finally:
        handle.remove()


@pytest.mark.parametrize("train", [False, True])
def test_identical_inputs_give_exactly_zero_even_in_train_mode(train):
    model = tiny_gpt2()
    model.train(train)
    result = nbgrad.attribution_patching(model, CLEAN, CLEAN, logit_difference, check_top=2)
    assert torch.count_nonzero(result.scores) == 0
    assert torch.count_nonzero(result.exact.nan_to_num(0.0)) == 0
    assert all(m.training == train for m in model.modules())


def test_equal_to_exact_patching_where_the_metric_is_linear_in_the_site():
    model = tiny_gpt2()
    length = CLEAN.shape[1]
    result = nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, sites="transformer.ln_f",
                                         check_top=length)
    assert result.scores.shape == (1, length) and not torch.isnan(result.exact).any()
    assert torch.allclose(result.scores, result.exact, atol=1e-5)
    assert abs(float(result.scores[0, -1])) > 1e-3


def test_check_top_effects_equal_hand_written_hook_patching():
    model = tiny_gpt2()
    result = nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, sites="transformer.h.?",
                                         check_top=5)
    assert result.sites == [f"transformer.h.{i}" for i in range(4)]
    clean, _ = run_with_hooks(model, CLEAN, result.sites)
    with torch.no_grad():
        reference = float(logit_difference(model(CORRUPT).logits))
    checked = torch.nonzero(~torch.isnan(result.exact)).tolist()
    assert len(checked) == 5
    top = torch.argsort(result.scores.abs().reshape(-1), descending=True)[:5].tolist()
    assert sorted(r * CLEAN.shape[1] + c for r, c in checked) == sorted(top)
    for row, position in checked:
        name = result.sites[row]
        expected = patched_metric(model, CORRUPT, name, position, clean[name].detach()) - reference
        assert float(result.exact[row, position]) == pytest.approx(expected, abs=1e-6)
    rows = result.checked()
    assert len(rows) == 5 and [abs(e) for _, e, _ in rows] == sorted((abs(e) for _, e, _ in rows), reverse=True)
    row, position = divmod(top[0], CLEAN.shape[1])
    assert rows[0][0] == (result.sites[row], result.labels[1][position])
    assert rows[0][2] == float(result.exact[row, position])


def test_positions_false_and_chosen_positions():
    model = tiny_gpt2()
    full = nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, sites="transformer.h.?")
    whole = nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, sites="transformer.h.?",
                                        positions=False, check_top=1)
    some = nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, sites="transformer.h.?",
                                       positions=[2, -1])
    assert whole.scores.shape == (4,) and whole.labels == whole.sites
    assert torch.allclose(whole.scores, full.scores.sum(1), atol=1e-6)
    assert torch.equal(some.scores, full.scores[:, [2, 6]])
    assert some.labels[1][0] == f"{full.labels[1][2]}"
    assert int((~torch.isnan(whole.exact)).sum()) == 1


def test_frozen_weights_still_give_gradients_at_the_sites():
    model = tiny_gpt2()
    expected = nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, sites="transformer.h.?")
    for param in model.parameters():
        param.requires_grad_(False)
    before = model_state(model)
    frozen = nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, sites="transformer.h.?")
    assert_clean(model, before)
    assert torch.allclose(frozen.scores, expected.scores, atol=1e-6)


def test_labels_mark_the_positions_that_differ(default_model):
    result = nbgrad.attribution_patching(default_model, "Monday comes before", "Sunday comes before",
                                         lambda logits: logits[0, -1, 5], sites="transformer.h.?")
    assert result.labels[1][:2] == ["M→S", "on→un"] and result.labels[1][2:] == ["day", " comes", " before"]


def test_errors_say_what_to_do():
    model = tiny_gpt2()
    before = model_state(model)
    with pytest.raises(nbgrad.InputError, match="clean has 7 tokens and corrupt has 6: .* same length"):
        nbgrad.attribution_patching(model, CLEAN, CORRUPT[:, :6], logit_difference)
    with pytest.raises(nbgrad.ModulePathError, match="no module of the model matches sites='transformer.block.\\*'"):
        nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, sites="transformer.block.*")
    with pytest.raises(nbgrad.InputError, match="metric must be a callable logits -> scalar"):
        nbgrad.attribution_patching(model, CLEAN, CORRUPT, 5)
    with pytest.raises(nbgrad.InputError, match="the metric must return a scalar tensor"):
        nbgrad.attribution_patching(model, CLEAN, CORRUPT, lambda logits: logits[0, -1])
    with pytest.raises(nbgrad.InputError, match="position 9 is outside the prompt's 7 positions"):
        nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, positions=[9])
    for count in (-1, 2.5, True):
        with pytest.raises(nbgrad.InputError, match=f"check_top is how many of the highest scores to check by exact "
                                                    f"patching, a whole number of at least 0, not {count!r}"):
            nbgrad.attribution_patching(model, CLEAN, CORRUPT, logit_difference, check_top=count)
    assert_clean(model, before)
