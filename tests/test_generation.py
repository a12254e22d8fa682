"""`nbgrad.generate` / `%%generate`, each case against plain hooks around the same `model.generate`."""
import json
import re

import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2

PROMPT = "The Eiffel Tower is in the city of"
READ_BLOCK = "h = model.transformer.h[1].output.save()\nlogits = model.output.logits.save()"


@pytest.fixture
def tiny_lm():
    """A tiny GPT-2 that never stops early (no end-of-text token) and has a pad token (no warnings)."""
    model = tiny_gpt2()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def prompt_kwargs(model, prompt=PROMPT):
    return dict(nbgrad.tokenizer_for(model)(prompt, return_tensors="pt"))


def hand_hooked(model, kwargs, module, edit=None):
    """`model.generate` with plain hooks: a pre-hook on the model counts the steps; a hook on `module`
    applies `edit(step, output)` and keeps the output of every step; a hook on the model keeps the logits."""
    step, kept, logits = [-1], [], []

    def count(mod, args):
        step[0] += 1

    def keep(mod, args, output):
        if edit is not None:
            edit(step[0], output)
        kept.append(output.clone())

    handles = [model.register_forward_pre_hook(count), module.register_forward_hook(keep),
               model.register_forward_hook(lambda mod, args, output: logits.append(output.logits.clone()))]
    try:
        ids = model.generate(**kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return ids, kept, logits


def test_no_edits_gives_the_tokens_of_greedy_generate(default_model):
    before = model_state(default_model)
    result = nbgrad.generate(default_model, PROMPT, "top = model.lm_head.output[:, -1].argmax(-1).save()",
                             max_new_tokens=12)
    expected = default_model.generate(**prompt_kwargs(default_model), max_new_tokens=12, do_sample=False)
    assert torch.equal(result.output, expected)
    assert result.output.shape[1] == result.input_ids.shape[1] + 12
    # the argmax of each step's logits is the token that step chose
    assert [int(t) for t in result.saved["top"]] == expected[0, result.input_ids.shape[1]:].tolist()
    assert_clean(default_model, before)


def test_per_step_saves_have_one_value_per_step_and_equal_hand_hooks(tiny_lm, ids):
    namespace = {"model": tiny_lm}
    result = nbgrad.generate(tiny_lm, ids, READ_BLOCK, namespace, max_new_tokens=5)
    tokens, kept, logits = hand_hooked(tiny_lm, {"input_ids": ids, "max_new_tokens": 5, "do_sample": False},
                                       tiny_lm.transformer.h[1])
    assert torch.equal(result.output, tokens)
    assert len(namespace["h"]) == len(namespace["logits"]) == 5 == len(kept)
    assert namespace["h"][0].shape == (1, ids.shape[1], 32)            # step 0: the prompt
    assert all(value.shape == (1, 1, 32) for value in namespace["h"][1:])   # KV cache: one new position
    for ours, theirs in zip(namespace["h"], kept):
        assert torch.equal(ours, theirs)
    for ours, theirs in zip(namespace["logits"], logits):
        assert torch.equal(ours, theirs)
    assert result.saved["h"] == namespace["h"] and "step" not in namespace


def test_without_a_kv_cache_every_step_sees_the_whole_sequence(tiny_lm, ids):
    namespace = {"model": tiny_lm}
    result = nbgrad.generate(tiny_lm, ids, READ_BLOCK, namespace, max_new_tokens=4, kwargs={"use_cache": False})
    tokens, kept, _ = hand_hooked(tiny_lm, {"input_ids": ids, "max_new_tokens": 4, "do_sample": False,
                                            "use_cache": False}, tiny_lm.transformer.h[1])
    assert torch.equal(result.output, tokens)
    assert [value.shape[1] for value in namespace["h"]] == [ids.shape[1] + k for k in range(4)]
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(namespace["h"], kept))


STEER = """
if step >= 2:
    model.transformer.h[1].output[:, -1] += direction
logits = model.output.logits[:, -1].save()
"""


