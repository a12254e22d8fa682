"""Persistent edits (`nbgrad.edit`, `%%edit MODEL`): every later call of the model equals the same edit done
by hand with `register_forward_hook`: a plain call, `generate`, a later trace (whose reads see the edited
values and whose own edits apply on top); removing it gives back exactly the original outputs."""
import pytest
import torch

import nbgrad
from nbgrad.engine.edit.edits import active_edits, edit_hooks
from helpers import hook_count, tiny_gpt2

STEER = "model.transformer.h[1].output[:, -1] += torch.arange(32.) / 8"


def _steer(module, args, output):
    output[:, -1] += torch.arange(32.) / 8


# pushes the last position towards token 7: generation's tokens change
PUSH = "model.transformer.h[3].output[:, -1] += 20 * model.lm_head.weight[7]"


def _push(module, args, output):
    output[:, -1] += 20 * module_of_head[0].weight[7]


module_of_head = []


def _double(module, args, output):
    return output * 2


def _by_hand(model, *hooks):
    """Register (module, hook) pairs in order; returns their handles."""
    return [module.register_forward_hook(hook) for module, hook in hooks]


def _remove(handles):
    for handle in handles:
        handle.remove()


def test_a_plain_call_equals_the_hand_hooked_call_and_removal_gives_back_the_original(tiny, ids):
    before = tiny(ids).logits
    edit = nbgrad.edit(tiny, STEER)
    edited = tiny(ids).logits
    edit.remove()
    handles = _by_hand(tiny, (tiny.transformer.h[1], _steer))
    expected = tiny(ids).logits
    _remove(handles)
    assert torch.equal(edited, expected) and not torch.equal(edited, before)
    assert torch.equal(tiny(ids).logits, before) and hook_count(tiny) == 0


def test_a_replaced_output_and_an_edited_input_equal_hand_hooks(tiny, ids):
    source = ("model.transformer.h[0].output = model.transformer.h[0].output * 2\n"
              "model.transformer.h[2].input = model.transformer.h[2].input * 0.5\n")
    with nbgrad.edit(tiny, source):
        edited = tiny(ids).logits
    handles = _by_hand(tiny, (tiny.transformer.h[0], _double))
    handles.append(tiny.transformer.h[2].register_forward_pre_hook(
        lambda module, args, kwargs: ((args[0] * 0.5,) + args[1:], kwargs), with_kwargs=True))
    expected = tiny(ids).logits
    _remove(handles)
    assert torch.equal(edited, expected) and hook_count(tiny) == 0


def test_two_edits_apply_in_the_order_they_were_installed(tiny, ids):
    first = nbgrad.edit(tiny, "model.transformer.h[1].output += 1")
    second = nbgrad.edit(tiny, "model.transformer.h[1].output *= 3")
    edited = tiny(ids).logits
    assert active_edits(tiny) == [first, second]
    first.remove()
    only_second = tiny(ids).logits
    second.remove()
    handles = _by_hand(tiny, (tiny.transformer.h[1], lambda m, a, o: o + 1), (tiny.transformer.h[1], lambda m, a, o: o * 3))
    expected = tiny(ids).logits
    _remove(handles)
    handles = _by_hand(tiny, (tiny.transformer.h[1], lambda m, a, o: o * 3))
    expected_second = tiny(ids).logits
    _remove(handles)
    assert torch.equal(edited, expected) and torch.equal(only_second, expected_second)
    assert active_edits(tiny) == [] and hook_count(tiny) == 0


def test_generate_gives_the_tokens_of_the_hand_hooked_generate(tiny, ids):
    options = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    plain = tiny.generate(ids, **options)
    with nbgrad.edit(tiny, PUSH):
        edited = tiny.generate(ids, **options)
        by_cell = nbgrad.generate(tiny, ids, "", max_new_tokens=6).output
    module_of_head[:] = [tiny.lm_head]
    handles = _by_hand(tiny, (tiny.transformer.h[3], _push))
    expected = tiny.generate(ids, **options)
    _remove(handles)
    assert torch.equal(edited, expected) and torch.equal(by_cell, expected)
    assert not torch.equal(edited, plain)
    assert torch.equal(tiny.generate(ids, **options), plain) and hook_count(tiny) == 0


def test_a_later_trace_reads_the_edited_values_and_its_own_edits_apply_on_top(tiny, ids):
    cell = ("h = model.transformer.h[1].output[:, -1].save()\n"
            "model.transformer.h[1].output[:, 0] = 0\n"
            "logits = model.output.logits.save()\n")
    with nbgrad.edit(tiny, STEER):
        saved = nbgrad.trace(tiny, ids, cell).saved
        general = nbgrad.trace(tiny, None, "with invoke(ids):\n" + "".join("    " + line + "\n"
                                                                          for line in cell.splitlines()),
                               namespace={"model": tiny, "ids": ids, "torch": torch}).saved
    seen = {}

    def trace_by_hand(module, args, output):
        seen["h"] = output[:, -1].clone()
        output[:, 0] = 0
    handles = _by_hand(tiny, (tiny.transformer.h[1], _steer), (tiny.transformer.h[1], trace_by_hand))
    expected = tiny(ids).logits
    _remove(handles)
    for result in (saved, general):
        assert torch.equal(result["h"], seen["h"]) and torch.equal(result["logits"], expected)
    assert hook_count(tiny) == 0


