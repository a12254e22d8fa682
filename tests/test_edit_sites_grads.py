"""Persistent edits of sites (`M.source.SITE`), skips (`M.skip(v)`) and gradients (`T.grad[...] = v`, `T.grad = g`):
every later call equals the same edit done by hand with plain hooks (`register_forward_hook` on the module a site
calls, a hook that returns the skipped module's input, `register_hook` on the output's tensor), and `.remove()`
gives back the original model; a compiled caller is refused with a message."""
import pytest
import torch
from torch import nn

import nbgrad
from nbgrad.errors import NbgradError
from helpers import hook_count, tiny_gpt2

GENERATE = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)


def _by_hand(module, hook, pre=False):
    return module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook)


@pytest.mark.parametrize("body, module_of, hook, pre", [
    ("model.transformer.h[0].attn.source.self_c_attn_1.output[:] *= 0.5",          # a call of a module
     lambda m: m.transformer.h[0].attn.c_attn, lambda mod, args, out: out * 0.5, False),
    ("model.transformer.h[1].attn.source.attn_output_0.output[:, -1] = 0",         # an assignment
     lambda m: m.transformer.h[1].attn.c_proj, lambda mod, args: (_zero_last(args[0]),), True),
    ("model.transformer.h[2].mlp.source.self_act_0.output[..., :8] = 0",
     lambda m: m.transformer.h[2].mlp.act, lambda mod, args, out: _zero_first(out), False),
])
def test_a_site_edit_equals_the_hand_hooked_model_at_every_call_and_remove_gives_it_back(tiny, ids, body,
                                                                                         module_of, hook, pre):
    before, plain_tokens = tiny(ids).logits, tiny.generate(ids, **GENERATE)
    with nbgrad.edit(tiny, body):
        edited = [tiny(ids).logits for _ in range(2)]
        tokens = tiny.generate(ids, **GENERATE)
        traced = nbgrad.trace(tiny, ids, "logits = model.output.logits.save()").saved["logits"]
    assert "forward" not in vars(tiny.transformer.h[0].attn) and hook_count(tiny) == 0
    handle = _by_hand(module_of(tiny), hook, pre)
    expected, expected_tokens = tiny(ids).logits, tiny.generate(ids, **GENERATE)
    handle.remove()
    for logits in edited + [traced]:
        assert torch.equal(logits, expected)
    assert not torch.equal(expected, before) and torch.equal(tokens, expected_tokens)
    assert torch.equal(tiny(ids).logits, before) and torch.equal(tiny.generate(ids, **GENERATE), plain_tokens)


def _zero_last(value):
    value = value.clone()
    value[:, -1] = 0
    return value


def _zero_first(value):
    value = value.clone()
    value[..., :8] = 0
    return value


def test_a_skip_edit_equals_a_hook_that_returns_the_input_and_a_later_trace_sees_it(tiny, ids):
    before = tiny(ids).logits
    with nbgrad.edit(tiny, "model.transformer.h[1].skip(model.transformer.h[1].input)") as edit:
        edited = [tiny(ids).logits for _ in range(2)]
        saved = nbgrad.trace(tiny, ids, "h = model.transformer.h[1].output.save()\n"
                                        "i = model.transformer.h[1].input.save()").saved
        for _ in range(2):      # the edit is armed again after each call: the cell still hears that it skipped
            with pytest.raises(NbgradError, match=r"^line 1: model.transformer.h\[1\].attn.output never came: "
                                                  r"GPT2Block was skipped \(`.skip\(...\)`\), so nothing inside it ran$"):
                nbgrad.trace(tiny, ids, "a = model.transformer.h[1].attn.output.save()")
        assert torch.equal(tiny(ids).logits, edited[0]) and edit.active
    assert "forward" not in vars(tiny.transformer.h[1]) and hook_count(tiny) == 0
    handle = tiny.transformer.h[1].register_forward_hook(lambda module, args, output: args[0])
    expected = tiny(ids).logits
    handle.remove()
    assert all(torch.equal(logits, expected) for logits in edited) and not torch.equal(expected, before)
    assert torch.equal(saved["h"], saved["i"]) and torch.equal(tiny(ids).logits, before)


def _embedding_grad(model, ids, hook=None):
    """The gradient of the top last-position logit into the token embeddings, with `hook` on block 1's output."""
    handle = None
    if hook is not None:
        handle = model.transformer.h[1].register_forward_hook(
            lambda module, args, output: (output.register_hook(hook), None)[1])
    model.zero_grad()
    model(ids).logits[0, -1].max().backward()
    if handle is not None:
        handle.remove()
    return model.transformer.wte.weight.grad.clone()


def _cut_last(grad):
    grad = grad.clone()
    grad[:, -1] = 0
    return grad


@pytest.mark.parametrize("body, hook", [
    ("model.transformer.h[1].output.grad[:, -1] = 0", _cut_last),
    ("model.transformer.h[1].output.grad = model.transformer.h[1].output.grad * 3", lambda grad: grad * 3),
    ("h = model.transformer.h[1].output\nh.grad[:, -1] = 0", _cut_last),
])
def test_a_gradient_edit_equals_register_hook_at_every_backward_pass(tiny, ids, body, hook):
    plain = _embedding_grad(tiny, ids)
    with nbgrad.edit(tiny, body):
        edited = [_embedding_grad(tiny, ids) for _ in range(2)]
        with torch.no_grad():
            tiny(ids)                       # no graph, no gradient to edit: nothing waits
        tokens = tiny.generate(ids, **GENERATE)
    expected = _embedding_grad(tiny, ids, hook)
    assert all(torch.equal(grad, expected) for grad in edited) and not torch.equal(expected, plain)
    assert torch.equal(_embedding_grad(tiny, ids), plain) and hook_count(tiny) == 0
    assert torch.equal(tokens, tiny.generate(ids, **GENERATE))