def test_an_edit_from_step_k_changes_nothing_before_k_and_equals_hand_hooks(tiny_lm, ids):
    torch.manual_seed(1)
    direction = torch.randn(32) * 4
    plain = nbgrad.generate(tiny_lm, ids, "logits = model.output.logits[:, -1].save()", max_new_tokens=6)
    steered = nbgrad.generate(tiny_lm, ids, STEER, {"model": tiny_lm, "direction": direction}, max_new_tokens=6)

    def edit(step, output):
        if step >= 2:
            output[:, -1] += direction
    tokens, _, logits = hand_hooked(tiny_lm, {"input_ids": ids, "max_new_tokens": 6, "do_sample": False},
                                    tiny_lm.transformer.h[1], edit)
    assert torch.equal(steered.output, tokens)
    assert all(torch.equal(ours, theirs[:, -1]) for ours, theirs in zip(steered.saved["logits"], logits))
    start = ids.shape[1]
    # steps 0 and 1 chose the first two new tokens: untouched; step 2 on sees the edit
    assert torch.equal(steered.output[:, :start + 2], plain.output[:, :start + 2])
    assert all(torch.equal(a, b) for a, b in zip(steered.saved["logits"][:2], plain.saved["logits"][:2]))
    assert not torch.allclose(steered.saved["logits"][2], plain.saved["logits"][2])


def test_sampling_follows_the_same_seed_as_generate(tiny_lm, ids):
    torch.manual_seed(7)
    result = nbgrad.generate(tiny_lm, ids, "", max_new_tokens=8, sample=True)
    torch.manual_seed(7)
    expected = tiny_lm.generate(input_ids=ids, max_new_tokens=8, do_sample=True)
    assert torch.equal(result.output, expected)


def test_the_magic_equals_the_function(shell, default_model):
    shell.user_ns.update(model=default_model, prompt=PROMPT)
    body = "top = model.lm_head.output[:, -1].argmax(-1).save()\nh = model.transformer.h[0].output.save()"
    shell.run_cell(f"%%generate model prompt --max-new-tokens 6 --out ids -q\n{body}", store_history=False)
    magic = {name: shell.user_ns.pop(name) for name in ("ids", "top", "h")}
    namespace = {"model": default_model}
    result = nbgrad.generate(default_model, PROMPT, body, namespace, max_new_tokens=6, out="ids")
    assert torch.equal(magic["ids"], result.output) and torch.equal(namespace["ids"], result.output)
    for name in ("top", "h"):
        assert len(magic[name]) == len(namespace[name]) == 6
        assert all(torch.equal(a, b) for a, b in zip(magic[name], namespace[name]))


def test_options_with_spaces_and_a_quoted_kwargs(shell, tiny_lm, ids):
    shell.user_ns.update(model=tiny_lm, ids=ids)
    for option in ('--kwargs {"use_cache": False}', "--kwargs '{\"use_cache\": False}'"):
        shell.run_cell(f"%%generate model ids --max-new-tokens 3 {option} -q\nh = model.transformer.h[0].output.save()",
                       store_history=False)
        assert [value.shape[1] for value in shell.user_ns.pop("h")] == [6, 7, 8]


def test_a_plain_call_of_the_model_in_the_body_is_not_a_step(tiny_lm, ids):
    namespace = {"model": tiny_lm, "ids": ids}
    body = "if step == 1:\n    again = model(ids).logits.save()\nlens = model.lm_head(model.transformer.h[1].output).save()"
    result = nbgrad.generate(tiny_lm, ids, body, namespace, max_new_tokens=4)
    assert len(namespace["lens"]) == 4 and namespace["again"][0] is None and namespace["again"][2] is None
    assert torch.equal(namespace["again"][1], tiny_lm(ids).logits)
    assert torch.equal(result.output, tiny_lm.generate(input_ids=ids, max_new_tokens=4, do_sample=False))


def test_the_model_is_clean_after_an_error_at_step_3_of_5(tiny_lm, ids):
    before = model_state(tiny_lm)
    namespace = {"model": tiny_lm, "step": "mine", "h": "before the cell"}
    body = "h = model.transformer.h[0].output.save()\nif step == 3:\n    raise ValueError('stop at three')"
    with pytest.raises(ValueError, match="stop at three") as caught:
        nbgrad.generate(tiny_lm, ids, body, namespace, max_new_tokens=5)
    assert "nbgrad: raised at generation step 3" in caught.value.__notes__
    assert_clean(tiny_lm, before)
    assert namespace["step"] == "mine" and "__nbgrad__" not in namespace
    assert namespace["h"] == "before the cell"      # a failed cell binds no name, not even the steps that finished
    again = nbgrad.generate(tiny_lm, ids, "", namespace, max_new_tokens=5)
    assert torch.equal(again.output, tiny_lm.generate(input_ids=ids, max_new_tokens=5, do_sample=False))


