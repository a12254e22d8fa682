"""`nbgrad.remote(...)` through a Ray client (`ray.init("ray://127.0.0.1:PORT")`), as a notebook off the cluster
connects: the Ray tests' head node (conftest's ray_head, whose client server listens on 127.0.0.1), one actor, every
cell form of tests/test_remote.py equal to a local copy's, and its errors, interrupt and killed actor as there."""
import pytest
import torch

import nbgrad
from nbgrad.datasets.cluster import start_cluster
from test_remote import test_a_killed_actor_is_a_clear_error_and_restart_recovers as killed_actor_recovers
from test_remote import test_an_interrupt_stops_the_remote_run_and_leaves_the_model_clean as interrupted
from test_remote import test_canonical_names_and_out_on_the_handle_equal_local as canonical_names_and_out
from test_remote import test_errors_come_back_as_the_local_cells_own as errors_as_local
from test_remote import test_other_cell_forms_equal_local as other_cell_forms

ray = pytest.importorskip("ray")
PROMPT = "The Eiffel Tower is in the city of"


# How long the client and its server wait for a broken data channel to come back before the server ends the
# session (the client sends it as it connects; 30 s unless set). On this project's busy two-core machine the channel
# once broke and came back later than that, and every later request failed ("Attempted to reconnect a session that has
# already been cleaned up"). Not much longer: a connect the server fails (its client server once died as it started)
# holds `ray.init` that long before start_cluster can try again, and three tries must end within the test's timeout
RECONNECT_GRACE_S = "90"


@pytest.fixture(scope="module")
def big(ray_head):
    with pytest.MonkeyPatch.context() as patch:       # given back as the client has connected, or failed to
        patch.setenv("RAY_CLIENT_RECONNECT_GRACE_PERIOD", RECONNECT_GRACE_S)     # read as the client connects
        start_cluster(attempts=3, address=ray_head.client_address, logging_level="ERROR")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield nbgrad.remote()
    finally:
        torch.set_num_threads(threads)
        ray.shutdown()


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


def test_an_interrupt_through_a_ray_client_stops_the_remote_run_and_leaves_the_model_clean(big):
    assert ray.util.client.ray.is_connected()
    interrupted(big)


def test_a_killed_actor_through_a_ray_client_is_a_clear_error_and_restart_recovers(big, local):
    killed_actor_recovers(big, local)
