"""The hook graph, seen: run order as data, and its picture."""
import pytest
import torch

import nbgrad
from nbgrad.views.hookgraph import HookGraphPicture, hook_graph_svg

SEED = """
hs = model.transformer.h[1].output
g = hs.grad.save()
logits = model.output.logits
logits.sum().backward()
"""


def test_a_grad_read_written_before_the_backward_line_runs_inside_the_pass(tiny, ids):
    result = nbgrad.trace(tiny, ids, SEED)
    tiny.zero_grad(set_to_none=True)
    runs = [(run.line, run.woke_by, run.phase) for run in result.graph.runs]
    assert (3, None, "forward") in runs                       # line 3 starts once hs exists, and waits
    assert (3, "hs.grad", "backward pass 0") in runs           # the gradient wakes it during the pass
    assert runs.index((2, "model.transformer.h[1].output", "forward")) < runs.index((3, "hs.grad", "backward pass 0"))
    data = result.graph.to_dict()
    assert {"node": 1, "line": 3, "woke_by": "hs.grad", "phase": "backward pass 0"} in data["runs"]
    assert "backward pass 0: line 3 woken by hs.grad" in result.graph.to_text()


def test_a_too_late_write_marks_its_statement_and_names_both_lines(tiny, ids):
    with pytest.raises(nbgrad.OrderError) as caught:
        nbgrad.trace(tiny, ids, "x = model.transformer.h[3].output\nmodel.transformer.h[1].output[:] = x")
    message = str(caught.value)
    assert "line 2: model.transformer.h[1].output is edited too late" in message and "(line 1)" in message
    graph = caught.value.nbgrad_graph
    assert graph.failed == 1 and graph.nodes[graph.failed].line == 2
    assert ("forward", "model.transformer.h[3].output") in [(r.phase, r.woke_by) for r in graph.runs]
    svg = hook_graph_svg(graph.to_dict())
    steps = ", ".join(f"#{step}" for step, run in enumerate(graph.runs, 1) if run.node == graph.failed)
    assert f"failed {steps} · forward" in svg and 'stroke="#c53030"' in svg


def test_invokes_get_a_lane_each(default_model):
    result = nbgrad.trace(default_model, None, "with invoke('a b'):\n    x = model.lm_head.output.save()\n"
                                               "with invoke('c'):\n    y = model.lm_head.output.save()", no_grad=True)
    assert [node.invoke for node in result.graph.nodes] == [0, 1]
    svg = hook_graph_svg(result.graph.to_dict())
    assert "[invoke 0] line 2" in svg and "[invoke 1] line 4" in svg


def test_the_picture_escapes_the_cell_text(tiny, ids):
    graph = nbgrad.trace(tiny, ids, "s = '<script>alert(1)</script>'\nx = model.transformer.h[0].output.save()",
                         graph=True).graph
    picture = HookGraphPicture(graph.to_dict(), graph.to_text(), "<b>title</b>")
    bundle = picture._repr_mimebundle_()
    assert "<script>" not in bundle["image/svg+xml"] and "&lt;script&gt;" in bundle["image/svg+xml"]
    assert "&lt;b&gt;title" in bundle["image/svg+xml"]
    assert bundle["text/plain"].startswith("hook graph")


def test_graph_option_of_the_magic_displays_the_picture(shell, tiny, ids):
    from IPython.core.displaypub import CapturingDisplayPublisher
    shell.user_ns.update(tiny_model=tiny, ids=ids)
    publisher, shell.display_pub = shell.display_pub, CapturingDisplayPublisher()
    try:
        shell.run_cell_magic("trace", "tiny_model ids --graph", "a = tiny_model.transformer.h[1].output.save()")
        outputs = shell.display_pub.outputs
    finally:
        shell.display_pub = publisher
    assert outputs and outputs[-1]["data"]["image/svg+xml"].startswith("<svg")
    assert "tiny_model.transformer.h[1].output" in outputs[-1]["data"]["text/plain"]


def test_the_panel_of_a_run_carries_its_graph_picture(tiny, ids):
    import base64
    from nbgrad.views import panel_for_result
    result = nbgrad.trace(tiny, ids, SEED)
    tiny.zero_grad(set_to_none=True)
    payload = panel_for_result(result, None, "%%trace tiny ids").payload
    assert payload["graph"].startswith("data:image/svg+xml;base64,")
    svg = base64.b64decode(payload["graph"].split(",", 1)[1]).decode()
    # line 3 started in the forward pass (step 4), waited, and ran on in backward pass 0 (step 7)
    assert "ran #4, #7 · backward pass 0 · by hs.grad" in svg and "line 3: g = hs.grad.save()" in svg
    bundle = panel_for_result(result, None, "t")._repr_mimebundle_()
    assert 'alt="hook graph" src="data:image/svg+xml;base64,' in bundle["text/html"]
