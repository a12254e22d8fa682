"""`nbgrad.remote(...)`: a model held by a Ray actor runs the same cells as a local copy of it, bit for bit on
CPU; what travels is the cell and its values, never the weights. The Ray tests' head node (conftest's ray_head) and one
actor for the module (Ray starts slowly on a busy machine); the last test kills the actor and restarts it."""
import _thread
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import nbgrad
from helpers import model_state
from inprocess import one_read_traffic
from nbgrad.datasets.cluster import start_cluster

ray = pytest.importorskip("ray")
PROMPT = "The Eiffel Tower is in the city of"
TESTS = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": f"{TESTS.parent}:{TESTS}", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def big(ray_head):
    # The actor imports nbgrad as this process does: the working tree first. One thread there and here while
    # a test compares values, so that sums are done in the same order (bit-equal results)
    start_cluster(attempts=3, address=ray_head.address, logging_level="ERROR", runtime_env={"env_vars": ENV})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield nbgrad.remote()
    finally:
        torch.set_num_threads(threads)
        ray.shutdown()


@pytest.fixture(scope="module")
def local():
    return nbgrad.load_model()


def hooks_there(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def both(big, local, source, input=PROMPT, **names):
    """The cell on the remote model and on the local copy: (remote namespace, local namespace)."""
    there, here = {"big": big, **names}, {"big": local, **names}
    nbgrad.trace(big, input, source, there)
    nbgrad.trace(local, input, source, here)
    return there, here


def equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def assert_same(there: dict, here: dict, names):
    for name in names:
        assert torch.equal(there[name], here[name]), name


LOSS_CELL = "h = big.transformer.h[1].output.save()\nloss = big.lm_head.output[0, -1].max().save()\n"

GRADIENT_CELL = """
h = big.transformer.h[1].output.save()
with big.lm_head.output[0, -1].max().backward():
    g = big.transformer.h[0].output.grad.save()
n = 3
"""


def test_a_cell_equals_the_same_cell_on_a_local_copy_and_plain_hooks(big, local):
    there, here = both(big, local, GRADIENT_CELL)
    assert_same(there, here, ["h", "g"])
    assert there["n"] == 3 and there["h"].device.type == "cpu" and there["h"].grad_fn is None
    ids = nbgrad.tokenizer_for(local)(PROMPT, return_tensors="pt").input_ids
    kept = []
    handle = local.transformer.h[1].register_forward_hook(lambda m, a, out: kept.append(out))
    with torch.no_grad():
        local(ids)
    handle.remove()
    assert torch.equal(there["h"], kept[0])
    # the weights and their .grad, read outside a cell, are the local copy's after the same backward pass
    weight = big.transformer.h[0].mlp.c_fc.weight
    assert torch.equal(weight, local.transformer.h[0].mlp.c_fc.weight)
    assert torch.equal(weight.grad, local.transformer.h[0].mlp.c_fc.weight.grad)
    big.zero_grad()
    local.zero_grad(set_to_none=True)
    assert big.transformer.h[0].mlp.c_fc.weight.grad is None
    assert big.call(hooks_there) == 0 and big.call(lambda m, k: m.config.n_layer + k, 1) == len(big.transformer.h) + 1


def test_the_handle_is_the_models_skeleton_and_paths_are_checked_there(big, local):
    assert [n for n, _ in big.named_modules()] == [n for n, _ in local.named_modules()]
    assert all(p.device.type == "meta" for p in big.skeleton.parameters())
    sent = len(big.stats())
    with pytest.raises(nbgrad.ModulePathError) as there:
        nbgrad.trace(big, "Hi", "x = 1\ny = big.transformer.h[12].output.save()\n", {"big": big})
    with pytest.raises(nbgrad.ModulePathError) as here:
        nbgrad.trace(local, "Hi", "x = 1\ny = big.transformer.h[12].output.save()\n", {"big": local})
    assert str(there.value) == str(here.value) and "line 2" in str(there.value)
    scanned = nbgrad.scan(big, PROMPT, GRADIENT_CELL, {"big": big})        # from the skeleton Ray brought
    assert scanned == nbgrad.scan(local, PROMPT, GRADIENT_CELL, {"big": local}) and set(scanned) == {"h", "g"}
    assert len(big.stats()) == sent                     # neither was sent


def test_the_sidebar_lists_the_handle_as_remote_from_its_skeleton(big, local, monkeypatch):
    from nbgrad.notebook.comm import models_in

    def asked(*args, **kwargs):
        raise AssertionError("the sidebar waited for an answer from the actor")
    monkeypatch.setattr(ray, "get", asked)
    [entry] = models_in({"big": big})
    monkeypatch.undo()
    assert entry["remote"] is True and entry["where"] == f"actor pid {big.pid} on {big.node}"
    assert big.node == ray.util.get_node_ip_address() and big.pid != os.getpid()
    assert entry["total"] == sum(p.numel() for p in local.parameters()) and entry["family"] == "gpt2"


def test_other_cell_forms_equal_local(big, local):
    invokes = ("with invoke('The Eiffel Tower is in the city of'):\n"
               "    clean = big.transformer.h[1].output[:, -1].save()\n"
               "with invoke('The Colosseum is in'):\n"
               "    big.transformer.h[1].output[:, -1] = clean\n"
               "    patched = big.lm_head.output[:, -1].save()\n")
    assert_same(*both(big, local, invokes, input=None), ["clean", "patched"])
    there, here = both(big, local, "c = cache('transformer.h.*')\nbig.transformer.h[0].mlp.output[:] = 0\n"
                                   "logits = big.lm_head.output.save()\n")
    assert list(there["c"]) == list(here["c"]) and all(equal(there["c"][k], here["c"][k]) for k in here["c"])
    assert_same(there, here, ["logits"])
    site = "p = big.transformer.h[0].attn.source.attention_interface_1.output[0].save()\n"
    assert_same(*both(big, local, site), ["p"])
    skip = "big.transformer.h[0].mlp.skip(big.transformer.h[0].ln_2.output)\nout = big.lm_head.output.save()\n"
    assert_same(*both(big, local, skip), ["out"])
    assert_same(*both(big, local, "h = big.transformer.h[0].output.save()\nstop()\n"), ["h"])
    prompts = ["The Eiffel Tower is in", "Hi", "A longer prompt about several things"]
    body = "last = big.transformer.h[1].output[:, -1].save()\nbig.lm_head.output[:, -1].max().backward()\n" \
           "g = big.transformer.h[0].output.grad[:, -1].save()\n"
    there, here = {"big": big}, {"big": local}
    nbgrad.trace(big, None, body, there, over=prompts, batch_size=2)
    nbgrad.trace(local, None, body, here, over=prompts, batch_size=2)
    assert len(there["last"]) == 3 and equal(there["last"], here["last"]) and equal(there["g"], here["g"])
    big.zero_grad()
    local.zero_grad(set_to_none=True)
    steer = "if step >= 1:\n    big.transformer.h[0].output[:] *= 0.5\ntop = big.lm_head.output[:, -1].argmax(-1).save()\n"
    there, here = {"big": big}, {"big": local}
    remote_run = nbgrad.generate(big, PROMPT, steer, there, max_new_tokens=3)
    local_run = nbgrad.generate(local, PROMPT, steer, here, max_new_tokens=3)
    assert torch.equal(remote_run.output, local_run.output)
    assert all(torch.equal(a, b) for a, b in zip(there["top"], here["top"])) and len(there["top"]) == 3


def test_errors_come_back_as_the_local_cells_own(big, local):
    source = "x = 1\ny = big.transformer.h[1].output.foo()\n"
    with pytest.raises(AttributeError, match="'Tensor' object has no attribute 'foo'") as there:
        nbgrad.trace(big, "Hi", source, {"big": big})
    frames = [(frame.f_code.co_filename, line) for frame, line in __import__("traceback").walk_tb(there.value.__traceback__)]
    assert frames[-1][0].startswith("<nbgrad-cell-") and frames[-1][1] == 2
    sent = len(big.stats())
    lock = threading.Lock()
    with pytest.raises(nbgrad.NbgradError, match="the name `lock` .*cannot be pickled"):
        nbgrad.trace(big, "Hi", "y = big.transformer.h[1].output.save()\nz = lock\n", {"big": big, "lock": lock})
    assert len(big.stats()) == sent                     # nothing was sent
    assert big.call(hooks_there) == 0
    namespace = {"big": big}
    nbgrad.trace(big, "Hi", "y = big.transformer.h[1].output.save()\n", namespace)
    assert namespace["y"].shape[-1] == local.config.n_embd


def test_weights_never_travel(big):
    cell, moved, least = one_read_traffic(big, PROMPT)
    assert least <= moved <= 2 * least, cell
    assert moved < big.weight_bytes / 100


def test_an_interrupt_stops_the_remote_run_and_leaves_the_model_clean(big):
    endless = ("h = big.transformer.h[0].output\nwhile True:\n    pass\n"
               "big.transformer.h[1].output[:] = h\n")
    before = big.call(model_state)

    def interrupt_when_running():
        deadline = time.monotonic() + 60
        while big.call(hooks_there) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        _thread.interrupt_main()

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    namespace = {"big": big}
    with pytest.raises(KeyboardInterrupt):
        nbgrad.trace(big, PROMPT, endless, namespace)
    assert big.call(hooks_there) == 0 and "h" not in namespace
    after = big.call(model_state)
    assert after[:3] == before[:3]
    nbgrad.trace(big, "Hi", "y = big.transformer.h[1].output.save()\n", namespace)
    assert "y" in namespace


def test_the_magic_runs_a_cell_on_the_handle(big, local, shell):
    shell.user_ns["big"] = big
    shell.run_cell(f'%%trace big "{PROMPT}" -q\nh = big.transformer.h[1].output.save()\n', store_history=False)
    here = {"big": local}
    nbgrad.trace(local, PROMPT, "h = big.transformer.h[1].output.save()\n", here)
    assert torch.equal(shell.user_ns.pop("h"), here["h"])
    shell.user_ns.pop("big")


def test_attribution_runs_on_the_actor_and_equals_local(big, local):
    there = nbgrad.attribute(big, PROMPT, " Paris", method="ig", steps=8, batch_size=4)
    here = nbgrad.attribute(local, PROMPT, " Paris", method="ig", steps=8, batch_size=4)
    assert torch.equal(there.scores, here.scores) and list(there.labels) == list(here.labels)
    assert there.delta == here.delta

    def metric(logits):
        return logits[0, -1, 5] - logits[0, -1, 7]

    clean = nbgrad.tokenizer_for(local)(PROMPT, return_tensors="pt").input_ids
    corrupt = clean.clone()
    corrupt[0, 3] = clean[0, 5]                           # one token changed: the same length
    there = nbgrad.attribution_patching(big, clean, corrupt, metric, sites="transformer.h.*", positions=False)
    here = nbgrad.attribution_patching(local, clean, corrupt, metric, sites="transformer.h.*", positions=False)
    assert torch.equal(there.scores, here.scores) and list(there.labels) == list(here.labels)
    assert there.scores.shape[0] == len(there.labels) > len(local.transformer.h)
    assert big.call(hooks_there) == 0


def test_backward_of_a_loss_a_remote_cell_saved_runs_on_the_actor(big, local, shell):
    big.zero_grad()
    local.zero_grad(set_to_none=True)
    shell.user_ns["big"] = big
    shell.run_cell(f'%%trace big "{PROMPT}" -q\n{LOSS_CELL}', store_history=False)
    shell.run_cell("%%backward loss -q\ng = h.grad.save()\n", store_history=False)
    here = {"big": local}
    nbgrad.trace(local, PROMPT, LOSS_CELL, here)
    nbgrad.backward(here["loss"], "g = h.grad.save()\n", here)
    assert torch.equal(shell.user_ns["g"], here["g"]) and shell.user_ns["g"].abs().sum() > 0
    assert torch.equal(big.transformer.h[1].mlp.c_proj.weight.grad, local.transformer.h[1].mlp.c_proj.weight.grad)
    assert big.call(hooks_there) == 0
    for name in ("big", "h", "loss", "g"):
        shell.user_ns.pop(name)
    big.zero_grad()
    local.zero_grad(set_to_none=True)


def test_canonical_names_and_out_on_the_handle_equal_local(big, local, tmp_path):
    source = "r = big.layers[0].resid_post.save()\np = big.layers[1].attn.pattern.save()\n"
    assert_same(*both(big, local, source), ["r", "p"])
    body = "last = big.layers[1].resid_post[:, -1].save()\n"
    prompts = ["The Eiffel Tower is in", "Hi", "A longer prompt about several things"]
    there, here = {"big": big}, {"big": local}
    nbgrad.trace(big, None, body, there, over=iter(prompts), batch_size=2, out=tmp_path / "acts")
    nbgrad.trace(local, None, body, here, over=prompts, batch_size=2)
    assert equal(list(there["last"]), here["last"]) and len(here["last"]) == 3
    assert sorted(p.name for p in (tmp_path / "acts").iterdir()) == [
        "batch-00000000.safetensors", "batch-00000002.safetensors", "index.json"]     # written here


def tiny_model():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)).eval()


