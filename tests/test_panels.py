"""Panel data, bounds, static fallbacks and escaping."""
import base64
import json

import numpy as np
import pytest
import torch

import nbgrad
from nbgrad.views import MIME_TYPE, panel_for_result, show
from nbgrad.views.payload import MAX_BYTES


def test_summary_line_values(default_model):
    x = torch.tensor([[1.0, -2.0, float("nan")], [float("inf"), 0.5, 3.0]], requires_grad=True)
    item = show(x, "x").items[0]
    s = item["summary"]
    finite = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    assert s["shape"] == [2, 3] and s["dtype"] == "float32" and s["device"] == "cpu" and s["requires_grad"]
    assert s["nan"] == 1 and s["inf"] == 1
    assert s["min"] == -2.0 and s["max"] == 3.0
    assert s["mean"] == pytest.approx(float(finite.mean())) and s["std"] == pytest.approx(float(finite.std()))
    assert s["norm"] == pytest.approx(float(finite.norm()))
    assert "NaN=1 Inf=1" in repr(show(x, "x"))


def test_a_tensor_without_values_is_shown_by_its_shape_and_says_why():
    """A meta tensor (a model made without its weights) has a shape and a dtype but no values: the panel
    shows those and says so, where reading its statistics raised torch's "cannot be called on meta tensors"."""
    panel = show(torch.empty(3, 4, device="meta"), "w")
    item = panel.items[0]
    assert item["summary"]["shape"] == [3, 4] and item["summary"]["device"] == "meta" and "min" not in item["summary"]
    assert item["heatmap"] is None and item["histogram"] is None and "a shape without values" in item["note"]
    assert "meta" in repr(panel) and "a shape without values" in panel._repr_mimebundle_()["text/html"]


def test_trace_panel_has_every_saved_value_and_pairs_gradients(default_model):
    result = nbgrad.trace(default_model, "The cat sat on the mat", """
hs = model.transformer.h[2].output.save()
logits = model.output.logits.save()
with logits.sum().backward():
    g = hs.grad.save()
""")
    default_model.zero_grad(set_to_none=True)
    panel = panel_for_result(result, nbgrad.tokenizer_for(default_model), "title")
    items = {item["name"]: item for item in panel.items}
    assert list(items) == ["hs", "logits", "g"]
    assert items["g"]["kind"] == "gradient" and items["g"]["partner"] == "hs"
    assert items["hs"]["summary"]["grad_fn"] is not None
    # token labels on the sequence axis, decoded from the prompt
    tokenizer = nbgrad.tokenizer_for(default_model)
    tokens = [tokenizer.decode([i]) for i in tokenizer("The cat sat on the mat")["input_ids"]]
    heat = items["hs"]["heatmap"]
    assert heat["token_rows"] and heat["row_labels"] == tokens
    # top-k next tokens at every position for [.., vocab] logits, probabilities from softmax
    topk = items["logits"]["topk"]
    assert topk["positions"] == tokens
    probs = torch.softmax(result.saved["logits"][0].double(), -1)
    best = probs.topk(5, -1)
    assert topk["tokens"][0] == [tokenizer.decode([int(i)]) for i in best.indices[0]]
    assert topk["probs"][-1][0] == pytest.approx(float(best.values[-1, 0]), abs=1e-4)
    assert items["hs"]["topk"] is None


def test_heatmap_slices_and_values_decode_back(default_model):
    x = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4) - 10
    heat = show(x, "x").items[0]["heatmap"]
    assert heat["sliders"] == [{"axis": 0, "size": 2, "indices": [0, 1]}]
    assert [s["key"] for s in heat["slices"]] == [[0], [1]]
    assert heat["signed"]
    second = heat["slices"][1]
    levels = np.frombuffer(base64.b64decode(second["data"]), dtype=np.uint8).reshape(3, 4)
    decoded = second["lo"] + levels / 255 * (second["hi"] - second["lo"])
    assert np.allclose(decoded, x[1].numpy(), atol=(second["hi"] - second["lo"]) / 255)


def test_histogram_counts_every_finite_value():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    hist = show(x).items[0]["histogram"]
    assert sum(hist["counts"]) == 1000 and len(hist["counts"]) == 40
    assert hist["lo"] == pytest.approx(float(x.min())) and hist["hi"] == pytest.approx(float(x.max()))


@pytest.mark.parametrize("shape,vocab", [((1, 1024, 768), None), ((1, 10, 50257), 50257)])
def test_big_tensors_are_bounded(shape, vocab):
    """Payload bounds; the time this takes is measured in bench/panels.py, as a ratio against raw torch."""
    class Tok:
        def __len__(self):
            return vocab

        def decode(self, ids):
            return f"<t{ids[0]}>"
    tensor = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    panel = show(tensor, "big", tokenizer=Tok() if vocab else None)
    size = len(json.dumps(panel.items[0]))
    assert size <= MAX_BYTES, size
    heat = panel.items[0]["heatmap"]
    assert heat["notes"] and "sampled" in heat["notes"][0]
    if vocab:
        assert panel.items[0]["topk"]["tokens"][0][0].startswith("<t")


