"""HookSet (engine/run/hookset.py): a hook put in by `HookSet.forward_hook` does what one registered by
`register_forward_hook` does, in the same order among torch's own hooks; the set removes every handle, twice
safely; what registers hooks in its own way is asked to. (test_interrupts.py and test_source_cleanup.py interrupt
every line of it.)"""
import torch
from torch import nn

from nbgrad.engine.run.hookset import ForwardHook, HookSet
from helpers import hook_count


def test_it_runs_in_order_among_torchs_own_hooks_and_can_replace_the_output():
    layer, calls, hooks = nn.Linear(3, 3), [], HookSet()
    first = layer.register_forward_hook(lambda m, a, o: calls.append("torch, before"))
    hooks.forward_hook("ours", layer, lambda m, a, o: calls.append("ours") or o * 0)
    last = layer.register_forward_hook(lambda m, a, o: calls.append(("torch, after", o.abs().sum().item())))
    always = layer.register_forward_hook(lambda m, a, o: calls.append("always"), always_call=True)
    assert type(hooks["ours"]) is ForwardHook and torch.equal(layer(torch.ones(1, 3)), torch.zeros(1, 3))
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
    assert module.asked == 1 and type(hooks["ours"]) is not ForwardHook
    assert torch.equal(module(torch.zeros(1)), torch.ones(1))
    hooks.remove_all()
    assert hook_count(module) == 0


def test_a_hook_that_goes_first_is_registered_by_torchs_way():
    layer, calls, hooks = nn.Linear(2, 2), [], HookSet()
    earlier = layer.register_forward_hook(lambda m, a, o: calls.append("torch's"))
    hooks.forward_hook("first", layer, lambda m, a, o: calls.append("ours"), prepend=True)
    layer(torch.ones(1, 2))
    assert calls == ["ours", "torch's"] and type(hooks["first"]) is not ForwardHook
    hooks.remove_all()
    earlier.remove()
    assert hook_count(layer) == 0
