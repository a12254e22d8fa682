"""The Ray actor that holds a remote model: it builds the model once, and runs on it the cells the notebook
sends, with nbgrad's own engine, as a local notebook would. What it returns goes back as one cloudpickled blob
(its size is what `stats()` counts), tensors on CPU."""
from __future__ import annotations

import ctypes
import itertools
import threading

class ModelHolder:
    """One model, built once, and what the notebook asks of it. Threaded (two at a time), so that `interrupt`
    reaches a cell while it runs."""

    def __init__(self, build):
        from ..models.cell import model_to_trace
        self.model, self.tokenizer = model_to_trace(build(), note=False)
        self.modules = dict(self.model.named_modules())
        self.lock, self.running = threading.Lock(), None
        self.kept: dict = {}          # number -> a tensor a cell bound, with its graph, while the notebook holds its copy
        self.numbers = itertools.count(1)

    def describe(self) -> bytes:
        """(skeleton, tokenizer, parameter bytes, pid, the node's address), pickled."""
        import os
        import ray
        from ray import cloudpickle
        from .skeleton import skeleton_of
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return cloudpickle.dumps((skeleton_of(self.model), self.tokenizer, weights, os.getpid(),
                                  ray.util.get_node_ip_address()))

    def run(self, request: bytes) -> bytes:
        """A cell: `request` is cloudpickle of (kind, source, shipped names, INPUT, options); the answer is
        cloudpickle of ("done", values) or ("error", error, cell line)."""
        from ray import cloudpickle
        from .running import run_request, failure
        with self.lock:
            self.running = threading.get_ident()
        try:
            try:
                outcome = run_request(self, *cloudpickle.loads(request))
            except BaseException as error:       # the cell's error, an interrupt included, goes back as it is
                outcome = failure(error)
            finally:
                with self.lock:
                    self.running = None
        except KeyboardInterrupt as error:       # an interrupt that arrived as the cell was ending
            outcome = failure(error)
        return _dumps(outcome)

    def interrupt(self) -> bool:
        """Raise KeyboardInterrupt in the running cell (the engine's clean-up runs as for a local interrupt)."""
        with self.lock:
            if self.running is None:
                return False
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.running), ctypes.py_object(KeyboardInterrupt))
            return True

    def read(self, path: str) -> tuple:
        """A parameter or buffer and its .grad, as CPU copies."""
        module_path, _, name = path.rpartition(".")
        tensor = getattr(self.modules[module_path], name)
        grad = tensor.grad.detach().to("cpu", copy=True) if tensor.grad is not None else None
        return tensor.detach().to("cpu", copy=True), grad

    def call(self, function: bytes) -> bytes:
        from ray import cloudpickle
        from .skeleton import on_cpu
        fn, args, kwargs = cloudpickle.loads(function)
        return _dumps(on_cpu(fn(self.model, *args, **kwargs)))

    def keep(self, bound: dict, copies: dict) -> dict:
        """{number: the copy sent back} for each tensor the cell bound with autograd history: kept here (its graph
        with it) until the notebook's copy is gone, so that `%%backward` of the copy runs here."""
        from .kept import tensors_in
        numbers = {}
        for tensor in tensors_in(bound):
            if tensor.requires_grad and id(tensor) in copies:
                number = next(self.numbers)
                self.kept[number] = tensor
                numbers[number] = copies[id(tensor)]
        return numbers

    def kept_value(self, marker):
        from ..errors import NbgradError
        if marker.number not in self.kept:
            raise NbgradError("a value that came back from an earlier cell is no longer kept on the remote model's "
                              "actor: run that cell again")
        return self.kept[marker.number]

    def forget(self, numbers: list) -> None:
        """The notebook's copies of these kept tensors are gone: their graphs go too."""
        for number in numbers:
            self.kept.pop(number, None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)


def _dumps(value) -> bytes:
    from ray import cloudpickle
    try:
        return cloudpickle.dumps(value)
    except Exception as error:
        from ..errors import NbgradError
        what = value[1] if isinstance(value, tuple) and value and value[0] == "error" else value
        return cloudpickle.dumps(("error", NbgradError(f"the remote model's answer cannot be sent back "
                                                      f"({type(error).__name__}: {error}): {what!r}"), None))


def holder_class(max_concurrency: int = 2):
    import ray
    return ray.remote(max_concurrency=max_concurrency)(ModelHolder)