def test_a_trace_cell_reads_the_gradient_the_edit_made(tiny, ids):
    cell = ("with model.output.logits[0, -1].max().backward():\n"
            "    g = model.transformer.h[0].output.grad.save()\n")
    with nbgrad.edit(tiny, "model.transformer.h[1].output.grad[:, -1] = 0"):
        saved = nbgrad.trace(tiny, ids, cell).saved["g"]
    seen = []
    hands = [tiny.transformer.h[1].register_forward_hook(lambda m, a, out: (out.register_hook(_cut_last), None)[1]),
             tiny.transformer.h[0].register_forward_hook(
                 lambda m, a, out: (out.register_hook(seen.append), None)[1])]
    tiny(ids).logits[0, -1].max().backward()
    for handle in hands:
        handle.remove()
    assert torch.equal(saved, seen[0]) and hook_count(tiny) == 0


def test_a_gradient_of_a_call_before_the_latest_is_refused_not_left_unedited(tiny, ids):
    with nbgrad.edit(tiny, "model.transformer.h[1].output.grad[:, -1] = 0"):
        first = tiny(ids).logits[0, -1].max()
        tiny(ids)
        with pytest.raises(NbgradError) as raised:
            first.backward()
    assert str(raised.value) == (
        "line 1: model.transformer.h[1].output.grad: this gradient is of a call of the model made before its latest "
        "call, and nbgrad.edit(GPT2LMHeadModel) edits the gradients of a call only until the model is called "
        "again. Run each call's backward pass before the next call (or sum their losses into one call's)")
    assert hook_count(tiny) == 0


def test_a_second_backward_pass_through_one_call_is_refused(tiny, ids):
    with nbgrad.edit(tiny, "model.transformer.h[1].output.grad[:, -1] = 0"):
        loss = tiny(ids).logits[0, -1].max()
        loss.backward(retain_graph=True)
        with pytest.raises(NbgradError, match=r"^a second backward pass reached a gradient that nbgrad.edit\("
                                              r"GPT2LMHeadModel\) already edited in this call of the model: .*Call "
                                              r"the model again for each backward pass$"):
            loss.backward()
        assert len(nbgrad.engine.edit.edits.active_edits(tiny)) == 1
    assert hook_count(tiny) == 0


def test_a_model_wrapped_by_another_module_gets_the_edit_when_the_wrapper_calls_it(tiny, ids):
    wrapper = nn.Sequential(nn.Identity(), tiny)
    with nbgrad.edit(tiny, "model.transformer.h[1].output = model.transformer.h[1].output * 2"):
        wrapped = wrapper(ids).logits
    handle = tiny.transformer.h[1].register_forward_hook(lambda module, args, output: output * 2)
    expected = tiny(ids).logits
    handle.remove()
    assert torch.equal(wrapped, expected) and hook_count(tiny) == 0


@pytest.mark.parametrize("compile_first", [True, False])
def test_a_compiled_caller_is_refused_and_works_again_after_remove(ids, compile_first):
    model = tiny_gpt2()
    before = model(ids).logits
    compiled = torch.compile(model, backend="eager") if compile_first else None
    if compiled is not None:
        compiled(ids)
    edit = nbgrad.edit(compiled if compiled is not None else model, "model.transformer.h[1].output[:] *= 2")
    compiled = compiled if compiled is not None else torch.compile(model, backend="eager")
    with pytest.raises(NbgradError, match=r"^nbgrad.edit\(GPT2LMHeadModel\) is on a model that torch.compile'd code "
                                          r"calls: compiled code does not run the hooks an edit lives in"):
        compiled(ids)
    edited = model(ids).logits                              # the module itself, called, has the edit
    edit.remove()
    handle = model.transformer.h[1].register_forward_hook(lambda module, args, output: output * 2)
    expected = model(ids).logits
    handle.remove()
    assert torch.equal(edited, expected)
    assert torch.allclose(compiled(ids).logits, before) and hook_count(model) == 0


@pytest.mark.parametrize("body, by_hand", [
    ("model.transformer.h[1].output.grad[:, -1] = 0",
     lambda m: m.transformer.h[1].register_forward_hook(lambda mod, a, out: (out.register_hook(_cut_last), None)[1])),
    ("model.transformer.h[0].attn.source.self_c_attn_1.output[:] *= 0.5",
     lambda m: m.transformer.h[0].attn.c_attn.register_forward_hook(lambda mod, a, out: out * 0.5)),
    ("model.transformer.h[1].skip(model.transformer.h[1].input)",
     lambda m: m.transformer.h[1].register_forward_hook(lambda mod, args, out: args[0])),
])
def test_an_interrupt_at_any_line_of_a_call_and_its_backward_pass_leaves_the_edit_whole(ids, body, by_hand):
    from interrupts import Injector
    from nbgrad.engine.edit.edits import edit_hooks
    model = tiny_gpt2()
    handle = by_hand(model)
    expected = _embedding_grad(model, ids)
    handle.remove()
    edit = nbgrad.edit(model, body)
    with Injector(record=True) as clean:
        _embedding_grad(model, ids)
    hooks = edit_hooks(model)          # the armed edit, and the call's run until the next call
    try:
        for k in range(1, clean.count + 1, 3):
            with pytest.raises(KeyboardInterrupt):
                with Injector(at=k):
                    _embedding_grad(model, ids)
            assert torch.equal(_embedding_grad(model, ids), expected), f"after an interrupt at line event {k}"
            assert edit_hooks(model) == hooks
    finally:
        edit.remove()
    assert hook_count(model) == 0 and torch.equal(_embedding_grad(model, ids), _embedding_grad(model, ids))
