"""An interrupt during a request to a remote model lands in nbgrad's wait, never inside Ray's client code
(nbgrad/datasets/waiting.py). Ray's client holds a lock of its connection while it waits for an answer; an
interrupt raised there at the wrong line left it held, and the run's stop request, then every request after it,
hung for good (seen through a `ray://` client under load). Here a fake `ray.get` waits as that client does:
holding a lock that only a normal return gives back. And a request that changes nothing there is sent again when
the client's server dropped its result, as seen after a killed actor."""
import _thread
import threading

import pytest
import torch

import nbgrad
from inprocess import in_process_handle
from nbgrad.datasets.waiting import off_main

ray = pytest.importorskip("ray")


class ClientLike:
    """`ray.get` as a client connection waits: its lock is taken, Python code polls for the answer, the lock is
    given back after. An exception raised in the poll leaves the lock held (what the client's code allows)."""

    def __init__(self):
        self.lock, self.entered, self.answer_now = threading.Lock(), threading.Event(), threading.Event()
        self.broken_in = []

    def get(self, answer):
        if not self.lock.acquire(timeout=10):
            raise AssertionError("the connection's lock is still held: this request would hang")
        self.entered.set()
        try:
            while not self.answer_now.wait(0.01):
                pass
        except BaseException as error:
            self.broken_in.append(threading.current_thread().name)
            raise
        self.lock.release()
        return answer


def interrupt_once_waiting(client: ClientLike) -> None:
    def interrupt():
        if client.entered.wait(30):
            _thread.interrupt_main()
    threading.Thread(target=interrupt, daemon=True).start()


def test_an_interrupt_while_a_request_waits_leaves_the_connection_usable(monkeypatch):
    big = in_process_handle(monkeypatch, nbgrad.load_model)
    client = ClientLike()
    monkeypatch.setattr(ray, "get", client.get)
    interrupt_once_waiting(client)
    with pytest.raises(KeyboardInterrupt):
        big.call(lambda model: model.transformer.wte.weight.shape)
    assert client.broken_in == []                      # the wait there went on, untouched
    client.answer_now.set()                            # its answer comes; the lock is given back
    client.entered.clear()
    assert big.call(lambda model: model.transformer.wte.weight.shape) == big.skeleton.transformer.wte.weight.shape


def test_off_main_gives_the_value_and_raises_the_error_of_the_call():
    assert off_main(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ValueError, match="from the call"):
        off_main(lambda: (_ for _ in ()).throw(ValueError("from the call")))


def test_off_main_ends_its_wait_at_the_limit_and_runs_a_call_from_another_thread_in_that_thread():
    never = threading.Event()
    assert off_main(never.wait, limit_s=0.2) is None
    names = []
    thread = threading.Thread(target=lambda: names.append(off_main(lambda: threading.current_thread().name)),
                              name="a notebook's own thread")
    thread.start()
    thread.join(30)
    assert names == ["a notebook's own thread"]


def dropped_once(monkeypatch, message: str) -> list:
    """`ray.get` that fails its first request with `message`, as a client server that dropped it; then answers."""
    failed = []

    def get(answer):
        if not failed:
            failed.append(message)
            raise ValueError(message)
        return answer
    monkeypatch.setattr(ray, "get", get)
    return failed


def counting(big, name: str, calls: list) -> None:
    """Each time the actor's `name` runs, `calls` gets its name."""
    method = getattr(big._actor.holder, name)
    setattr(big._actor.holder, name, lambda *args: (calls.append(name), method(*args))[1])


def test_a_request_that_changes_nothing_is_sent_again_when_the_client_server_dropped_its_result(monkeypatch):
    """Seen through a `ray://` client under load, after a killed actor: `restart()`'s first request failed with
    "ClientObjectRef ... is not found for client ...". A request that changes nothing there is sent again."""
    big, calls = in_process_handle(monkeypatch, nbgrad.load_model), []
    counting(big, "read", calls)
    counting(big, "call", calls)
    dropped = "ClientObjectRef b'\\x18t' is not found for client ec6772c8"
    assert dropped_once(monkeypatch, dropped) == []
    weight = big.read("transformer.wte.weight")
    assert torch.equal(weight, nbgrad.load_model().transformer.wte.weight) and calls == ["read", "read"]
    calls.clear()
    dropped_once(monkeypatch, dropped)
    with pytest.raises(nbgrad.NbgradError) as caught:        # `call` runs the user's function: sent once
        big.call(lambda model: None)
    assert str(caught.value) == (
        "the cluster's client server dropped the answer to this request: the notebook's connection to it broke and "
        f"came back (Ray: {dropped}). The request may have run on the actor, and a cell's edits of the model with it; "
        "run it again, or `the handle.restart()` to start afresh")
    assert calls == ["call"]
    calls.clear()
    dropped_once(monkeypatch, "some other error")
    with pytest.raises(ValueError, match="some other error"):
        big.read("transformer.wte.weight")
    assert calls == ["read"]