ANOTHER_NOTEBOOK = """
import os, ray, nbgrad
from test_remote import ENV, tiny_model
ray.init(address=%r, logging_level="ERROR", runtime_env={"env_vars": ENV})
shared = nbgrad.remote(tiny_model, name="nbgrad-test-shared", num_gpus=0, resources={"remote_slot": 1},
                       runtime_env={"env_vars": {**ENV, "NBGRAD_MARK": "factory"}})
shared.call(lambda model: setattr(model, "nbgrad_mark", 41))
print("pid", shared.pid)
"""


def placement(model) -> tuple:
    context = ray.get_runtime_context()
    return context.get_assigned_resources(), os.environ.get("NBGRAD_MARK"), context.get_actor_name()


def test_a_named_actor_from_a_factory_outlives_its_notebook_and_another_attaches(big):
    # Another notebook (a process of its own, a Ray job of its own) makes a named actor from a factory, with Ray
    # options, and ends; this one attaches by name and finds the same model, placed as asked
    address = ray.get_runtime_context().gcs_address           # this cluster's, not another one on the machine
    made = subprocess.run([sys.executable, "-c", ANOTHER_NOTEBOOK % address], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **ENV})
    assert made.returncode == 0, made.stderr[-2000:]
    try:
        shared = nbgrad.remote(name="nbgrad-test-shared")
        assert f"pid {shared.pid}" in made.stdout and shared.call(lambda m: m.nbgrad_mark) == 41
        resources, mark, name = shared.call(placement)
        assert resources.get("remote_slot") == 1 and "GPU" not in resources and mark == "factory"
        assert name == "nbgrad-test-shared" and big.call(placement)[2] != name
        ids, source = torch.tensor([[1, 5, 9, 3]]), ("h = m.transformer.h[1].output.save()\n"
                                                   "with m.lm_head.output[0, -1].max().backward():\n"
                                                   "    g = m.transformer.h[0].output.grad.save()\n")
        there, here = {"m": shared}, {"m": tiny_model()}
        nbgrad.trace(shared, ids, source, there)
        nbgrad.trace(here["m"], ids, source, here)
        assert_same(there, here, ["h", "g"])
        with pytest.raises(nbgrad.NbgradError, match="attached to a named model that another notebook made"):
            shared.restart()
    finally:
        ray.kill(ray.get_actor("nbgrad-test-shared", namespace="nbgrad"))


def test_a_killed_actor_is_a_clear_error_and_restart_recovers(big, local):
    ray.kill(big._actor)
    with pytest.raises(nbgrad.NbgradError, match=r"actor is gone .*`the handle.restart\(\)` starts a new one"):
        nbgrad.trace(big, "Hi", "y = big.transformer.h[1].output.save()\n", {"big": big})
    old, namespace = big.pid, {"big": big}
    big.restart()
    assert big.pid != old
    nbgrad.trace(big, PROMPT, LOSS_CELL, namespace)
    big.restart()
    with pytest.raises(nbgrad.NbgradError, match="on an actor that has since been restarted"):
        nbgrad.backward(namespace["loss"], "", namespace)
    assert_same(*both(big, local, "h = big.transformer.h[1].output.save()\n"), ["h"])
