"""`start_cluster` counts a start only once the cluster answers a first request: a `ray://` client whose data
channel dies as it opens (its session cleaned up on the server) is shut down and connected again, and every
failure is said at the end. An interrupt ends what the start had started (a local cluster's processes, a head's
process session) and reaches the notebook at once. Ray's own functions are replaced here, so no cluster starts."""
import signal
import subprocess
import sys
from pathlib import Path

import psutil
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


# A stand-in for what a start leaves running (a GCS, a raylet): it says "ready" once it ignores SIGTERM, as some of
# Ray's processes did for the 10 s they were given, so that only SIGKILL ends it
STUBBORN = "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n" \
           "time.sleep(120)\n"


def _stubborn(**options):
    process = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True, **options)
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.mark.parametrize("where", ["init", "first request"])
def test_an_interrupt_while_a_cluster_starts_ends_what_it_started_and_tries_no_more(fake_ray, monkeypatch, where):
    """Interrupted inside `ray.init` (a local cluster half started) or as the cluster answers: the processes the
    attempt started are ended, SIGKILL after END_GRACE_S where SIGTERM is not enough, the connection is shut down,
    and the interrupt reaches the notebook at once, without a second attempt."""
    started = []
    monkeypatch.setattr(cluster, "END_GRACE_S", 0.5)
    # The attempt's processes are the stand-in alone: the test process may have others (a Ray head of the session,
    # and the workers its raylet starts meanwhile) that are no business of this test
    monkeypatch.setattr(cluster, "_children", lambda: {process.pid for process in started})

    def init(**options):
        fake_ray.append(("init", options))
        started.append(_stubborn())
        if where == "init":
            raise KeyboardInterrupt

    def put(value):
        raise KeyboardInterrupt
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "put", put)
    with pytest.raises(KeyboardInterrupt):
        cluster.start_cluster(attempts=3, pause_s=0, num_cpus=2)
    assert fake_ray == [("init", {"num_cpus": 2}), ("shutdown",)]
    (process,) = started
    assert not psutil.pid_exists(process.pid)          # ended (by SIGKILL: it ignores SIGTERM), and reaped: no zombie


def test_an_interrupt_while_a_head_starts_ends_its_session_and_folder(monkeypatch):
    """`Head` (docs/ray-clusters.md) interrupted as it waits for its node: the head's process session is ended and
    its folder removed before the interrupt is raised, as after a failed start."""
    from nbgrad.datasets import head
    monkeypatch.setattr(head, "END_GRACE_S", 0.5)
    made = []

    def start(self, *args):
        self.process = _stubborn(start_new_session=True)
        made.append((self, self.process))
        raise KeyboardInterrupt
    monkeypatch.setattr(head.Head, "_start", start)
    with pytest.raises(KeyboardInterrupt):
        head.Head(attempts=3)
    ((started, process),) = made          # one attempt only
    assert process.poll() == -signal.SIGKILL and head._session_members(process.pid) == []
    assert started.process is None and not Path(started.folder).exists()
