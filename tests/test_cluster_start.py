"""`start_cluster` counts a start only once the cluster answers a first request: a `ray://` client whose data
channel dies as it opens (its session cleaned up on the server) is shut down and connected again, and every
failure is said at the end. Ray's own functions are replaced here, so no cluster starts."""
import pytest

import nbgrad
from nbgrad.datasets import cluster

ray = pytest.importorskip("ray")
GONE = "Request can't be sent because the Ray client has already been disconnected due to an error."


@pytest.fixture
def fake_ray(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "init", lambda **options: calls.append(("init", options)))
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append(("shutdown",)))
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    return calls


def test_a_client_whose_first_request_fails_is_connected_again(fake_ray, monkeypatch):
    answers = [ConnectionError(GONE), "ref"]

    def put(value):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(ray, "put", put)
    cluster.start_cluster(attempts=3, pause_s=0, address="ray://127.0.0.1:1")
    assert fake_ray == [("init", {"address": "ray://127.0.0.1:1"}), ("shutdown",),
                        ("init", {"address": "ray://127.0.0.1:1"})]


def test_a_cluster_that_never_answers_says_each_failure(fake_ray, monkeypatch):
    def put(value):
        raise ConnectionError(GONE)
    monkeypatch.setattr(ray, "put", put)
    with pytest.raises(nbgrad.NbgradError) as caught:
        cluster.start_cluster(attempts=2, pause_s=0, address="ray://127.0.0.1:1")
    assert str(caught.value) == (f"could not start or reach a Ray cluster with ray.init(address='ray://127.0.0.1:1') in "
                                 f"2 attempts: attempt 1: ConnectionError: {GONE}; attempt 2: ConnectionError: {GONE}")
    assert [call[0] for call in fake_ray] == ["init", "shutdown", "init", "shutdown"]
