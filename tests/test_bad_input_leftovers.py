"""Wrong input that used to reach Python or the model unexplained: an unknown keyword option of a public call, an
INPUT of a wrong kind that the model itself refuses, a misspelled canonical root name, an edit whose loop runs past
the last layer. Each is one error with its message; the model keeps no hook, the namespace gains no name, and the
next cell works."""
import pytest
import torch

import nbgrad
from nbgrad.errors import ArgumentError
from helpers import assert_clean, model_state, tiny_gpt2

IDS = torch.tensor([[1, 2, 3]])
SAVE = "h = model.transformer.h[0].output.save()"
EDIT = "model.transformer.h[0].output[:] *= 0.5"
NEXT = "kept = model.transformer.h[1].output.save()"


def next_cell_works(model, namespace):
    assert nbgrad.trace(model, IDS, NEXT, namespace).saved["kept"].shape == (1, 3, 32)
    namespace.pop("kept")


def refused(model, call, error, message=None):
    """`call(model, namespace)` raises `error` (whose text is `message`, when given); nothing is left behind."""
    namespace, before = {"model": model}, model_state(model)
    with pytest.raises(error) as caught:
        call(model, namespace)
    if message is not None:
        assert str(caught.value) == message
    assert set(namespace) == {"model"}
    assert_clean(model, before)
    next_cell_works(model, namespace)
    return caught.value


TRACE_OPTIONS = ("namespace, no_grad, tokenizer, graph, quiet, over, batch_size, out, engine, workers, column, "
                 "model_factory, progress, runner")
# (id, a call with a keyword the call does not take, the message)
KEYWORDS = [
    ("trace", lambda m, ns: nbgrad.trace(m, IDS, SAVE, ns, no_gard=True),
     f"nbgrad.trace: unknown option no_gard=; did you mean no_grad=? its options are {TRACE_OPTIONS}"),
    ("trace, nothing near", lambda m, ns: nbgrad.trace(m, IDS, SAVE, ns, zzz=1),
     f"nbgrad.trace: unknown option zzz=; its options are {TRACE_OPTIONS}"),
    ("backward", lambda m, ns: nbgrad.backward(m(IDS).logits.sum(), "", ns, retain_grahp=True),
     "nbgrad.backward: unknown option retain_grahp=; did you mean retain_graph=? its options are source, namespace, "
     "grad_output, retain_graph, create_graph, graph, quiet, runner"),
    ("generate", lambda m, ns: nbgrad.generate(m, IDS, SAVE, ns, max_new_token=2),
     "nbgrad.generate: unknown option max_new_token=; did you mean max_new_tokens=? its options are namespace, "
     "max_new_tokens, sample, out, kwargs, tokenizer, graph, quiet"),
    ("edit", lambda m, ns: nbgrad.edit(m, EDIT, ns, lable="halve"),
     "nbgrad.edit: unknown option lable=; did you mean label=? its options are namespace, label"),
    ("edit, a positional one misspelled", lambda m, ns: nbgrad.edit(m, EDIT, namspace=ns),
     "nbgrad.edit: unknown option namspace=; did you mean namespace=? its options are namespace, label"),
]


@pytest.mark.parametrize("call, message", [case[1:] for case in KEYWORDS], ids=[case[0] for case in KEYWORDS])
def test_an_unknown_keyword_names_the_nearest_option_and_all_of_them(call, message):
    error = refused(tiny_gpt2(n_layer=2), call, ArgumentError, message)
    assert isinstance(error, TypeError)          # where Python's own "unexpected keyword argument" was
