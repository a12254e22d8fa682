"""Shared helpers for the tests: models built from a config, the state a cell must leave alone, and plain-hook
runs of the same model to compare with (the oracle)."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import nbgrad
from nbgrad.engine.results.cache import main_tensor


def tiny_gpt2(n_layer=4, seed=0):
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=n_layer, n_embd=32, n_head=2, vocab_size=97, n_positions=32,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def tensor_hook_count(tensor):
    """Hooks on one tensor: gradient hooks (`register_hook`) and post-accumulate-grad hooks."""
    return len(getattr(tensor, "_backward_hooks", None) or {}) + \
        len(getattr(tensor, "_post_accumulate_grad_hooks", None) or {})


def hook_count(model):
    """Every hook a cell could leave: forward / pre / backward hooks on each module, torch's global
    module hooks, and tensor hooks on each parameter and buffer."""
    from torch.nn.modules import module as module_globals
    total = sum(len(getattr(module_globals, name)) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks"))
    for module in model.modules():
        total += len(module._forward_hooks) + len(module._forward_pre_hooks)
        total += len(module._backward_hooks) + len(getattr(module, "_backward_pre_hooks", {}))
        total += len(getattr(module, "_forward_hooks_with_kwargs", {}))
    for tensor in list(model.parameters()) + list(model.buffers()):
        total += tensor_hook_count(tensor)
    return total


def model_state(model):
    """Everything a cell must leave as it found it."""
    return (hook_count(model), [p.requires_grad for p in model.parameters()], torch.is_grad_enabled(),
            [None if p.grad is None else p.grad.clone() for p in model.parameters()])


def assert_clean(model, before):
    after = model_state(model)
    assert after[0] == before[0], "hooks left on the model"
    assert after[1] == before[1], "requires_grad flags changed"
    assert after[2] == before[2], "grad mode changed"
    for a, b in zip(after[3], before[3]):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), ".grad changed"


def hooked(model, ids, names=None, loss=None):
    """Plain hooks on every module named (all by default): (outputs by path in call order, first inputs,
    gradients into each output's tensor when `loss(output)` is backpropagated, the model's output)."""
    modules = dict(model.named_modules())
    outputs, inputs, grads, handles = {}, {}, {}, []
    for name in (names if names is not None else list(modules)):
        def keep(mod, args, output, name=name):
            outputs[name] = output
            tensor = main_tensor(output)
            if loss is not None and tensor is not None and tensor.requires_grad:
                tensor.register_hook(lambda grad, name=name: grads.__setitem__(name, grad))
        handles.append(modules[name].register_forward_hook(keep))
        handles.append(modules[name].register_forward_pre_hook(
            lambda mod, args, name=name: inputs.__setitem__(name, args[0] if args else None)))
    try:
        output = model(ids)
        if loss is not None:
            loss(output).backward()
    finally:
        for handle in handles:
            handle.remove()
    return outputs, inputs, grads, output


def steered_logits(model, ids):
    """The logits with block 1's last position steered by `torch.arange(32.) / 8`, done by a plain hook (the edit
    tests' STEER, by hand)."""
    def steer(module, args, output):
        output[:, -1] += torch.arange(32.) / 8
    handle = model.transformer.h[1].register_forward_hook(steer)
    try:
        return model(ids).logits
    finally:
        handle.remove()


def alone(model, prompt, layer, edit=None, target=None):
    """One prompt alone, plain hooks: (block `layer` output, logits, d logits[-1, target] / d output)."""
    ids = nbgrad.tokenizer_for(model)(prompt, return_tensors="pt")["input_ids"]
    seen = {}

    def hook(module, args, output):
        if edit is not None:
            output = output.clone()
            edit(output)
        seen["out"] = output
        return output
    handle = model.transformer.h[layer].register_forward_hook(hook)
    try:
        logits = model(ids).logits
    finally:
        handle.remove()
    grad = torch.autograd.grad(logits[:, -1, target].sum(), seen["out"])[0] if target is not None else None
    return seen["out"].detach(), logits.detach(), grad
