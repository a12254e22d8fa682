"""An interrupt during a request to a remote model lands in nbgrad's wait, never inside Ray's client code
(nbgrad/datasets/waiting.py). Ray's client holds a lock of its connection while it waits for an answer; an
interrupt raised there at the wrong line left it held, and the run's stop request, then every request after it,
hung for good (seen through a `ray://` client under load). Here a fake `ray.get` waits as that client does:
holding a lock that only a normal return gives back."""
import _thread
import threading

import pytest

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
