"""`--engine ray`: the same cell on a local two-worker Ray cluster gives what `--engine local` gives, and
the work runs in the workers' processes. The Ray tests' head node (conftest's ray_head), connected to for the module."""
import gc
import os
import threading
from pathlib import Path

import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2
from nbgrad.datasets import ray_engine
from test_over_errors import frames_from_the_cell, raised_by_second
from nbgrad.datasets.cluster import start_cluster

ray = pytest.importorskip("ray")

PROMPTS = ["The Eiffel Tower is in", "Hi", "A longer prompt about several things", "Paris", "x y z"]
BODY = """
last = model.transformer.h[1].output[:, -1].save()
grad = model.transformer.h[0].output.grad[:, -1].save()
model.lm_head.output[:, -1].max().backward()
pid = nbgrad.save(torch.tensor(os.getpid()))
"""


@pytest.fixture(scope="module")
def cluster(ray_head):
    # Workers import nbgrad as this process does: the working tree first, when the tests run from it.
    tests = Path(__file__).resolve().parent
    start_cluster(attempts=3, address=ray_head.address, logging_level="ERROR",
                  runtime_env={"env_vars": {"PYTHONPATH": f"{tests.parent}:{tests}", "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


def no_model():
    raise RuntimeError("this run was to compute nothing")


def namespace_for(model):
    return {"model": model, "torch": torch, "nbgrad": nbgrad, "os": os}


def test_ray_with_two_workers_equals_local_and_runs_in_the_workers(cluster, default_model, tmp_path):
    model = default_model
    local = namespace_for(model)
    nbgrad.trace(model, None, BODY, local, over=PROMPTS, batch_size=2)
    on_ray = namespace_for(model)
    nbgrad.trace(model, None, BODY, on_ray, over=PROMPTS, batch_size=2, engine="ray", workers=2)
    model.zero_grad(set_to_none=True)
    for name in ("last", "grad"):
        assert len(on_ray[name]) == len(PROMPTS)
        for here, there in zip(local[name], on_ray[name]):
            torch.testing.assert_close(there, here, atol=1e-5, rtol=1e-4)
    pids = {int(pid) for pid in on_ray["pid"]}
    assert os.getpid() not in pids and len(pids) == 2          # both workers, neither of them this process
    assert {int(pid) for pid in local["pid"]} == {os.getpid()}
    # --out with ray: the notebook writes, and a second run computes nothing: its workers could not even
    # build a model, and none is asked to
    first = namespace_for(model)
    nbgrad.trace(model, None, BODY, first, over=PROMPTS, batch_size=2, engine="ray", out=tmp_path)
    assert sorted(p.name for p in tmp_path.glob("batch-*")) == [f"batch-{s:08d}.safetensors" for s in (0, 2, 4)]
    again = namespace_for(model)
    nbgrad.trace(model, None, BODY, again, over=PROMPTS, batch_size=2, engine="ray", out=tmp_path,
                 model_factory=no_model)
    model.zero_grad(set_to_none=True)
    assert [int(p) for p in again["pid"]] == [int(p) for p in first["pid"]]
    for here, there in zip(local["last"], again["last"]):
        torch.testing.assert_close(there, here, atol=1e-5, rtol=1e-4)


def test_a_model_factory_builds_the_workers_model(cluster):
    model = tiny_gpt2(n_layer=2, seed=3)
    ids = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6]])]
    body = "h = model.transformer.h[1].output[:, -1].save()\n"
    local, on_ray = {"model": model}, {"model": model}
    nbgrad.trace(model, None, body, local, over=ids, batch_size=1)
    with pytest.raises(nbgrad.NbgradError, match="not loaded by nbgrad.load_model.*--model-factory"):
        nbgrad.trace(model, None, body, on_ray, over=ids, engine="ray")
    nbgrad.trace(model, None, body, on_ray, over=ids, batch_size=1, engine="ray", workers=1,
                 model_factory=lambda: tiny_gpt2(n_layer=2, seed=3))
    for here, there in zip(local["h"], on_ray["h"]):
        torch.testing.assert_close(there, here)


def test_an_unpicklable_name_is_an_error_before_anything_runs(cluster, default_model):
    import threading
    model = default_model
    before = model_state(model)
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        namespace = {"model": model, "lock": threading.Lock()}
        with pytest.raises(nbgrad.NbgradError, match="`lock`.*cannot be pickled"):
            nbgrad.trace(model, None, "x = model.transformer.h[0].output.save()\nlock.locked()\n", namespace,
                         over=PROMPTS, engine="ray")
    finally:
        handle.remove()
    assert calls == [] and "x" not in namespace
    assert_clean(model, before)


