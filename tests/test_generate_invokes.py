"""`%%generate` with `with invoke(INPUT):` blocks (SPEC §3b): one generation of all invokes' rows, each
block's statements and edits on its own rows, checked against `model.generate` of each prompt alone."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state

LONG = "The Eiffel Tower is in the city of"
SHORT = "The Colosseum is in"
STEPS = 5


@pytest.fixture(scope="module")
def lm():
    model = nbgrad.load_model()
    model.generation_config.eos_token_id = None          # never stop early: every row makes STEPS tokens
    model.generation_config.pad_token_id = nbgrad.tokenizer_for(model).eos_token_id or 0
    return model


def _zero_last(module, args, output):
    output[:, -1] = 0.0


def alone(model, prompt, zero_block_0=False):
    """The continuation `model.generate` gives the prompt by itself; with a plain hook zeroing block 0's
    output at the last position when `zero_block_0`."""
    kwargs = dict(nbgrad.tokenizer_for(model)(prompt, return_tensors="pt"))
    handle = None
    if zero_block_0:
        handle = model.transformer.h[0].register_forward_hook(_zero_last)
    try:
        ids = model.generate(**kwargs, max_new_tokens=STEPS, do_sample=False)
    finally:
        if handle is not None:
            handle.remove()
    return ids[0, kwargs["input_ids"].shape[1]:]


def test_each_invoke_generates_what_its_prompt_generates_alone(lm):
    before = model_state(lm)
    result = nbgrad.generate(lm, None, f"""
with invoke({LONG!r}):
    a = model.lm_head.output[:, -1].argmax(-1).save()
with invoke({SHORT!r}):
    b = model.lm_head.output[:, -1].argmax(-1).save()
""", max_new_tokens=STEPS)
    assert result.invokes == [LONG, SHORT] and result.saved_invokes == {"a": 0, "b": 1}
    new = result.output[:, -STEPS:]
    assert torch.equal(new[0], alone(lm, LONG)) and torch.equal(new[1], alone(lm, SHORT))
    # each block saw its own row at every step: the token that step chose for it
    assert [int(t) for t in result.saved["a"]] == new[0].tolist()
    assert [int(t) for t in result.saved["b"]] == new[1].tolist()
    assert all(t.shape == (1,) for t in result.saved["a"] + result.saved["b"])
    assert_clean(lm, before)
    from nbgrad.views.generation import generation_panel
    text = generation_panel(result.input_ids, result.output, result.top_next, result.saved,
                            nbgrad.tokenizer_for(lm)).payload["items"][0]["value"]
    assert f"row 1 prompt:       {SHORT!r}" in text          # its left padding is not shown


def test_an_edit_in_one_invoke_leaves_the_other_as_it_was_alone(lm):
    result = nbgrad.generate(lm, None, f"""
with invoke({LONG!r}):
    pass
with invoke({SHORT!r}):
    model.transformer.h[0].output[:, -1] = 0.0
""", max_new_tokens=STEPS)
    new = result.output[:, -STEPS:]
    assert torch.equal(new[0], alone(lm, LONG))
    assert torch.equal(new[1], alone(lm, SHORT, zero_block_0=True))
    assert not torch.equal(new[1], alone(lm, SHORT))        # the edit made a difference


def test_the_magic_takes_invoke_blocks_without_input(shell, lm):
    shell.user_ns["lm"] = lm
    shell.run_cell("%load_ext nbgrad")
    outcome = shell.run_cell(f"%%generate lm --max-new-tokens {STEPS} -q --out ids\n"
                             f"with invoke({SHORT!r}):\n    s = lm.lm_head.output[:, -1].argmax(-1).save()")
    assert outcome.error_in_exec is None, outcome.error_in_exec
    assert torch.equal(shell.user_ns["ids"][0, -STEPS:], alone(lm, SHORT))
    assert len(shell.user_ns["s"]) == STEPS


@pytest.mark.parametrize("input, kwargs, message", [
    (LONG, {}, "line 2: INPUT on the %%generate line and `with invoke(...)` blocks together: give the "
                "inputs in the invoke blocks only (`%%generate MODEL` with no INPUT)"),
    (None, {"num_beams": 2}, "line 2: invoke blocks in %%generate take one sequence per prompt, so num_beams=2"),
])
def test_invoke_errors_in_generate(lm, input, kwargs, message):
    before = model_state(lm)
    with pytest.raises(nbgrad.InputError) as caught:
        nbgrad.generate(lm, input, f"\nwith invoke({SHORT!r}):\n    x = model.lm_head.output.save()",
                        max_new_tokens=2, kwargs=kwargs)
    assert message in str(caught.value)
    assert_clean(lm, before)


def test_no_input_and_no_invoke_blocks_says_both_ways(lm):
    with pytest.raises(nbgrad.InputError, match=r"missing INPUT: write `%%generate MODEL INPUT`, or put "
                                                r"`with invoke\(INPUT\):` blocks"):
        nbgrad.generate(lm, None, "x = model.lm_head.output.save()", max_new_tokens=2)


@pytest.mark.parametrize("body", [
    "tops = {}\nfor prompt, zero in zip(prompts, zeros):\n    with invoke(prompt):\n        if zero:\n"
    "            model.transformer.h[0].output[:, -1] = 0.0\n"
    "        tops[prompt] = model.lm_head.output[:, -1].argmax(-1).save()",
    "def one(prompt, zero):\n    with invoke(prompt):\n        if zero:\n"
    "            model.transformer.h[0].output[:, -1] = 0.0\n"
    "        return model.lm_head.output[:, -1].argmax(-1).save()\n"
    "tops = {prompt: one(prompt, zero) for prompt, zero in zip(prompts, zeros)}",
])
def test_a_loop_of_invokes_generates_what_each_prompt_generates_alone(lm, body):
    """A loop (or a comprehension through a function) of invokes in %%generate: one row per invoke, each the
    generation of its prompt by itself, with its own edit (a plain hook) where it has one."""
    before = model_state(lm)
    prompts, zeros = [LONG, SHORT, LONG], [False, True, True]
    namespace = {"model": lm, "prompts": prompts, "zeros": zeros}
    result = nbgrad.generate(lm, None, body, namespace, max_new_tokens=STEPS)
    assert result.invokes == prompts
    new = result.output[:, -STEPS:]
    for row, (prompt, zero) in enumerate(zip(prompts, zeros)):
        assert torch.equal(new[row], alone(lm, prompt, zero_block_0=zero)), row
    assert not torch.equal(new[0], new[2])          # the same prompt, with and without the edit
    # per step, what each invoke saved: its own row's token (the last invoke of a prompt holds its key)
    assert len(namespace["tops"]) == STEPS
    for step, tops in enumerate(namespace["tops"]):
        assert tops[LONG].tolist() == [int(new[2, step])] and tops[SHORT].tolist() == [int(new[1, step])]
    assert not [name for name in namespace if name.startswith("_nbgrad")]
    assert_clean(lm, before)
