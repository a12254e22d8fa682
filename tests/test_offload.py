"""Big-model placement through accelerate: blocks offloaded to CPU and disk, explicitly or by
`device_map="auto"` with `max_memory`, trace exactly like the model held in memory; inputs go to the
input embeddings' device (never `meta`); accelerate's hooks are left as they were."""
import pytest
import torch
from torch import nn

import nbgrad
from nbgrad.models.inputs import input_device
from nbgrad.engine.moduletree import parameter_slots
from families import one_thread, save_checkpoint  # noqa: F401
from helpers import hook_count

CELL = """e = model.model.embed_tokens.output.save()
h0 = model.model.layers[0].output.save()
model.model.layers[1].output[:, 0] = 0
logits = model.output.logits.save()
with (logits.float() ** 2).mean().backward():
    g0 = h0.grad.save()
    ge = e.grad.save()
"""
EXPLICIT = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "disk",
            "model.layers.1": "cpu", "model.norm": "cpu", "lm_head": "disk"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(save_checkpoint("llama", tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="module")
def in_memory(llama):
    ids = torch.tensor([[5, 17, 3, 99, 42, 7]])
    return ids, nbgrad.trace(nbgrad.load_model(llama), ids, CELL).saved


def _accelerate_hooks(model) -> dict:
    """What accelerate put on each module: its hook object and the forward it wrapped."""
    return {name: (module.__dict__.get("_hf_hook"), module.__dict__.get("forward"))
            for name, module in model.named_modules() if "_hf_hook" in module.__dict__}


def _check_offloaded_trace(model, ids, expected):
    hooks_before, torch_hooks = _accelerate_hooks(model), hook_count(model)
    assert hooks_before, "accelerate placed no hooks: nothing is offloaded"
    saved = nbgrad.trace(model, ids, CELL).saved
    for name, value in expected.items():
        assert saved[name].device == torch.device("cpu"), name
        torch.testing.assert_close(saved[name], value, msg=name)
    assert saved["g0"].abs().sum() > 0 and saved["ge"].abs().sum() > 0
    after = _accelerate_hooks(model)
    assert after.keys() == hooks_before.keys()
    assert all(after[k][0] is hooks_before[k][0] and after[k][1] is hooks_before[k][1] for k in after)
    assert hook_count(model) == torch_hooks
    again = nbgrad.trace(model, ids, "logits = model.output.logits.save()", no_grad=True).saved["logits"]
    torch.testing.assert_close(again, model(ids).logits.detach())


def test_explicit_device_map_with_blocks_on_disk_equals_the_model_in_memory(llama, in_memory, tmp_path):
    ids, expected = in_memory
    model = nbgrad.load_model(llama, device_map=EXPLICIT, offload_folder=str(tmp_path))
    assert model.lm_head.weight.device.type == "meta" and model.model.layers[0].mlp.up_proj.weight.is_meta
    _check_offloaded_trace(model, ids, expected)


def test_device_map_auto_with_max_memory_offloads_to_disk_and_traces(llama, in_memory, tmp_path):
    ids, expected = in_memory
    embeddings = 580 * 16 * 4
    model = nbgrad.load_model(llama, device_map="auto", max_memory={"cpu": int(embeddings * 2.2)},
                              offload_folder=str(tmp_path))
    assert "disk" in model.hf_device_map.values() and model.lm_head.weight.device.type == "meta"
    assert input_device(model) == torch.device("cpu")
    _check_offloaded_trace(model, ids, expected)


def test_inputs_go_to_the_input_embeddings_device_not_the_first_parameter(tiny, ids):
    tiny.lm_head = nn.Linear(32, 97, bias=False, device="meta")     # a head that accelerate left on disk
    module, name = parameter_slots(tiny)[0]
    assert module._parameters[name].is_meta
    assert input_device(tiny) == torch.device("cpu")
    result = nbgrad.trace(tiny, ids, "h = model.transformer.h[1].output.save()", no_grad=True)
    assert result.saved["h"].device == torch.device("cpu")
    tiny.to("meta")
    assert input_device(tiny) is None      # nothing says where: inputs stay where they are


def test_flags_of_offloaded_parameters_are_restored_after_the_cell(llama, tmp_path):
    model = nbgrad.load_model(llama, device_map=EXPLICIT, offload_folder=str(tmp_path))
    ids = torch.tensor([[1, 2, 3]])
    nbgrad.trace(model, ids, "model.requires_grad_(False)\nx = model.output.logits.save()")
    assert [name for name, p in model.named_parameters() if not p.requires_grad] == []


def test_a_model_without_input_embeddings_finds_its_device_again_after_its_tensors_change():
    # A model of one's own on a float INPUT: its first tensor's device, remembered between cells while that tensor
    # is still where it was found and nothing was registered since; moved, swapped or offloaded, it is looked up
    mlp = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    for _ in range(2):
        result = nbgrad.trace(mlp, x, "h = model[0].output.save()\ny = model.output.save()")
        assert torch.equal(result.saved["h"], mlp[0](x)) and torch.equal(result.saved["y"], mlp(x))
        assert input_device(mlp) == torch.device("cpu")
    mlp[0]._parameters["weight"] = nn.Parameter(torch.empty(4, 3, device="meta"))   # swapped as accelerate does
    assert input_device(mlp) == torch.device("cpu")          # the first tensor on a device: the bias
    mlp.to("meta")
    assert input_device(mlp) is None
    mlp.to_empty(device="cpu")
    assert input_device(mlp) == torch.device("cpu")
    mlp.register_buffer("scale", torch.ones(1, device="meta"))    # now first of all, and on no device
    assert input_device(mlp) == torch.device("cpu")
    mlp.to("meta")
    assert input_device(mlp) is None
    buffers_only = nn.Sequential(nn.BatchNorm1d(3, affine=False))
    assert input_device(buffers_only) == input_device(buffers_only) == torch.device("cpu")
    empty = nn.Sequential(nn.Tanh())
    assert input_device(empty) is None and torch.equal(nbgrad.trace(empty, x, "y = model.output.save()").saved["y"],
                                                       torch.tanh(x))
