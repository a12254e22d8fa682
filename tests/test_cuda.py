"""On a CUDA GPU: traces, gradients read in hooks that autograd runs on its device thread, edits,
`%%backward`, and a model split over `cuda:0` and the CPU by accelerate — each against plain PyTorch on
the same weights. Skipped where `torch.cuda.is_available()` is false."""
import threading

import pytest
import torch

import nbgrad
from nbgrad.models.inputs import input_device
from families import save_checkpoint
from helpers import hook_count, hooked, tiny_gpt2

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
GPU = torch.device("cuda", 0)
IDS = torch.tensor([[3, 14, 15, 92, 65, 35]])      # on the CPU: nbgrad moves INPUT to the model's device
CLOSE = dict(rtol=1e-4, atol=1e-5)


def _plain(model, ids, block, edit=False):
    seen = {}

    def hook(module, args, output):
        if edit:
            output[:, 0] = 0
        seen["h"] = output
    handle = block.register_forward_hook(hook)
    try:
        logits = model(ids.to(GPU)).logits
    finally:
        handle.remove()
    return seen["h"], logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_trace_and_gradient_on_the_gpu(dtype):
    model = tiny_gpt2().to(GPU, dtype)
    result = nbgrad.trace(model, IDS, "h = model.transformer.h[1].output.save()\n"
                                      "with model.output.logits.float().pow(2).mean().backward():\n"
                                      "    g = h.grad.save()\n")
    hidden, logits = _plain(model, IDS, model.transformer.h[1])
    expected, = torch.autograd.grad(logits.float().pow(2).mean(), hidden)
    for name, value in (("h", hidden), ("g", expected)):
        assert result.saved[name].device == GPU and result.saved[name].dtype == dtype
        torch.testing.assert_close(result.saved[name], value)
    assert hook_count(model) == 0


def test_gradient_hook_runs_on_autograd_device_thread_and_is_read():
    model = tiny_gpt2().to(GPU)
    result = nbgrad.trace(model, IDS, "h = model.transformer.h[0].output.save()\n"
                                      "with model.output.logits.sum().backward():\n"
                                      "    g = h.grad.save()\n")
    hidden, logits = _plain(model, IDS, model.transformer.h[0])
    threads = []
    hidden.register_hook(lambda grad: threads.append(threading.get_ident()))
    expected, = torch.autograd.grad(logits.sum(), hidden)
    # The case this test is for: autograd runs a CUDA tensor's hooks on its device thread, not this one.
    assert threads and threads[0] != threading.get_ident()
    torch.testing.assert_close(result.saved["g"], expected)


def test_edit_on_the_gpu_equals_a_plain_hook_edit():
    model = tiny_gpt2().to(GPU)
    result = nbgrad.trace(model, IDS, "model.transformer.h[1].output[:, 0] = 0\n"
                                      "logits = model.output.logits.save()", no_grad=True)
    with torch.no_grad():
        _, edited = _plain(model, IDS, model.transformer.h[1], edit=True)
        _, unedited = _plain(model, IDS, model.transformer.h[1])
    torch.testing.assert_close(result.saved["logits"], edited)
    assert not torch.allclose(edited, unedited)


def test_standalone_backward_cell_on_gpu_tensors(shell):
    shell.user_ns.update(net=tiny_gpt2().to(GPU), ids=IDS)
    shell.run_cell_magic("trace", "net ids -q", "hs = net.transformer.h[1].output.save()\n"
                                                "logits = net.output.logits.save()\n")
    shell.run_cell_magic("backward", "logits.sum() -q", "g = hs.grad.save()")
    namespace = shell.user_ns
    net = namespace["net"]
    net.zero_grad(set_to_none=True)
    hidden, logits = _plain(net, IDS, net.transformer.h[1])
    expected, = torch.autograd.grad(logits.sum(), hidden)
    assert namespace["g"].device == GPU
    torch.testing.assert_close(namespace["g"], expected)


SPLIT = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": "cpu",
         "model.norm": "cpu", "lm_head": "cpu"}
SPLIT_CELL = ("h0 = model.model.layers[0].output.save()\n"
              "h1 = model.model.layers[1].output.save()\n"
              "model.model.layers[1].output[:, 0] = 0\n"
              "logits = model.output.logits.save()\n"
              "with logits.pow(2).mean().backward():\n"
              "    g0 = h0.grad.save()\n")


def test_model_split_over_gpu_and_cpu_equals_the_cpu_model(tmp_path):
    path = str(save_checkpoint("llama", tmp_path))
    split = nbgrad.load_model(path, device_map=SPLIT)
    assert input_device(split) == GPU
    offloaded = split.lm_head.weight.device
    saved = nbgrad.trace(split, IDS, SPLIT_CELL).saved
    expected = nbgrad.trace(nbgrad.load_model(path), IDS, SPLIT_CELL).saved
    # Saved where they were produced, which a plain hook sees: accelerate runs a "cpu" part of a device map on the
    # GPU beside it (CPU offload: its weights stay on the CPU and come to the GPU for each call)
    plain = {}
    handle = split.model.layers[1].register_forward_hook(lambda module, args, output: plain.setdefault("h1", output))
    try:
        with torch.no_grad():
            split(IDS.to(GPU))
    finally:
        handle.remove()
    assert saved["h0"].device == GPU and saved["g0"].device == GPU
    assert saved["h1"].device == plain["h1"].device
    for name, value in expected.items():
        torch.testing.assert_close(saved[name].cpu(), value, msg=name, **CLOSE)
    assert hook_count(split) == 0 and split.lm_head.weight.device == offloaded     # still offloaded as loaded