def test_a_helper_from_an_earlier_cell_runs_on_the_workers(cluster, shell, default_model):
    before = model_state(default_model)
    shell.user_ns.update(model=default_model, prompts=PROMPTS[:3])
    # the helper reads `model` as a global: the cell never names it, and the workers get it all the same
    assert shell.run_cell("def block_out(i):\n    return model.transformer.h[i].output[:, -1].save()").success
    for engine in ("ray", "local"):
        result = shell.run_cell(f"%%trace model --over prompts --batch-size 2 --engine {engine} -q\n"
                                f"out_{engine} = block_out(1)")
        assert result.success, result.error_in_exec
    for there, here in zip(shell.user_ns["out_ray"], shell.user_ns["out_local"]):
        torch.testing.assert_close(there, here, atol=1e-5, rtol=1e-4)
    assert len(shell.user_ns["out_ray"]) == 3
    assert_clean(default_model, before)
    for name in ("block_out", "prompts", "out_ray", "out_local", "model"):
        shell.user_ns.pop(name, None)


def test_an_error_on_a_worker_is_the_bodys_own_at_its_cell_line(cluster, default_model):
    import traceback
    before = model_state(default_model)
    body = "last = model.transformer.h[1].output[:, -1].save()\nif last.shape[0] > 0:\n    raise ValueError('bad')\n"
    namespace = {"model": default_model}
    with pytest.raises(ValueError) as raised:
        nbgrad.trace(default_model, None, body, namespace, over=PROMPTS, batch_size=2, engine="ray", workers=1)
    assert type(raised.value) is ValueError and str(raised.value) == "bad"      # not Ray's wrapping of it
    assert raised.value.__notes__ == ["nbgrad: raised by example 0 (INPUT 'The Eiffel Tower is in'), at line 3 "
                                      "of the cell"]
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert frame.filename.startswith("<nbgrad-cell-") and frame.lineno == 3 and frame.line == "raise ValueError('bad')"
    # an nbgrad error keeps its own message and line
    with pytest.raises(nbgrad.NbgradError, match=r"^line 2: .*model.transformer.h\[9\].*\[in example 0 ") as raised:
        nbgrad.trace(default_model, None, "x = 1\ny = model.transformer.h[9].output.save()\n", namespace,
                     over=PROMPTS, batch_size=2, engine="ray", workers=1)
    assert "last" not in namespace and "y" not in namespace
    assert_clean(default_model, before)


def exit_on_call(counter, calls: int) -> int:
    """Ends the process that calls it for the `calls`-th time (a worker lost mid-run), counting in a file."""
    done = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(done + 1))
    if done + 1 == calls:
        os._exit(1)
    return done


def test_a_lost_worker_stops_the_run_and_the_next_run_computes_only_the_rest(cluster, default_model, tmp_path):
    counter, out = tmp_path / "calls", tmp_path / "acts"
    body = "last = model.transformer.h[1].output[:, -1].save()\nn = exit_on_call(counter, 3)\n"
    namespace = {"model": default_model, "exit_on_call": exit_on_call, "counter": counter}
    with pytest.raises(nbgrad.NbgradError, match=r"the worker running examples 2-3 was lost \(its process ended\), "
                       r"and the run stopped there\. Every batch finished before it is in DIR: run the cell again "
                       r"to compute only the rest") as raised:
        nbgrad.trace(default_model, None, body, namespace, over=PROMPTS, batch_size=2, out=out, engine="ray",
                     workers=1)
    assert isinstance(raised.value.__cause__, ray.exceptions.RayActorError)
    assert sorted(p.name for p in out.glob("batch-*")) == ["batch-00000000.safetensors"]
    nbgrad.trace(default_model, None, body, namespace, over=PROMPTS, batch_size=2, out=out, engine="ray", workers=1)
    assert int(counter.read_text()) == 3 + 3               # a new worker ran the three examples left
    local = {"model": default_model}
    nbgrad.trace(default_model, None, "last = model.transformer.h[1].output[:, -1].save()\n", local, over=PROMPTS)
    for here, there in zip(local["last"], namespace["last"], strict=True):
        torch.testing.assert_close(there, here, atol=1e-5, rtol=1e-4)


def test_an_example_error_is_at_the_same_cell_line_as_local_and_other_batches_print_nothing(cluster, default_model,
                                                                                          capfd):
    """Every batch raises (its second example): the run shows the first, at the cell's line, as the local engine
    does; the other batches' errors are taken, not printed by Ray as unhandled."""
    local, on_ray = raised_by_second(default_model), raised_by_second(default_model, engine="ray", workers=2)
    assert on_ray.__notes__ == local.__notes__ == ["nbgrad: raised by example 1 (INPUT 'Hi'), at line 3 of the cell"]
    here, there = frames_from_the_cell(local)[0], frames_from_the_cell(on_ray)[0]
    assert (there.lineno, there.line) == (here.lineno, here.line) == (3, "check(seen)")
    del on_ray, local
    gc.collect()
    ray.get(ray.put(1))            # a round trip: whatever the dropped results would print has been printed
    assert "Unhandled error" not in capfd.readouterr().err


