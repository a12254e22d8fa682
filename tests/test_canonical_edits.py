"""Canonical names in an edit (`nbgrad.edit`, `%%edit`): the edit equals the same writes made by hand with plain
PyTorch hooks on the real paths, on every later call, until it is removed; values inside a forward (q, k, v,
patterns) are refused with a message that says where they belong."""
import pytest
import torch

import nbgrad
from nbgrad.errors import NbgradError
from nbgrad.names import FAMILIES
from canonical_models import IDS, build, hooked_run

BODY = "model.layers[0].resid_post[:, 2] = 0\nmodel.layers[1].attn.z[:, :, 1] = 0\nmodel.layers[1].attn.z *= 0.5\n" \
       "model.layers[0].mlp.post[:] *= 3"


def _hand_made(model, family):
    entry = FAMILIES[family]
    blocks = [f"{entry['layers']}.{i}" for i in range(2)]

    def zero_position(module, args, output):
        (output[0] if isinstance(output, tuple) else output)[:, 2] = 0

    def z_edit(module, args, kwargs):
        z = args[0].unflatten(-1, (2, -1)).clone()
        z[:, :, 1] = 0
        return ((z * 0.5).flatten(-2), *args[1:]), kwargs
    with torch.no_grad():
        return hooked_run(model, {blocks[0]: zero_position},
                          {f"{blocks[1]}.{entry['attn_out']}": z_edit,
                           f"{blocks[0]}.{entry['mlp_out']}": lambda m, a, k: (a[0].mul_(3), None)[1]}).logits


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neo", "bloom"])
def test_an_edit_in_canonical_names_equals_hand_made_hooks_until_removed(family):
    model = build(family)
    with torch.no_grad():
        plain = model(IDS).logits
    want = _hand_made(model, family)
    edit = nbgrad.edit(model, BODY)
    try:
        with torch.no_grad():
            torch.testing.assert_close(model(IDS).logits, want)
            torch.testing.assert_close(model(IDS).logits, want)       # every later call
        assert "model.layers[1].attn.z[:, :, 1] = 0" in repr(edit)     # the body as written
    finally:
        edit.remove()
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, plain)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert "nbgrad_view" not in dir(model)


@pytest.mark.parametrize("line, name", [("model.layers[0].attn.pattern[:, 1] = 0", "pattern"),
                                        ("model.layers[1].attn.q[:, 0] *= 0", "q")])
def test_values_inside_the_attention_forward_are_refused_in_an_edit(line, name):
    model = build("llama")
    with pytest.raises(NbgradError, match=rf"line 2: canonical names: attn\.{name} is a value inside the attention's "
                                          r"forward \(a site\), which an edit does not take by its canonical name "
                                          r"yet; write it in each %%trace"):
        nbgrad.edit(model, "model.layers[1].resid_mid[:] *= 2\n" + line)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_the_edit_magic_takes_canonical_names_and_later_cells_run_with_the_edit(shell):
    model = build("llama")
    shell.user_ns.update(tiny_llama=model, ids=IDS)
    with torch.no_grad():           # by hand, before the edit is on
        want = hooked_run(model, pre={"model.layers.1.post_attention_layernorm":
                                      lambda m, a, k: (a[0][:, 1].mul_(-1), None)[1]}).logits
    try:
        result = shell.run_cell("%%edit tiny_llama --out halved\ntiny_llama.layers[1].resid_mid[:, 1] *= -1")
        assert result.success, result.error_in_exec
        result = shell.run_cell("%%trace tiny_llama ids -q\nlogits = tiny_llama.logits.save()")
        assert result.success, result.error_in_exec
        torch.testing.assert_close(shell.user_ns["logits"].detach(), want)
    finally:
        shell.run_cell("halved.remove()")
        for name in ("tiny_llama", "ids", "halved", "logits"):
            shell.user_ns.pop(name, None)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