# --- the third wave on the GPU: caches, sites inside a forward, dataset runs ----------------------------------------

def test_a_cache_moved_to_the_cpu_as_it_arrives_equals_plain_hooks_on_the_gpu():
    model = tiny_gpt2().to(GPU)
    names = [f"transformer.h.{index}" for index in range(4)]
    namespace = {"model": model}
    nbgrad.trace(model, IDS, 'c = cache("transformer.h.*", grads=True, device="cpu")\n'
                             "model.output.logits.pow(2).mean().backward()\n", namespace)
    cached = namespace["c"]
    model.zero_grad(set_to_none=True)
    outputs, _, grads, _ = hooked(model, IDS.to(GPU), names, loss=lambda output: output.logits.pow(2).mean())
    model.zero_grad(set_to_none=True)
    assert [name for name in cached.keys() if name in names] == names      # the blocks, in call order
    for name in names:
        assert cached[name].device.type == "cpu" and cached.grads[name].device.type == "cpu"
        assert cached[name].grad_fn is None           # a detached copy, the GPU's memory freed as the run went
        torch.testing.assert_close(cached[name], outputs[name].detach().cpu(), **CLOSE)
        torch.testing.assert_close(cached.grads[name], grads[name].cpu(), **CLOSE)
    assert hook_count(model) == 0


PATTERN_CELL = ("pattern = model.transformer.h[0].attn.source.attention_interface_1.source.nn_functional_softmax_0"
                ".output\n"
                "with model.output.logits[0, -1].max().backward():\n"
                "    grad = pattern.grad.save()\n"
                "kept = pattern.save()\n")


def test_an_attention_pattern_and_its_gradient_read_inside_the_forward_on_the_gpu():
    """On the GPU autograd calls gradient hooks from its device thread: a site's gradient is taken there, as a module
    output's is (test_gradient_hook_runs_on_autograd_device_thread_and_is_read)."""
    model = tiny_gpt2().to(GPU)
    model.config._attn_implementation = "eager"
    namespace = {"model": model}
    nbgrad.trace(model, IDS, PATTERN_CELL, namespace)
    model.zero_grad(set_to_none=True)
    assert hook_count(model) == 0 and all("forward" not in vars(module) for module in model.modules())
    output = model(IDS.to(GPU), output_attentions=True)       # (transformers leaves hooks of its own for this)
    attentions = output.attentions[0]
    attentions.retain_grad()
    output.logits[0, -1].max().backward()
    model.zero_grad(set_to_none=True)
    assert namespace["kept"].device == GPU and namespace["grad"].device == GPU
    torch.testing.assert_close(namespace["kept"], attentions, **CLOSE)
    torch.testing.assert_close(namespace["grad"], attentions.grad, **CLOSE)
    assert namespace["grad"].abs().sum() > 0


PROMPTS = ["The Eiffel Tower is in the city of", "Hi", "A longer prompt, padded least", "Paris"]
OVER_BODY = ("last = model.transformer.h[1].output[:, -1].save()\n"
             "grad = model.transformer.h[1].output.grad[:, -1].save()\n"
             "model.lm_head.output[:, -1].max().backward()\n")


def test_a_dataset_run_on_the_gpu_equals_each_example_run_alone():
    """Text of different lengths, padded on the left in batches of two: the mask and position ids go to the GPU
    with the ids, and each example's values and gradient equal the example alone."""
    model = nbgrad.load_model().to(GPU)
    tokenizer = nbgrad.tokenizer_for(model)
    namespace = {"model": model}
    nbgrad.trace(model, None, OVER_BODY, namespace, over=PROMPTS, batch_size=2, progress=False)
    model.zero_grad(set_to_none=True)
    for index, prompt in enumerate(PROMPTS):
        ids = torch.tensor([tokenizer(prompt)["input_ids"]], device=GPU)
        kept = {}

        def keep(module, args, output):
            output.retain_grad()
            kept["h"] = output
        handle = model.transformer.h[1].register_forward_hook(keep)
        try:
            model(ids).logits[:, -1].max().backward()
        finally:
            handle.remove()
        model.zero_grad(set_to_none=True)
        assert namespace["last"][index].device == GPU
        torch.testing.assert_close(namespace["last"][index], kept["h"][:, -1].detach(), **CLOSE)
        torch.testing.assert_close(namespace["grad"][index], kept["h"].grad[:, -1], **CLOSE)
    assert hook_count(model) == 0
