"""An interrupt during a request to a remote model lands in nbgrad's wait, never inside Ray's client code
(nbgrad/datasets/waiting.py). Ray's client holds a lock of its connection while it waits for an answer; an
interrupt raised there at the wrong line left it held, and the run's stop request, then every request after it,
hung for good (seen through a `ray://` client under load). Here a fake `ray.get` waits as that client does:
holding a lock that only a normal return gives back; sending a request is the client's code too, and is done off the
main thread as well. And a request that changes nothing there is sent again when the client's server dropped its
result, as seen after a killed actor."""
import _thread
import importlib
import threading

import pytest
import torch

import nbgrad
from inprocess import in_process_handle
from nbgrad.datasets.waiting import Sending, off_main, send

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


def test_sending_keeps_the_task_of_a_request_for_whoever_stops_it():
    sending = Sending()
    assert send(lambda a, b: ("task", a, b), (1, 2), sending) == ("task", 1, 2)
    assert sending.sent(limit_s=5) == ("task", 1, 2)
    failed = Sending()
    with pytest.raises(ConnectionError, match="no connection"):
        send(lambda: (_ for _ in ()).throw(ConnectionError("no connection")), (), failed)
    assert failed.sent(limit_s=5) is None
    assert Sending().sent(limit_s=5) is None         # never sent (an interrupt came before): no wait past BEGIN_S


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


def sent_from(monkeypatch) -> list:
    """(what, sent from the main thread?) for each request a handle sends, its actor's making and killing too."""
    handle_module = importlib.import_module("nbgrad.remote.handle")      # (nbgrad.remote is the function)
    from inprocess import InProcess, Method
    from nbgrad.remote.actor import ModelHolder
    sent, real_send = [], Method.remote

    def note(what: str) -> None:
        sent.append((what, threading.current_thread() is threading.main_thread()))

    class Holders:
        def options(self, **options):
            return self

        def remote(self, build):
            note("make")
            return InProcess(ModelHolder(build))
    monkeypatch.setattr(Method, "remote",
                        lambda method, *args: (note(method.function.__name__), real_send(method, *args))[1])
    monkeypatch.setattr(handle_module, "holder_class", Holders)
    monkeypatch.setattr(ray, "kill", lambda actor: note("kill"))
    return sent


def test_every_request_of_a_handle_is_sent_off_the_main_thread(monkeypatch):
    """Sending is Ray's client code too, with its connection's locks: an interrupt must not land there either."""
    sent = sent_from(monkeypatch)
    big = in_process_handle(monkeypatch, nbgrad.load_model)
    namespace = {"big": big}
    nbgrad.trace(big, "Hi", "h = big.transformer.h[1].output.save()\n", namespace)
    del namespace["h"]                                      # its copy there is forgotten with the next cell
    nbgrad.trace(big, "Hi", "y = big.transformer.h[1].output.save()\n", namespace)
    big.transformer.wte.weight
    big.call(lambda model: None)
    big.zero_grad()
    big.restart()
    assert [what for what, _ in sent] == ["describe", "run", "forget", "run", "read", "call", "zero_grad", "kill",
                                         "make", "describe"]
    assert [what for what, from_main in sent if from_main] == []


def test_an_interrupt_as_a_cell_is_sent_lands_in_the_wait_and_stops_the_run_once_sent(monkeypatch):
    """The interrupt reaches the notebook; the request, sent on untouched, is stopped there once it is sent (here the
    in-process actor has run it whole as it was sent); the connection and the model stay clean."""
    from inprocess import Method
    exchange = importlib.import_module("nbgrad.remote.exchange")
    big, client = in_process_handle(monkeypatch, nbgrad.load_model), ClientLike()
    stops, stopping = [], threading.Event()
    real_send, stop_there = Method.remote, exchange._stop_there
    monkeypatch.setattr(Method, "remote", lambda method, *args: real_send(method, *(
        (client.get(args[0]),) if method.function.__name__ == "run" else args)))
    monkeypatch.setattr(exchange, "_stop_there", lambda *args: (stops.append("stop"), stopping.set(),
                                                                stop_there(*args))[2])
    monkeypatch.setattr(ray, "cancel", lambda task: stops.append("cancel"))
    monkeypatch.setattr(ray, "wait", lambda tasks, timeout=None: (tasks, []))

    def interrupt_then_send():
        if client.entered.wait(30):
            _thread.interrupt_main()
            if stopping.wait(30):           # the interrupt has reached the notebook's wait, which stops the run
                client.answer_now.set()
    threading.Thread(target=interrupt_then_send, daemon=True).start()
    namespace = {"big": big}
    with pytest.raises(KeyboardInterrupt):
        nbgrad.trace(big, "Hi", "h = big.transformer.h[1].output.save()\n", namespace)
    assert client.broken_in == [] and stops == ["stop", "cancel"] and "h" not in namespace
    assert big.call(lambda model: sum(len(m._forward_hooks) for m in model.modules())) == 0
    client.entered.clear()
    nbgrad.trace(big, "Hi", "y = big.transformer.h[1].output.save()\n", namespace)
    here = {"big": nbgrad.load_model()}
    nbgrad.trace(here["big"], "Hi", "y = big.transformer.h[1].output.save()\n", here)
    assert torch.equal(namespace["y"], here["y"])


@pytest.mark.parametrize("named", [False, True])
def test_an_interrupt_while_a_remote_model_is_made_kills_its_new_actor_unless_it_is_named(monkeypatch, named):
    """`nbgrad.remote(...)` waits for its new actor to build the model and describe it; interrupted there, no handle
    comes back, so nothing would reach that actor, which would hold the model until the notebook let go of the
    interrupt's traceback: it is killed. A named actor stays: `get_if_exists` may have found another notebook's."""
    from nbgrad.remote.handle import RemoteModel
    sent, client = sent_from(monkeypatch), ClientLike()
    monkeypatch.setattr(ray, "get", client.get)
    interrupt_once_waiting(client)
    options = {"name": "big", "namespace": "nbgrad", "lifetime": "detached", "get_if_exists": True} if named else {}
    with pytest.raises(KeyboardInterrupt):
        RemoteModel(nbgrad.load_model, options)
    client.answer_now.set()                            # the describe there ends (its answer is let go)
    assert sent == [("make", False), ("describe", False)] + ([] if named else [("kill", False)])