def test_bundle_carries_static_data_html_and_text_and_a_widget_where_wanted(monkeypatch):
    from nbgrad.views import live
    bundle = show(torch.ones(2, 2), "ones")._repr_mimebundle_()
    assert MIME_TYPE in bundle and "text/html" in bundle and "text/plain" in bundle
    assert 'src="data:image/png;base64,' in bundle["text/html"]
    assert "application/vnd.jupyter.widget-view+json" not in bundle     # JupyterLab draws the MIME data
    monkeypatch.setattr(live, "LIVE_WIDGET", True)
    assert "application/vnd.jupyter.widget-view+json" in show(torch.ones(2, 2), "ones")._repr_mimebundle_()
    live.close_all()


def test_labels_are_escaped_in_static_html():
    nasty = "<script>alert(1)</script>"
    panel = show({nasty: torch.ones(3)})
    html = panel._repr_mimebundle_()["text/html"]
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert panel.items[0]["name"] == nasty        # data stays data; front ends render it as text


def test_quiet_turns_the_panel_off_and_the_panel_changes_nothing(shell, default_model, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, *a, **k: shown.append(obj))
    shell.user_ns.update(pm=default_model)
    shell.run_cell_magic("trace", 'pm "Hello World" -q', "a = pm.transformer.h[0].output.save()")
    quiet = shell.user_ns["a"]
    assert shown == []
    shell.run_cell_magic("trace", 'pm "Hello World"', "a = pm.transformer.h[0].output.save()")
    assert len(shown) == 1 and torch.equal(shell.user_ns["a"], quiet)


def test_backward_panel_shows_leaf_grads_and_accumulation(shell):
    shell.run_cell("pa = torch.tensor([1.0, 2.0], requires_grad=True)")
    r1 = nbgrad.backward((shell.user_ns["pa"] ** 2).sum(), namespace=shell.user_ns)
    r2 = nbgrad.backward((shell.user_ns["pa"] ** 2).sum(), namespace=shell.user_ns)
    first = panel_for_result(r1).items
    second = panel_for_result(r2).items
    assert first[0]["name"] == "pa.grad" and first[0]["note"] is None
    assert "accumulated" in second[0]["note"]


def test_gradflow_and_gradgraph_pictures(shell, default_model):
    from nbgrad.views.gradflow import GradFlow
    from nbgrad.errors.naming import tensor_names
    from nbgrad.views.gradgraph import GradGraph
    nbgrad.trace(default_model, "Hello", "model.output.logits.sum().backward()")
    flow = GradFlow(default_model, "model")
    names = [name for name, _, _ in flow.rows]
    assert names[0] == "transformer.wte.weight" and len(names) == len(list(default_model.parameters()))
    mean0 = float(default_model.transformer.wte.weight.grad.abs().mean())
    assert flow.rows[0][1] == pytest.approx(mean0)
    assert "image/png" in flow._repr_mimebundle_()
    default_model.zero_grad(set_to_none=True)
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    graph = GradGraph((x * w).sum(), tensor_names({"x": x, "w": w}), "z")
    labels = [label for label, _ in graph.nodes.values()]
    assert "SumBackward0" in labels and "MulBackward0" in labels
    assert any(label.startswith("x\n") for label in labels) and any(label.startswith("w\n") for label in labels)
    assert base64.b64decode(graph._repr_mimebundle_()["image/png"])[:4] == b"\x89PNG"


def test_gradflow_flags_vanishing_and_exploding():
    from nbgrad.views.gradflow import flags
    rows = [("a", 1e-2, 1e-1), ("b", 1e-9, 1e-8), ("c", 2e-2, 1e-1), ("d", 5e3, 1e4)]
    assert flags(rows) == {"b": "vanishing", "d": "exploding"}


def test_saved_values_in_a_list_are_named_by_their_index(tiny_model_ids=None):
    from helpers import tiny_gpt2
    model = tiny_gpt2()
    result = nbgrad.trace(model, torch.tensor([[1, 2, 3]]),
                          "hidden = [model.transformer.h[i].output.save() for i in range(4)]")
    assert list(result.saved) == ["hidden[0]", "hidden[1]", "hidden[2]", "hidden[3]"]


def test_token_heatmap_colours_and_escapes():
    from nbgrad.views import token_heatmap
    heat = token_heatmap(["<b>", "ok", "x"], [-1.0, 0.0, 2.0], "saliency")
    html = heat._repr_html_()
    assert "&lt;b&gt;" in html and "<b>saliency</b>" in html and "<b><" not in html
    red, white, blue = heat.colours()[2], heat.colours()[1], heat.colours()[0]
    assert red[0] > red[2] and blue[2] > blue[0] and min(white) > 200
