"""nbgrad.attribute: integrated gradients, saliency and gradient × input, checked against Captum's own
reference values and models, against plain autograd on `inputs_embeds`, and for completeness."""
import re

import pytest
import torch
from captum.attr import IntegratedGradients, LayerIntegratedGradients
from captum.testing.helpers.basic_models import BasicModel, BasicModel2, BasicModel3
from torch import nn

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2

PROMPT = "Monday comes before"
TARGET = " Tuesday"


class OneSite(nn.Module):
    """Captum's two-input reference models, fed from one [1, 2] input that passes a named site."""

    def __init__(self, inner: nn.Module, inputs: int = 2):
        super().__init__()
        self.site, self.inner, self.inputs = nn.Identity(), inner, inputs

    def forward(self, x):
        x = self.site(x)
        return self.inner(*[x[:, i] for i in range(self.inputs)])


def scalar_output(output):
    return output.sum()


@pytest.mark.parametrize("inner", [BasicModel2, BasicModel3])
def test_captum_reference_values_of_its_relu_models(inner):
    """F = relu(relu(x1) − 1 − relu(x2)) (and the paper's second model) at x = (3, 1), baseline 0:
    Captum's tests expect attributions (1.5, −0.5)."""
    model = OneSite(inner())
    result = nbgrad.attribute(model, torch.tensor([[3.0, 1.0]]), scalar_output, site="site", steps=500)
    assert torch.allclose(result.scores, torch.tensor([1.5, -0.5]), atol=0.01)
    assert abs(result.delta) < 0.01 and result.change == pytest.approx(1.0, abs=1e-6)


def test_captum_reference_value_of_its_univariable_model():
    model = OneSite(BasicModel(), inputs=1)
    result = nbgrad.attribute(model, torch.tensor([[1.0]]), scalar_output, site="site")
    assert result.scores.tolist() == pytest.approx([1.0], abs=1e-4)


@pytest.mark.parametrize("steps,batch_size", [(64, 16), (50, 7), (5, 64)])
def test_integrated_gradients_equal_captums_on_the_same_model_and_steps(steps, batch_size):
    model = OneSite(BasicModel2())
    x = torch.tensor([[3.0, 1.0]])
    ours = nbgrad.attribute(model, x, scalar_output, site="site", steps=steps, batch_size=batch_size)
    theirs, delta = IntegratedGradients(lambda a: BasicModel2()(a[:, 0], a[:, 1])).attribute(
        x, baselines=torch.zeros_like(x), n_steps=steps, return_convergence_delta=True)
    assert torch.allclose(ours.scores, theirs[0], atol=1e-6)
    assert ours.delta == pytest.approx(float(delta), abs=1e-6)


def _ids_and_target(model):
    tokenizer = nbgrad.tokenizer_for(model)
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    return ids, tokenizer(TARGET, add_special_tokens=False)["input_ids"][0]


def test_completeness_on_the_embedded_model(default_model):
    model = default_model
    ids, target = _ids_and_target(model)
    result = nbgrad.attribute(model, PROMPT, TARGET)
    with torch.no_grad():
        at_input = model(ids).logits[0, -1, target]
        embeds = model.transformer.wte(ids)
        at_baseline = model(inputs_embeds=torch.zeros_like(embeds)).logits[0, -1, target]
    change = float(at_input - at_baseline)
    assert result.change == pytest.approx(change, rel=1e-5)
    assert abs(result.delta) < 1e-3 * abs(change)
    assert float(result.scores.double().sum()) == pytest.approx(change + result.delta, rel=1e-6)
    assert result.labels == [nbgrad.tokenizer_for(model).decode([i]) for i in ids[0]]


def test_ig_on_embeddings_equals_captum_on_inputs_embeds(default_model):
    model = default_model
    ids, target = _ids_and_target(model)
    embeds = model.transformer.wte(ids).detach()
    theirs, delta = IntegratedGradients(lambda e: model(inputs_embeds=e).logits[:, -1, target]).attribute(
        embeds, baselines=torch.zeros_like(embeds), n_steps=64, internal_batch_size=16,
        return_convergence_delta=True)
    ours = nbgrad.attribute(model, PROMPT, TARGET, steps=64, batch_size=16)
    assert torch.allclose(ours.scores, theirs[0].sum(-1), atol=1e-5)
    assert ours.delta == pytest.approx(float(delta), abs=1e-5)


