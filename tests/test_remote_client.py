"""`nbgrad.remote(...)` through a Ray client (`ray.init("ray://...")`), as a notebook off the cluster connects:
a head node of this test's own (started with a client server on 127.0.0.1, stopped by its process), one actor,
every cell form of tests/test_remote.py equal to a local copy's."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

import nbgrad
from nbgrad.datasets.cluster import start_cluster
from test_remote import test_canonical_names_and_out_on_the_handle_equal_local as canonical_names_and_out
from test_remote import test_errors_come_back_as_the_local_cells_own as errors_as_local
from test_remote import test_other_cell_forms_equal_local as other_cell_forms

ray = pytest.importorskip("ray")
PROMPT = "The Eiffel Tower is in the city of"
HEAD_ATTEMPTS = 3
HEAD_START_S = 180


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_head(folder: str, env: dict) -> tuple:
    """(the `ray start --block` process, client port), once the head says it started; tried HEAD_ATTEMPTS
    times, each failure said."""
    failures = []
    for attempt in range(HEAD_ATTEMPTS):
        port, client = free_port(), free_port()
        head = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
             f"--port={port}", f"--ray-client-server-port={client}", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats", f"--temp-dir={folder}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: list = []
        threading.Thread(target=lambda: lines.extend(head.stdout), daemon=True).start()
        deadline = time.monotonic() + HEAD_START_S
        while head.poll() is None and time.monotonic() < deadline and not any("Ray runtime started" in line
                                                                              for line in lines):
            time.sleep(0.5)
        if head.poll() is None and any("Ray runtime started" in line for line in lines):
            start_cluster(attempts=3, address=f"ray://127.0.0.1:{client}", logging_level="ERROR")
            return head, client
        failures.append(f"attempt {attempt + 1} ({'ended' if head.poll() is not None else 'still starting'}): "
                        + "".join(lines[-5:]))
        stop_head(head)
    pytest.fail("the head node with a client server did not start: " + "; ".join(failures))


def stop_head(head) -> None:
    os.killpg(head.pid, signal.SIGTERM)        # its own session: the head and what it started
    try:
        head.wait(timeout=60)       # the head ends the processes it started
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()


@pytest.fixture(scope="module")
def big():
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": f"{tests.parent}:{tests}", "OMP_NUM_THREADS": "1"}
    folder = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    head, _ = start_head(folder, env)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield nbgrad.remote()
    finally:
        torch.set_num_threads(threads)
        ray.shutdown()
        stop_head(head)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_cell_through_a_ray_client_equals_local(big):
    assert ray.util.client.ray.is_connected()
    local = nbgrad.load_model()
    source = ("h = big.transformer.h[1].output.save()\n"
              "with big.lm_head.output[0, -1].max().backward():\n    g = big.transformer.h[0].output.grad.save()\n")
    there, here = {"big": big}, {"big": local}
    nbgrad.trace(big, PROMPT, source, there)
    nbgrad.trace(local, PROMPT, source, here)
    assert torch.equal(there["h"], here["h"]) and torch.equal(there["g"], here["g"])
    assert torch.equal(big.transformer.h[0].mlp.c_fc.weight.grad, local.transformer.h[0].mlp.c_fc.weight.grad)
    with pytest.raises(AttributeError, match="'Tensor' object has no attribute 'foo'"):
        nbgrad.trace(big, "Hi", "x = 1\ny = big.transformer.h[1].output.foo()\n", {"big": big})
    assert big.call(lambda m: sum(len(x._forward_hooks) for x in m.modules())) == 0


@pytest.fixture(scope="module")
def local():
    return nbgrad.load_model()


def test_every_cell_form_through_a_ray_client_equals_local(big, local, tmp_path):
    """Invokes, cache, a site, skip, stop(), --over, generation, canonical names, --out and errors: the same
    checks as on the local cluster (tests/test_remote.py), through the client."""
    other_cell_forms(big, local)
    canonical_names_and_out(big, local, tmp_path)
    errors_as_local(big, local)
    assert big.call(lambda m: sum(len(x._forward_hooks) for x in m.modules())) == 0