def test_a_keyboard_interrupt_in_the_body_at_step_3_leaves_the_model_clean(tiny_lm, ids):
    before = model_state(tiny_lm)
    namespace = {"model": tiny_lm}
    body = "h = model.transformer.h[2].output\nif step == 3:\n    raise KeyboardInterrupt"
    with pytest.raises(KeyboardInterrupt):
        nbgrad.generate(tiny_lm, ids, body, namespace, max_new_tokens=5)
    assert_clean(tiny_lm, before)
    assert not [name for name in namespace if name.startswith("__nbgrad") or name in ("step", "h")]
    assert nbgrad.generate(tiny_lm, ids, "x = model.transformer.h[2].output.save()", namespace,
                           max_new_tokens=2).saved["x"][1].shape == (1, 1, 32)


def test_an_error_inside_the_model_after_an_edit_at_step_3(tiny_lm, ids):
    before = model_state(tiny_lm)
    body = "if step == 3:\n    model.transformer.h[0].output = model.transformer.h[0].output[..., :5]"
    with pytest.raises(RuntimeError) as caught:
        nbgrad.generate(tiny_lm, ids, body, max_new_tokens=5)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "generation step 3" in notes and "shape (1, 1, 32) with a value of shape (1, 1, 5)" in notes
    assert_clean(tiny_lm, before)


def test_a_too_late_write_names_both_lines_and_the_step(tiny_lm, ids):
    before = model_state(tiny_lm)
    body = "if step == 2:\n    late = model.transformer.h[2].output\n    model.transformer.h[0].output[:] = late"
    with pytest.raises(nbgrad.OrderError) as caught:
        nbgrad.generate(tiny_lm, ids, body, max_new_tokens=4)
    message = str(caught.value)
    assert message.startswith("line 3: model.transformer.h[0].output is edited too late")
    assert "(line 2)" in message and message.endswith("(at generation step 2)")
    assert_clean(tiny_lm, before)


def test_usage_errors_say_what_is_wrong(tiny_lm, ids):
    with pytest.raises(nbgrad.InputError, match="--kwargs must be a dict of `generate` keywords, not an int"):
        nbgrad.generate(tiny_lm, ids, "", kwargs=5)
    for count in (0, -2, "5", 2.5):         # transformers' own error for 0 comes from deep inside generate
        with pytest.raises(nbgrad.InputError, match=re.escape("--max-new-tokens (max_new_tokens=) is how many "
                                                              f"tokens to generate, a whole number of at least 1, "
                                                              f"not {count!r}")):
            nbgrad.generate(tiny_lm, ids, "", max_new_tokens=count)
    with pytest.raises(nbgrad.NbgradError, match="needs a model with transformers' `generate`.*Sequential"):
        nbgrad.generate(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.zeros(1, 2), "")
    graph = nbgrad.generate(tiny_lm, None, "h = model.transformer.h[1].output.save()", graph=True).graph
    assert "model.transformer.h[1].output" in graph.to_text()


def test_the_panel_shows_text_top_tokens_by_step_and_every_step(default_model):
    from nbgrad.views.generation import generation_panel
    tokenizer = nbgrad.tokenizer_for(default_model)
    result = nbgrad.generate(default_model, PROMPT, "h = model.transformer.h[0].output.save()", max_new_tokens=4)
    _, _, logits = hand_hooked(default_model, dict(prompt_kwargs(default_model), max_new_tokens=4, do_sample=False),
                               default_model.transformer.h[0])
    panel = generation_panel(result.input_ids, result.output, result.top_next, result.saved, tokenizer, "gen")
    head, steps = panel.items
    continuation = tokenizer.decode(result.output[0, result.input_ids.shape[1]:])
    assert head["value"].splitlines() == [f"prompt:       {PROMPT!r}", f"continuation: {continuation!r}"]
    assert len(head["topk"]["positions"]) == 4
    for step, step_logits in enumerate(logits):
        probs, top = step_logits[0, -1].softmax(-1).topk(5)
        assert head["topk"]["tokens"][step] == [tokenizer.decode([int(i)]) for i in top]
        assert head["topk"]["probs"][step] == pytest.approx(probs.tolist(), abs=1e-4)
    assert steps["kind"] == "steps" and len(steps["steps"]) == 4
    assert [item[0]["summary"]["shape"] for item in steps["steps"]] == [list(v.shape) for v in result.saved["h"]]
    bundle = panel._repr_mimebundle_()
    assert len(json.dumps(bundle["application/vnd.nbgrad.panel+json"])) < 1_000_000
    assert continuation.strip() and json.dumps(continuation)[1:-1] in bundle["text/html"].replace("&quot;", '"')
    assert "h · step 3 of 4" in bundle["text/plain"] and "step 0 →" in bundle["text/plain"]