def test_ig_at_a_block_from_a_baseline_prompt_equals_captums_layer_ig(default_model):
    model = default_model
    ids, target = _ids_and_target(model)
    tokenizer = nbgrad.tokenizer_for(model)
    baseline = "Sunday comes before"
    base_ids = tokenizer(baseline, return_tensors="pt")["input_ids"]
    assert base_ids.shape == ids.shape
    layer_ig = LayerIntegratedGradients(lambda i: model(i).logits[:, -1, target], model.transformer.h[2])
    theirs = layer_ig.attribute(ids, baselines=base_ids, n_steps=32, internal_batch_size=8)
    ours = nbgrad.attribute(model, PROMPT, target, site="transformer.h.2", baseline=baseline, steps=32,
                            batch_size=8)
    assert torch.allclose(ours.scores, theirs[0].sum(-1), atol=1e-5)


def test_batch_size_changes_nothing_but_how_many_points_run_at_once(default_model):
    model = default_model
    rows_seen = []
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: rows_seen.append(kwargs["input_ids"].shape[0]),
                                             with_kwargs=True)
    try:
        results = {}
        for batch_size in (1, 3, 16):
            rows_seen.clear()
            results[batch_size] = nbgrad.attribute(model, PROMPT, TARGET, steps=16, batch_size=batch_size)
            assert max(rows_seen) == batch_size
    finally:
        handle.remove()
    for batch_size, result in results.items():
        assert torch.allclose(result.scores, results[16].scores, rtol=1e-5, atol=1e-5), batch_size
        assert result.delta == pytest.approx(results[16].delta, abs=1e-4)


@pytest.mark.parametrize("method", ["saliency", "grad-x-input"])
def test_saliency_and_grad_x_input_equal_plain_autograd_on_inputs_embeds(default_model, method):
    model = default_model
    ids, target = _ids_and_target(model)
    embeds = model.transformer.wte(ids).detach().requires_grad_(True)
    grad, = torch.autograd.grad(model(inputs_embeds=embeds).logits[0, -1, target], embeds)
    expected = grad[0].abs().sum(-1) if method == "saliency" else (grad[0] * embeds[0]).sum(-1)
    before = model_state(model)
    result = nbgrad.attribute(model, PROMPT, TARGET, method=method)
    assert_clean(model, before)
    assert torch.allclose(result.scores, expected.detach(), atol=1e-5)
    assert result.delta is None and result.exact is None


def test_targets_token_text_id_and_metric_agree(default_model):
    model = default_model
    _, target = _ids_and_target(model)
    by_text = nbgrad.attribute(model, PROMPT, TARGET, method="grad-x-input")
    by_id = nbgrad.attribute(model, PROMPT, target, method="grad-x-input")
    by_metric = nbgrad.attribute(model, PROMPT, lambda logits: logits[0, -1, target], method="grad-x-input")
    assert torch.equal(by_text.scores, by_id.scores) and torch.equal(by_text.scores, by_metric.scores)
    assert by_id.notes == by_metric.notes == []


