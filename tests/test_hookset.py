"""HookSet (engine/run/hookset.py): a hook put in by `HookSet.forward_hook` does what one registered by
`register_forward_hook` does, in the same order among torch's own hooks; the set removes every handle, twice
safely; what registers hooks in its own way is asked to. (test_interrupts.py and test_source_cleanup.py interrupt
every line of it.) The same for a gradient hook put in by `HookSet.grad_hook` against `Tensor.register_hook`."""
from pathlib import Path

import pytest
import torch
from torch import nn

from nbgrad.engine.run.hookset import DictHandle, HookSet
from helpers import hook_count


def test_it_runs_in_order_among_torchs_own_hooks_and_can_replace_the_output():
    layer, calls, hooks = nn.Linear(3, 3), [], HookSet()
    first = layer.register_forward_hook(lambda m, a, o: calls.append("torch, before"))
    hooks.forward_hook("ours", layer, lambda m, a, o: calls.append("ours") or o * 0)
    last = layer.register_forward_hook(lambda m, a, o: calls.append(("torch, after", o.abs().sum().item())))
    always = layer.register_forward_hook(lambda m, a, o: calls.append("always"), always_call=True)
    assert type(hooks["ours"]) is DictHandle and torch.equal(layer(torch.ones(1, 3)), torch.zeros(1, 3))
    assert calls == ["torch, before", "ours", ("torch, after", 0.0), "always"]
    for handle in (first, last, always):
        handle.remove()
    hooks["ours"].remove()
    hooks["ours"].remove()          # twice: nothing
    assert hook_count(layer) == 0 and not layer._forward_hooks_always_called


def test_the_set_removes_every_handle_of_either_kind_once_and_again_safely():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    hooks = HookSet()
    hooks.forward_hook("ours", model[0], lambda m, a, o: None)
    hooks.add("torch's", lambda: model[1].register_forward_hook(lambda m, a, o: None))
    assert hook_count(model) == 2
    hooks.remove_all()
    hooks.remove_all()
    assert hook_count(model) == 0 and not hooks


class OwnRegistration(nn.Module):
    """A module that registers hooks its own way: asked, not bypassed."""

    def __init__(self):
        super().__init__()
        self.asked = 0

    def register_forward_hook(self, hook, **options):
        self.asked += 1
        return super().register_forward_hook(hook, **options)

    def forward(self, x):
        return x


def test_a_module_that_registers_its_own_way_is_asked():
    module, hooks = OwnRegistration(), HookSet()
    hooks.forward_hook("ours", module, lambda m, a, o: o + 1)
    assert module.asked == 1 and type(hooks["ours"]) is not DictHandle
    assert torch.equal(module(torch.zeros(1)), torch.ones(1))
    hooks.remove_all()
    assert hook_count(module) == 0


def test_a_hook_that_goes_first_is_registered_by_torchs_way():
    layer, calls, hooks = nn.Linear(2, 2), [], HookSet()
    earlier = layer.register_forward_hook(lambda m, a, o: calls.append("torch's"))
    hooks.forward_hook("first", layer, lambda m, a, o: calls.append("ours"), prepend=True)
    layer(torch.ones(1, 2))
    assert calls == ["ours", "torch's"] and type(hooks["first"]) is not DictHandle
    hooks.remove_all()
    earlier.remove()
    assert hook_count(layer) == 0


# --- gradient hooks (HookSet.grad_hook) ------------------------------------------------------------------

def _gradient_seen(tensor_of, register) -> tuple:
    """(what the hook saw, the leaf's gradient) for `loss = (3 * t).sum()` with `t = tensor_of(leaf)`."""
    leaf = torch.arange(4.0, requires_grad=True)
    tensor, seen = tensor_of(leaf), []
    register(tensor, lambda grad: seen.append(grad.clone()) or grad * 2)
    (3 * tensor).sum().backward()
    return seen, leaf.grad


def _torchs(tensor, hook):
    tensor.register_hook(hook)


def _ours(hooks):
    return lambda tensor, hook: hooks.grad_hook("ours", tensor, hook)


def test_a_gradient_hook_does_what_torchs_does_on_a_leaf_an_output_and_an_edited_view():
    ways = {"leaf": lambda leaf: leaf, "output": lambda leaf: leaf * 1.0,
            "view edited in place": lambda leaf: (leaf * 1.0)[1:].mul_(2)}
    for name, tensor_of in ways.items():
        hooks = HookSet()
        expected, found = _gradient_seen(tensor_of, _torchs), _gradient_seen(tensor_of, _ours(hooks))
        assert type(hooks["ours"]) is DictHandle, name
        assert len(found[0]) == 1 and torch.equal(found[0][0], expected[0][0]), name
        assert torch.equal(found[1], expected[1]), name       # the hook's return replaced the gradient, as torch's


def test_a_gradient_hook_removed_does_not_run_and_goes_among_torchs_in_order():
    tensor = torch.ones(2, requires_grad=True) * 1.0
    calls, hooks = [], HookSet()
    first = tensor.register_hook(lambda grad: calls.append("torch, before"))
    hooks.grad_hook("ours", tensor, lambda grad: calls.append("ours"))
    tensor.register_hook(lambda grad: calls.append("torch, after"))
    tensor.sum().backward(retain_graph=True)
    assert calls == ["torch, before", "ours", "torch, after"]
    hooks.remove_all()
    hooks.remove_all()
    first.remove()
    tensor.sum().backward()
    assert calls[3:] == ["torch, after"]


def test_a_parameter_and_a_tensor_without_grad_go_to_torchs_way():
    hooks = HookSet()
    weight = nn.Parameter(torch.ones(2))
    hooks.grad_hook("parameter", weight, lambda grad: None)
    assert type(hooks["parameter"]) is not DictHandle
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        hooks.grad_hook("no grad", torch.ones(2), lambda grad: None)
    hooks.remove_all()
    assert not weight._backward_hooks


def test_the_installed_torch_runs_hooks_put_into_its_dicts():
    from nbgrad.engine.run.torchcheck import private_hooks_problem
    assert private_hooks_problem() is None


def test_a_torch_that_ignores_its_hook_dicts_is_refused_naming_the_range():
    import re
    from nbgrad.engine.run.torchcheck import SUPPORTED_TORCH, require_private_hooks

    class CallsNoHooks(nn.Identity):
        def __call__(self, x):          # as a torch whose modules no longer read _forward_hooks would
            return self.forward(x)

    with pytest.raises(ImportError, match=re.escape(f"nbgrad needs torch{SUPPORTED_TORCH}; the installed torch")) \
            as raised:
        require_private_hooks(CallsNoHooks)
    assert "a forward hook put into torch's hook dict did not fire" in str(raised.value)
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert f'"torch{SUPPORTED_TORCH}"' in pyproject
