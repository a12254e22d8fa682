"""Result: its lazy parts are built once, on first read; `without` makes a copy that shares no container with
the Result it came from; its repr reads as before (field by field)."""
import dataclasses

import torch

import nbgrad
from nbgrad.engine.results.result import Later, Result

PROMPT = "The Eiffel Tower is in the city of"
CELL = ("c = cache('transformer.h.1')\n"
        "hs = model.transformer.h[1].output.save()\n"
        "with model.output.logits[0, -1].max().backward():\n"
        "    g = hs.grad.save()\n")


def _counted(calls: list, name: str, value):
    def build(*args):
        calls.append((name, args))
        return value
    return build


def test_each_lazy_part_is_built_once_when_first_read():
    calls, saved, graph, pairs = [], {"g": torch.ones(2)}, object(), {"g": "h"}
    result = Result(Later((_counted(calls, "saved", saved), "by id")), Later((_counted(calls, "graph", graph), 7)),
                    grad_pairs=Later((_counted(calls, "pairs", pairs), "sources")))
    assert calls == []                                       # nothing built when made
    assert result.grad_pairs is pairs and result.grad_pairs is pairs
    assert calls == [("saved", ("by id",)), ("pairs", (saved, "sources"))]     # the pairs are built from the saved
    assert result.saved is saved and result["g"] is saved["g"] and result.graph is graph and result.graph is graph
    assert [name for name, _ in calls] == ["saved", "pairs", "graph"]


def test_a_result_of_a_run_builds_its_graph_once(default_model):
    result = nbgrad.trace(default_model, PROMPT, CELL)
    assert type(result.__dict__["_graph"]) is Later
    assert result.graph is result.graph and result.saved is result.saved and result.grad_pairs is result.grad_pairs
    assert result.grad_pairs == {"g": "hs"}


def test_fields_left_out_are_empty_and_each_result_has_its_own():
    first, second = Result({}, None), Result({}, None)
    for name in ("shapes", "leaf_grads", "accumulated", "grad_pairs", "invokes", "saved_invokes"):
        assert not getattr(first, name) and getattr(first, name) is not getattr(second, name), name
    assert first.input_ids is None


def _oracle(model):
    """Block 1's output and its gradient, from plain PyTorch hooks."""
    kept = {}
    ids = nbgrad.tokenizer_for(model)(PROMPT, return_tensors="pt")["input_ids"]

    def forward_hook(module, args, output):
        kept["h"] = output[0] if isinstance(output, tuple) else output
        kept["h"].register_hook(lambda grad: kept.__setitem__("g", grad))
    handle = model.transformer.h[1].register_forward_hook(forward_hook)
    try:
        model(ids).logits[0, -1].max().backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    return kept


def test_without_shares_no_container_with_the_result(default_model):
    result = nbgrad.trace(default_model, PROMPT, CELL)
    result.leaf_grads["x"], result.invokes = torch.zeros(1), [PROMPT]
    result.accumulated.add("x")
    expected = _oracle(default_model)
    rest = result.without({"c"})
    assert list(rest.saved) == ["hs", "g"] and list(result.saved) == ["c", "hs", "g"]
    assert torch.allclose(rest["hs"], expected["h"], atol=1e-5) and torch.allclose(rest["g"], expected["g"], atol=1e-5)
    assert rest["hs"] is result["hs"] and rest.graph is result.graph and rest.input_ids is result.input_ids
    for name in ("saved", "shapes", "leaf_grads", "accumulated", "grad_pairs", "invokes", "saved_invokes"):
        assert getattr(rest, name) is not getattr(result, name), name
    before = {name: (dict(getattr(result, name)) if isinstance(getattr(result, name), dict)
                     else type(getattr(result, name))(getattr(result, name)))
              for name in ("saved", "shapes", "leaf_grads", "accumulated", "grad_pairs", "invokes", "saved_invokes")}
    rest.saved["new"] = rest.shapes["new"] = rest.leaf_grads["new"] = rest.grad_pairs["new"] = 1
    rest.saved_invokes["new"] = 0
    rest.accumulated.add("new")
    rest.invokes.append("another")
    assert {name: getattr(result, name) for name in before} == before


def test_without_a_generation_keeps_its_output_and_has_its_own_top_tokens(default_model):
    result = nbgrad.generate(default_model, PROMPT, "c = cache('lm_head')\ntop = model.lm_head.output[:, -1].save()",
                             max_new_tokens=2)
    rest = result.without({"c"})
    assert type(rest) is nbgrad.GenerationResult and list(rest.saved) == ["top"]
    assert rest.output is result.output and rest.top_next == result.top_next and rest.top_next is not result.top_next
    rest.top_next.append(None)
    assert len(result.top_next) == 2


@dataclasses.dataclass
class _Before:
    """The dataclass Result was: what its repr read."""
    saved: dict
    graph: object
    shapes: dict
    leaf_grads: dict
    accumulated: set
    grad_pairs: dict
    input_ids: object
    invokes: list
    saved_invokes: dict


@dataclasses.dataclass
class _GenerationBefore(_Before):
    output: object = None
    top_next: list = None


def test_the_repr_reads_as_before():
    result = Result({"x": 1}, "graph", {(1, "output"): (1, 2)}, input_ids=torch.tensor([[1, 2]]), invokes=["a"])
    fields = {name: getattr(result, name) for name in Result.FIELDS}
    assert repr(result) == repr(_Before(**fields)).replace("_Before", "Result", 1)
    generated = nbgrad.GenerationResult({"x": [1]}, "graph", output=torch.tensor([[1, 2, 3]]), top_next=[None])
    fields = {name: getattr(generated, name) for name in nbgrad.GenerationResult.FIELDS}
    assert repr(generated) == repr(_GenerationBefore(**fields)).replace("_GenerationBefore", "GenerationResult", 1)