def test_a_text_target_of_several_tokens_is_scored_by_its_first_and_says_so(default_model):
    tokenizer = nbgrad.tokenizer_for(default_model)
    ids = tokenizer(" Paris", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1                     # the embedded tokenizer splits " Paris" (" Tuesday" is one token)
    result = nbgrad.attribute(default_model, "The Eiffel Tower is in the city of", " Paris", method="saliency")
    pieces = ", ".join(repr(tokenizer.decode([i])) for i in ids)
    note = (f"target ' Paris' is {len(ids)} tokens ({pieces}): the score is the logit of the first, "
            f"{tokenizer.decode([ids[0]])!r} (id {ids[0]}); for another token give its id, or a metric logits -> scalar")
    assert result.notes == [note] and note in repr(result)
    one = tokenizer.decode([ids[0]])
    first = nbgrad.attribute(default_model, "The Eiffel Tower is in the city of", one, method="saliency")
    assert first.notes == [] and torch.equal(first.scores, result.scores)


def test_site_paths_in_either_spelling_and_negative_blocks(default_model):
    model = default_model
    a = nbgrad.attribute(model, PROMPT, TARGET, method="saliency", site="transformer.h.3")
    b = nbgrad.attribute(model, PROMPT, TARGET, method="saliency", site="model.transformer.h[-1]")
    assert torch.equal(a.scores, b.scores) and b.sites == ["transformer.h.3"]
    with pytest.raises(nbgrad.ModulePathError, match="site 'transformer.h.9' is not in the model; nearest"):
        nbgrad.attribute(model, PROMPT, TARGET, site="transformer.h.9")


def test_ig_with_frozen_weights_and_a_model_in_train_mode_leaves_both_alone():
    model = tiny_gpt2()
    for param in model.parameters():
        param.requires_grad_(False)
    model.train()
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    before = model_state(model)
    first = nbgrad.attribute(model, ids, 7, steps=16)
    second = nbgrad.attribute(model, ids, 7, steps=16)
    assert_clean(model, before)
    assert model.training and all(m.training for m in model.modules())
    assert torch.equal(first.scores, second.scores)      # eval mode while attributing: no dropout
    assert abs(first.delta) < 1e-3 * abs(first.change)


def test_errors_say_what_to_do(default_model, tiny):
    model = default_model
    with pytest.raises(nbgrad.InputError, match="unknown method 'lime': use one of 'ig', 'saliency'"):
        nbgrad.attribute(model, PROMPT, TARGET, method="lime")
    with pytest.raises(nbgrad.InputError, match="baseline has 1 tokens and the input 5: a baseline prompt must"):
        nbgrad.attribute(model, PROMPT, TARGET, baseline="ab")
    with pytest.raises(nbgrad.InputError, match="input has 2 rows; attribution explains one prediction"):
        nbgrad.attribute(model, ["one", "two"], TARGET)
    with pytest.raises(nbgrad.InputError, match=r"metric must return a scalar tensor .* it returned \(1, 580\)"):
        nbgrad.attribute(model, PROMPT, lambda logits: logits[:, -1])
    with pytest.raises(nbgrad.NbgradError, match="has no get_input_embeddings\\(\\): give site="):
        nbgrad.attribute(OneSite(BasicModel2()), torch.tensor([[3.0, 1.0]]), scalar_output)
    with pytest.raises(nbgrad.InputError, match=re.escape("site is a list: give one module path "
                                                          "('transformer.h.3') or a module of the model")):
        nbgrad.attribute(model, PROMPT, TARGET, site=["transformer.h.0"])
    with pytest.raises(nbgrad.ModulePathError, match="site is a Linear that is not a module of the model"):
        nbgrad.attribute(model, PROMPT, TARGET, site=torch.nn.Linear(2, 2))
    by_module = nbgrad.attribute(model, PROMPT, TARGET, method="saliency", site=model.transformer.h[1])
    assert by_module.sites == ["transformer.h.1"]
    for token in (580, 99999, -1):
        with pytest.raises(nbgrad.InputError, match=f"token target {token} is outside the model's vocabulary: its "
                                                    f"logits have 580 entries, so token ids are 0–579"):
            nbgrad.attribute(model, PROMPT, token, method="saliency")
    before = model_state(tiny)
    with pytest.raises(nbgrad.InputError, match="metric must return a scalar"):
        nbgrad.attribute(tiny, torch.tensor([[1, 2, 3]]), lambda logits: logits, site="transformer.h.1")
    assert_clean(tiny, before)


def test_short_work_prints_nothing_and_long_work_shows_a_progress_bar(default_model, capfd, monkeypatch):
    # "short" is relative to the delay, not to the clock: a busy machine must not turn this into long work
    monkeypatch.setattr("nbgrad.attribution.progress.DELAY_S", 3600.0)
    nbgrad.attribute(default_model, PROMPT, TARGET, steps=8)
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
    monkeypatch.setattr("nbgrad.attribution.progress.DELAY_S", 0.0)
    nbgrad.attribute(default_model, PROMPT, TARGET, steps=8, batch_size=2)
    assert "integrated gradients" in capfd.readouterr().err


def test_magic_returns_the_attribution(shell):
    shell.run_cell("model = nbgrad.load_model()")
    result = shell.run_cell(f'a = %attribute model "{PROMPT}" --target "{TARGET}" --method grad-x-input')
    result.raise_error()
    ours = shell.user_ns["a"]
    expected = nbgrad.attribute(shell.user_ns["model"], PROMPT, TARGET, method="grad-x-input")
    assert isinstance(ours, nbgrad.Attribution) and torch.equal(ours.scores, expected.scores)
    shown = shell.run_cell(f'%attribute model "{PROMPT}" --target "{TARGET}" --steps 8 --site transformer.h[1]')
    assert isinstance(shown.result, nbgrad.Attribution) and shown.result.sites == ["transformer.h.1"]
    dotted = shell.run_cell(f'%attribute model "{PROMPT}" --target "{TARGET}" --steps 8 --site transformer.h.1')
    assert dotted.result.sites == ["transformer.h.1"]       # the spec's spelling: a path, not a Python expression


def test_magic_errors(shell, capsys):
    shell.run_cell("model = nbgrad.load_model()")
    capsys.readouterr()
    shell.run_cell(f'%attribute model "{PROMPT}"')
    assert "missing --target: a token (--target \" Paris\")" in capsys.readouterr().out
    shell.run_cell(f'%attribute model "{PROMPT}" --target Tuesday')
    assert "a token is a Python string" in capsys.readouterr().out
