"""`--over DATASET` on a remote model: the notebook reads the dataset batch by batch, as a local run does, and
sends each batch to the actor, which runs it with the batch runner of a local run (datasets/batch.py); what comes
back is each example's values, on CPU. So `--out DIR` is written by the notebook, a run that stops keeps the
batches DIR holds, and an iterable dataset is never sent whole."""
from __future__ import annotations

from ..datasets.run import trace_over
from ..errors import NbgradError
from .exchange import exchange
from .shipping import picklable, shipped_names


def trace_over_remote(handle, source: str, namespace: dict, options: dict):
    """`nbgrad.trace(handle, None, source, namespace, over=..., **options)`: datasets' driver, with the batches run
    on the handle's actor."""
    over, tokenizer = options.pop("over"), options.pop("tokenizer", None)
    options.pop("_aliased", None)
    options.pop("runner", None)         # the statement kinds the actor's runs take: its default
    for option, default in (("engine", "local"), ("workers", None), ("model_factory", None)):
        if options.pop(option, default) != default:
            raise NbgradError(f"a remote model runs --over's batches on its own actor: "
                              f"`{option.replace('_', '-')}` does not apply to it (drop it)")
    if tokenizer is not None:
        picklable("--tokenizer", tokenizer)

    def runner(source, namespace, no_grad, helpers):
        return RemoteBatches(handle, source, namespace, {"no_grad": no_grad, "helpers": helpers,
                                                         "tokenizer": tokenizer})
    return trace_over(handle, source, namespace, over, batches_of=runner, **options)


class RemoteBatches:
    """The batches of one run, each sent to the actor when the dataset gives it; one `stats()` entry for the run."""

    def __init__(self, handle, source: str, namespace: dict, options: dict):
        self.handle, self.source, self.options = handle, source, options
        self.shipped = shipped_names(source, namespace, handle)          # errors here: nothing has run
        self.stats = {"cell": source.strip().split("\n")[0], "sent": 0, "received": 0}
        handle._stats.append(self.stats)

    def run(self, batches, store):
        """(start, [{name: value} per example], plain names or None when the batch was found in DIR)."""
        for start, examples in batches:
            if store is not None and store.has(start, examples):
                yield start, [{}] * len(examples), None
                continue
            picklable(f"the examples {start}-{start + len(examples) - 1}", examples)
            per_example, plain = exchange(self.handle, "batch", self.source, self.shipped, (examples, start),
                                          self.options, self.stats)
            yield start, per_example, plain
