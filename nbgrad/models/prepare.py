"""What a cell's model is called with (`prepared`), and a cell with invokes on text run again as it ran last: the same
model, tokenizer and INPUTs (the notebook habit of running the same clean and corrupt prompts cell after cell).

The full way (`batch_invokes`) asks its questions in some twenty functions before every such cell (the tokenizer's
state, the kept batch, the model's token range, where its inputs go), each run cold after the model's last forward:
about 50 us a cell on this project's machine, a third of what two invokes cost over raw hooks (bench/overhead.py,
(f)). `again` asks the same questions of what the last run found, in one function, and leaves the cell to the full way
at the first answer that differs; `keep` writes down what the full way found."""
from __future__ import annotations

import weakref

import torch

from ..engine import moduletree
from ..engine.run.rows import InvokeRows
from .batching import batch_invokes, text_batch
from .cell import invoke_inputs, model_to_trace
from .inputs import _META, call_arguments
from .limits import input_embeddings
from .loading import tokenizer_for
from .padding import pad_key

_last: dict = {}         # id(program) -> _Last: what the program's last run on text found
_LAST_KEPT = 64


def prepared(program, model, input, tokenizer, namespace: dict) -> tuple:
    """(model to hook, args, kwargs, invoke INPUTs, InvokeRows or None) for a cell on text, a compiled model or
    invokes (`trace` does ids on an eager model itself)."""
    values = None
    if program.invokes and type(model).__name__ != "OptimizedModule":     # text as the cell's last run had it: `again`
        values = invoke_inputs(program, input, namespace)
        if (found := again(program, model, tokenizer, values)) is not None:
            return found
    # A tensor INPUT needs no tokenizer: only text does (an INPUT, or an invoke's)
    model, tokenizer = model_to_trace(model, tokenizer, wanted=bool(program.invokes) or type(input) is not torch.Tensor)
    if not program.invokes:
        return (model, *call_arguments(input, model, tokenizer), [], None)
    values = invoke_inputs(program, input, namespace) if values is None else values
    args, kwargs, spans = batch_invokes(values, program.invokes, model, tokenizer)
    if set(map(type, values)) == {str}:
        keep(program, model, tokenizer, values)
    return model, args, kwargs, values, InvokeRows(spans, spans[-1][1])


class _Last:
    """The last run's program, model and tokenizer, INPUTs, the tokenizer's state (what its kept batches are keyed by),
    the structure version (the model's token range and input embeddings hold while it does), the input embeddings,
    their weight and its device (input_device's common case), and the batch. The model, tokenizer, embeddings and
    weight weakly: a deleted model leaves nothing of it here."""
    __slots__ = ("program", "model", "tokenizer", "values", "state", "version", "embeddings", "weight", "device",
                 "batch")


def again(program, model, tokenizer, values: list) -> tuple | None:
    """`prepared`'s answer for an eager model whose cell's last run on text had all this: (model, args, kwargs,
    INPUTs, rows); else None. `values`: the invokes' INPUTs, evaluated once (`invoke_inputs`)."""
    last = _last.get(id(program))
    if last is None or last.program is not program or last.model() is not model:
        return None
    if tokenizer is None:
        tokenizer = tokenizer_for(model)          # as model_to_trace finds it
    if tokenizer is None or tokenizer is not last.tokenizer() or len(values) != len(last.values):
        return None
    for value, before in zip(values, last.values):
        if value is not before and not (type(value) is str and value == before):
            return None
    if _state(tokenizer) != last.state or moduletree._structure_version[0] != last.version:
        return None
    embeddings, weight = last.embeddings(), last.weight()
    if (embeddings is None or "_hf_hook" in embeddings.__dict__ or "_hf_hook" in model.__dict__
            or embeddings._parameters.get("weight") is not weight or weight.device != last.device):
        return None
    batch = last.batch
    return model, (), batch.call_kwargs(model, last.device), values, InvokeRows(batch.spans, batch.spans[-1][1])


def keep(program, model, tokenizer, values: list) -> None:
    """After the full way made the batch of `values` (all text) for `model`: write down what `again` checks."""
    embeddings = input_embeddings(model)      # input_device's common case, as `again` checks it
    weight = embeddings._parameters.get("weight") if embeddings is not None else None
    if weight is None or "_hf_hook" in vars(embeddings) or "_hf_hook" in vars(model) or weight.device == _META:
        _last.pop(id(program), None)              # placed by accelerate, or no embeddings: the full way each time
        return
    last = _Last()
    try:
        last.model, last.tokenizer, last.state = weakref.ref(model), weakref.ref(tokenizer), _state(tokenizer)
    except TypeError:                             # as padding.py keeps no batch for such a tokenizer
        _last.pop(id(program), None)
        return
    last.program, last.values = program, list(values)
    last.version, last.device = moduletree._structure_version[0], weight.device
    last.embeddings, last.weight = weakref.ref(embeddings), weakref.ref(weight)
    last.batch = text_batch(values, program.invokes, model, tokenizer)
    if len(_last) >= _LAST_KEPT and id(program) not in _last:
        del _last[next(iter(_last))]
    _last[id(program)] = last


def _state(tokenizer) -> tuple:
    """What a kept batch of the tokenizer's is keyed by, besides its prompts (padding.py `_kept`, `pad_key`)."""
    return (len(tokenizer), getattr(tokenizer, "add_bos_token", None), getattr(tokenizer, "add_eos_token", None),
            pad_key(tokenizer))
