"""`nbgrad.remote(...)`: a model held by a Ray actor runs the same cells as a local copy of it, bit for bit on
CPU; what travels is the cell and its values, never the weights. One local cluster and one actor for the
module (Ray starts slowly on a busy machine); the last test kills the actor and restarts it."""
import _thread
import os
import threading
import time
from pathlib import Path

import pytest
import torch

import nbgrad
from helpers import model_state
from nbgrad.datasets.cluster import start_cluster

ray = pytest.importorskip("ray")
PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture(scope="module")
def big():
    # The actor imports nbgrad as this process does: the working tree first. One thread there and here while
    # a test compares values, so that sums are done in the same order (bit-equal results)
    tests = Path(__file__).resolve().parent
    start_cluster(attempts=5, num_cpus=2, include_dashboard=False, logging_level="ERROR", runtime_env={
        "env_vars": {"PYTHONPATH": f"{tests.parent}:{tests}", "OMP_NUM_THREADS": "1"}})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield nbgrad.remote()
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
    source = "h = big.transformer.h[1].output.save()\n"
    namespace = {"big": big}
    nbgrad.trace(big, PROMPT, source, namespace)
    cell = big.stats()[-1]
    moved = cell["sent"] + cell["received"]
    least = namespace["h"].numel() * namespace["h"].element_size() + len(source.encode())
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


def test_a_killed_actor_is_a_clear_error_and_restart_recovers(big, local):
    ray.kill(big._actor)
    with pytest.raises(nbgrad.NbgradError, match=r"actor is gone .*`the handle.restart\(\)` starts a new one"):
        nbgrad.trace(big, "Hi", "y = big.transformer.h[1].output.save()\n", {"big": big})
    old = big.pid
    big.restart()
    assert big.pid != old
    assert_same(*both(big, local, "h = big.transformer.h[1].output.save()\n"), ["h"])