def test_a_kept_worker_that_died_while_idle_is_replaced_not_blamed(cluster, default_model):
    body = "last = model.transformer.h[1].output[:, -1].save()\npid = nbgrad.save(torch.tensor(os.getpid()))\n"
    first = namespace_for(default_model)
    nbgrad.trace(default_model, None, body, first, over=PROMPTS[:2], engine="ray", workers=1)
    (_, actors, _), = ray_engine._pools.values()
    ray.kill(actors[0])                # dies between runs, while idle
    again = namespace_for(default_model)
    nbgrad.trace(default_model, None, body, again, over=PROMPTS[:2], engine="ray", workers=1)
    assert int(again["pid"][0]) != int(first["pid"][0])         # a fresh worker ran it
    for before, after in zip(first["last"], again["last"], strict=True):
        torch.testing.assert_close(after, before)


def test_every_request_to_the_workers_is_sent_off_the_main_thread(cluster, default_model, monkeypatch):
    """Sending is Ray's code, with its connection's locks, as waiting is: an interrupt must land in nbgrad's wait, not
    there (nbgrad/datasets/waiting.py). The cluster's resources asked, workers made, batches sent, kept workers asked,
    workers killed."""
    from ray.actor import ActorClass, ActorMethod
    sent = []

    def noting(real, what):
        def send(*args, **kwargs):
            sent.append((what(args), threading.current_thread() is threading.main_thread()))
            return real(*args, **kwargs)
        return send
    monkeypatch.setattr(ActorClass, "_remote", noting(ActorClass._remote, lambda args: "make"))
    monkeypatch.setattr(ActorMethod, "_remote", noting(ActorMethod._remote, lambda args: args[0]._method_name))
    monkeypatch.setattr(ray, "kill", noting(ray.kill, lambda args: "kill"))
    monkeypatch.setattr(ray, "cluster_resources", noting(ray.cluster_resources, lambda args: "resources"))
    ray_engine._drop_pools()
    body = "last = model.transformer.h[1].output[:, -1].save()\n"
    for _ in range(2):              # the second run asks its kept worker whether it is alive
        nbgrad.trace(default_model, None, body, namespace_for(default_model), over=PROMPTS[:3], batch_size=1,
                     engine="ray", workers=1)
    ray_engine._drop_pools()
    assert {"resources", "make", "run", "ready", "kill"} <= {what for what, _ in sent}
    assert [what for what, from_main in sent if from_main] == []


def test_canonical_patterns_run_eagerly_on_the_workers_as_in_the_notebook(cluster, default_model):
    model = default_model                  # SDPA attention: patterns need the eager function, here and there
    body = "p = model.layers[1].attn.pattern[:, :, -1].save()\nh = model.layers[1].resid_mid[:, -1].save()"
    local, on_ray = namespace_for(model), namespace_for(model)
    nbgrad.trace(model, None, body, local, over=PROMPTS, batch_size=2)
    nbgrad.trace(model, None, body, on_ray, over=PROMPTS, batch_size=2, engine="ray", workers=2)
    assert model.config._attn_implementation == "sdpa"
    for name in ("p", "h"):
        assert len(on_ray[name]) == len(PROMPTS)
        for here, there in zip(local[name], on_ray[name], strict=True):
            torch.testing.assert_close(there, here, atol=1e-5, rtol=1e-4)
    assert all(torch.allclose(p.sum(-1), torch.ones_like(p.sum(-1))) for p in on_ray["p"])


def processes_naming(folder: str) -> set:
    """The processes whose command line names `folder` (a head's, which all its processes are given)."""
    import psutil
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        if any(folder in part for part in process.info["cmdline"] or []):
            found.add(process.pid)
    return found


def test_a_head_that_does_not_start_in_time_says_so_for_each_try_and_leaves_nothing(monkeypatch):
    """Nothing of this head is left: no process that names its folder, and no folder. Only its own are looked at:
    the other test worker may start a head of its own meanwhile (a CI run once failed so, on a process of that)."""
    import tempfile
    from nbgrad.datasets import head
    made, make = [], tempfile.mkdtemp
    monkeypatch.setattr(head.tempfile, "mkdtemp", lambda **options: made.append(make(**options)) or made[-1])
    with pytest.raises(nbgrad.NbgradError, match=r"did not start in 2 attempts: attempt 1: the head not started in "
                                                 r"1 s: .*; attempt 2: the head not started in 1 s"):
        head.Head(attempts=2, start_s=1)
    (folder,) = made
    assert Path(folder).name.startswith("ray-head-") and not Path(folder).exists()
    assert processes_naming(folder) == set()