def test_a_batch_of_prompts_is_padded_on_the_left(default_model):
    prompts = ["Hello there, how are", "Hi"]
    namespace = {"model": default_model}
    tokenizer = nbgrad.tokenizer_for(default_model)
    side = tokenizer.padding_side
    result = nbgrad.generate(default_model, prompts, "h = model.transformer.h[0].output.save()", namespace,
                             max_new_tokens=4)
    assert tokenizer.padding_side == side           # given back
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    assert torch.equal(result.output, default_model.generate(**encoded, max_new_tokens=4, do_sample=False))
    assert [tuple(h.shape[:2]) for h in namespace["h"]] == [(2, encoded["input_ids"].shape[1])] + [(2, 1)] * 3


def test_an_interrupt_between_two_steps_leaves_the_model_clean(tiny_lm, ids):
    """Ctrl-C while transformers picks a token (a step finished, the next one open but not started)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class InterruptAtThirdToken(LogitsProcessor):
        calls = 0

        def __call__(self, input_ids, scores):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            return scores
    before = model_state(tiny_lm)
    namespace = {"model": tiny_lm}
    with pytest.raises(KeyboardInterrupt):
        nbgrad.generate(tiny_lm, ids, "h = model.transformer.h[0].output.save()", namespace, max_new_tokens=5,
                        kwargs={"logits_processor": LogitsProcessorList([InterruptAtThirdToken()])})
    assert_clean(tiny_lm, before)
    assert "h" not in namespace and "step" not in namespace and "__nbgrad__" not in namespace


def test_an_interrupt_inside_the_model_at_step_3_leaves_the_model_clean(tiny_lm, ids):
    calls = []

    def interrupt_at_step_3(module, args, output):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
    handle = tiny_lm.transformer.h[2].register_forward_hook(interrupt_at_step_3)
    try:
        before = model_state(tiny_lm)
        with pytest.raises(KeyboardInterrupt):
            nbgrad.generate(tiny_lm, ids, "model.transformer.h[1].output[:] *= 2\nx = model.transformer.h[3].output.save()",
                            max_new_tokens=5)
        assert_clean(tiny_lm, before)
    finally:
        handle.remove()


def test_the_model_input_of_every_step(tiny_lm, ids):
    namespace = {"model": tiny_lm}
    result = nbgrad.generate(tiny_lm, ids, "first = model.input.save()", namespace, max_new_tokens=4)
    assert torch.equal(namespace["first"][0], ids)
    assert [int(value) for value in namespace["first"][1:]] == result.output[0, ids.shape[1]:-1].tolist()


def test_a_backward_pass_in_the_body_says_generation_has_no_gradients(tiny_lm, ids):
    with pytest.raises(nbgrad.GradError, match=r"at generation step 0\). %%generate runs under torch.no_grad\(\).*"
                                               r"%%trace the generated ids"):
        nbgrad.generate(tiny_lm, ids, "model.output.logits.sum().backward()", max_new_tokens=3)


@pytest.mark.parametrize("body", ["model.output.logits.sum().backward()",
                                  "h = model.transformer.h[0].output\nwith model.output.logits.sum().backward():\n"
                                  "    g = h.grad.save()"])
def test_a_gradient_in_the_body_is_not_told_to_drop_an_option_generate_lacks(tiny_lm, ids, body):
    with pytest.raises(nbgrad.GradError) as caught:
        nbgrad.generate(tiny_lm, ids, body, max_new_tokens=2)
    message = str(caught.value)
    assert "--no-grad" not in message and "ran under torch.no_grad()" in message, message
