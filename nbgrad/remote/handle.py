"""`nbgrad.remote(...)`'s handle: the notebook's side of a model held by a Ray actor. It carries the model's
skeleton (its module tree on `meta`), so paths are checked here; reads of weights, `call`, `zero_grad` and
cells go to the actor."""
from __future__ import annotations

import re

from ..errors import NbgradError
from .actor import holder_class
from .paths import RemotePath
from ..datasets.waiting import kill, off_main, send

DROPPED = ("the cluster's client server dropped the answer to this request: the notebook's connection to it broke "
           "and came back (Ray: {error}). The request may have run on the actor, and a cell's edits of the model with "
           "it; run it again, or `{name}.restart()` to start afresh")
LOST = ("the remote model's actor is gone (its process ended or it was killed), and the model with it: "
        "`{name}.restart()` starts a new one (a new actor loads the model again)")


class DroppedAnswer(NbgradError):
    """A `ray://` client's server dropped a request's result (`RemoteModel._ask`)."""


class RemoteModel:
    """A model that lives in a Ray actor. In a cell it is the model; outside one, `handle.a.b.weight` is a CPU
    copy of that weight (`.grad` included), `call(fn, *args)` runs `fn(model, *args)` there."""

    nbgrad_remote = True

    def __init__(self, build, actor_options: dict, actor=None):
        self._build, self._actor_options, self._actor = build, actor_options, actor
        self._stats: list = []
        self._generation, self._forgotten = 0, []        # the actor's number (one more at each restart); see kept.py
        self._label = actor_options.get("name") or "the handle"
        self._start(actor)

    def _start(self, actor=None) -> None:
        """Make the actor (unless given), and take its description: the skeleton, the tokenizer, where it runs. An
        actor made here whose start fails or is interrupted is killed: no handle would reach it (a restart's keeps
        the old, lost one), and it would hold the model until the notebook let go of the error. A named actor is
        left: `get_if_exists` may have found another notebook's."""
        import ray
        from ray import cloudpickle
        made = actor is None
        if made:
            actor = off_main(holder_class().options(**self._actor_options).remote, self._build)
        try:
            described = self._ask_again(actor.describe.remote)
        except BaseException:
            if made and "name" not in self._actor_options:
                kill(ray, actor)
            raise
        self._actor, self._generation, self._forgotten = actor, self._generation + 1, []
        skeleton, tokenizer, weights, pid, node = cloudpickle.loads(described)
        self.skeleton, self.tokenizer, self.weight_bytes, self.pid, self.node = skeleton, tokenizer, weights, pid, node
        if tokenizer is not None:
            from ..models.loading import register_tokenizer
            register_tokenizer(self, tokenizer)
        self._ray = ray

    # --- what goes to the actor
    def _ask(self, submit, *args, sending=None):
        """`ray.get(submit(*args))`: the request sent and its answer waited for off the main thread (waiting.py), so
        that an interrupt never lands in Ray's client code as it sends either; `sending` (waiting.Sending) keeps the
        request's task. A lost actor is said as such; the actor's own error is raised as it is."""
        import ray
        try:
            return off_main(_send_and_get, ray, submit, args, sending)
        except ray.exceptions.RayActorError as error:
            if getattr(error, "actor_init_failed", False):      # the model could not be made: say why
                said = [line.strip() for line in str(getattr(error, "error_msg", "")).splitlines()
                        if re.match(r"\s*[\w.]*(Error|Exception)\b.*:", line)]
                raise NbgradError(f"the remote model could not be made on its actor: {said[-1] if said else error}"
                                  ) from None
            raise NbgradError(LOST.format(name=self._label)) from error
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, BaseException):
                raise cause.with_traceback(None) from None
            raise
        except ValueError as error:         # "ClientObjectRef ... is not found for client ...": said in our words
            if "is not found for client" in str(error):
                raise DroppedAnswer(DROPPED.format(error=error, name=self._label)) from error
            raise

    def _ask_again(self, submit, *args):
        """`_ask(submit, *args)` for a request that changes nothing there, so may be sent twice. A `ray://` client
        whose connection broke under load and came back can find the request's result dropped by the client
        server ("ClientObjectRef ... is not found for client ..."): the request is then sent again, twice at most."""
        for attempt in range(3):
            try:
                return self._ask(submit, *args)
            except DroppedAnswer:
                if attempt == 2:
                    raise

    def read(self, path: str):
        """The parameter or buffer at `path` (`transformer.h.0.mlp.c_fc.weight`), with its `.grad`, on CPU."""
        value, grad = self._ask_again(self._actor.read.remote, path)
        if grad is not None:
            value.grad = grad
        return value

    def call(self, fn, *args, **kwargs):
        """`fn(model, *args, **kwargs)` on the actor; its result comes back (tensors on CPU)."""
        from ray import cloudpickle
        from .shipping import picklable
        picklable(f"call({getattr(fn, '__name__', 'fn')}, ...)", (fn, args, kwargs))
        return cloudpickle.loads(self._ask(self._actor.call.remote, cloudpickle.dumps((fn, args, kwargs))))

    def _forget(self, generation: int, number: int) -> None:
        """A copy of a tensor the actor kept is gone (kept.py); the actor is told with the next request."""
        if generation == self._generation:
            self._forgotten.append(number)

    def _send_forgotten(self) -> None:
        numbers, self._forgotten = self._forgotten, []
        if numbers:
            off_main(self._actor.forget.remote, numbers)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._ask_again(self._actor.zero_grad.remote, set_to_none)

    def restart(self) -> None:
        """A new actor, which builds the model again (after a lost actor, or to start afresh)."""
        import ray
        if self._build is None:
            raise NbgradError("this handle attached to a named model that another notebook made: restart it there")
        kill(ray, self._actor)
        self._start()

    def stats(self) -> list:
        """Per cell run here: {"cell": first line, "sent": bytes, "received": bytes}."""
        return list(self._stats)

    # --- what a cell does with it
    def nbgrad_trace(self, input, source: str, namespace, **options):
        from .cells import run_cell
        return run_cell(self, "trace", input, source, namespace, options)

    def nbgrad_generate(self, input, source: str, namespace, **options):
        from .cells import run_cell
        return run_cell(self, "generate", input, source, namespace, options)

    def nbgrad_backward(self, where, source: str, namespace, **options):
        from .backward import run_backward
        return run_backward(where, source, namespace, **options)

    # --- the module tree, from the skeleton
    def named_modules(self, *args, **kwargs):
        return self.skeleton.named_modules(*args, **kwargs)

    def modules(self):
        return self.skeleton.modules()

    @property
    def nbgrad_skeleton(self):
        """The skeleton (what `%source`, `%names` and the sidebar read, without the actor)."""
        return self.skeleton

    @property
    def config(self):
        return getattr(self.skeleton, "config", None)

    def __getattr__(self, name):
        if name.startswith("_") or name in ("skeleton", "tokenizer", "weight_bytes", "pid", "node"):
            raise AttributeError(name)
        return RemotePath(self, "", self.skeleton).__getattr__(name)

    @property
    def where(self) -> str:
        """Where the model lives, as the sidebar says it: the actor's name (if named), process and node."""
        named = f"actor {self._label!r}, " if self._actor_options.get("name") else "actor "
        return f"{named}pid {self.pid} on {self.node}"

    def __repr__(self):
        return f"remote {type(self.skeleton).__name__} ({self._label}, actor pid {self.pid})"


def _send_and_get(ray, submit, args: tuple, sending) -> object:
    """`ray.get(submit(*args))`, the task kept by `sending` as it is sent (waiting.send)."""
    return ray.get(send(submit, args, sending))