def test_a_trace_cell_with_nbgrad_save_still_saves_while_an_edit_runs(tiny, ids):
    with nbgrad.edit(tiny, STEER):
        result = nbgrad.trace(tiny, ids, "import nbgrad\nnbgrad.save(model.transformer.h[2].output)\n"
                                         "x = nbgrad.save(model.transformer.h[3].output)")
    assert result.saved["x"].shape == (1, 6, 32)


def test_remove_is_idempotent_and_the_edit_says_it_is_removed(tiny, ids):
    edit = nbgrad.edit(tiny, STEER)
    assert "active" in repr(edit) and edit_hooks(tiny) > 0
    edit.remove()
    edit.remove()
    assert "removed" in repr(edit) and edit_hooks(tiny) == 0 and hook_count(tiny) == 0


def test_the_body_reads_the_namespace_it_was_installed_from(tiny, ids):
    namespace = {"model": tiny, "torch": torch, "scale": 2.0}
    with nbgrad.edit(tiny, "model.transformer.h[0].output *= scale", namespace):
        namespace["scale"] = 100.0                  # rebinding later does not change the installed edit
        edited = tiny(ids).logits
    handles = _by_hand(tiny, (tiny.transformer.h[0], _double))
    expected = tiny(ids).logits
    _remove(handles)
    assert torch.equal(edited, expected) and set(namespace) == {"model", "torch", "scale"}


def test_a_cache_and_a_generate_cell_see_the_edited_values(tiny, ids):
    seen = {}

    def keep(module, args, output):
        seen["h"] = output.clone()
    with nbgrad.edit(tiny, STEER):
        cached = nbgrad.trace(tiny, ids, "c = cache('transformer.h.1')").saved["c"]
        steps = nbgrad.generate(tiny, ids, "h = model.transformer.h[1].output.save()", max_new_tokens=2).saved["h"]
    handles = _by_hand(tiny, (tiny.transformer.h[1], _steer), (tiny.transformer.h[1], keep))
    tiny(ids)
    _remove(handles)
    assert torch.equal(cached["transformer.h.1"], seen["h"]) and torch.equal(steps[0], seen["h"])


def test_a_run_over_a_dataset_sees_the_edit_in_every_example(default_model):
    prompts = ["The cat sat on the", "A dog"]
    body = "model.transformer.h[0].output[:, -1] += torch.arange(model.config.n_embd) / 8"
    with nbgrad.edit(default_model, body):
        over = nbgrad.trace(default_model, None, "last = model.lm_head.output[:, -1].save()", over=prompts,
                            batch_size=2, progress=False).saved["last"]

    def steer(module, args, output):
        output[:, -1] += torch.arange(default_model.config.n_embd) / 8
    handle = default_model.transformer.h[0].register_forward_hook(steer)
    tokenizer = nbgrad.tokenizer_for(default_model)
    expected = [default_model(**tokenizer(prompt, return_tensors="pt")).logits[:, -1] for prompt in prompts]
    handle.remove()
    plain = [default_model(**tokenizer(prompt, return_tensors="pt")).logits[:, -1] for prompt in prompts]
    for got, want, unedited in zip(over, expected, plain):
        torch.testing.assert_close(got.reshape(want.shape), want, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(want, unedited, atol=1e-2)
    assert hook_count(default_model) == 0


def test_calls_a_cell_makes_are_plain_calls_with_no_edit_as_in_a_trace(tiny, ids):
    plain = tiny(ids).logits
    head = "model.lm_head.output[:, -1] = 0"
    cell = ("lens = model.lm_head(model.transformer.h[1].output).save()\n"
            "logits = model.output.logits.save()\n"
            "again = model(ids).logits.save()\n")
    with nbgrad.edit(tiny, head):
        saved = nbgrad.trace(tiny, ids, cell, namespace={"model": tiny, "ids": ids}).saved
        edited = tiny(ids).logits
    blocks = []
    handle = tiny.transformer.h[1].register_forward_hook(lambda module, args, output: blocks.append(output))
    tiny(ids)
    handle.remove()
    assert torch.equal(saved["lens"], tiny.lm_head(blocks[0])) and torch.equal(saved["again"], plain)
    assert torch.equal(saved["logits"], edited) and (edited[:, -1] == 0).all() and torch.equal(edited[:, :-1], plain[:, :-1])
    assert hook_count(tiny) == 0


def test_a_model_whose_edit_was_never_removed_goes_when_the_notebook_lets_go_of_it(ids):
    import gc
    import weakref
    model = tiny_gpt2()
    edit = nbgrad.edit(model, STEER)
    model(ids)
    gone = weakref.ref(model)
    del model, edit
    gc.collect()
    assert gone() is None

