"""The hook graph's picture says why a statement waits: name-labelled arrows between statements, each
backward pass as a box around the statements that run inside it, and after a run the steps by phase.
The checks read the SVG's own data (classes and data- attributes), and the boxes' coordinates."""

from xml.etree import ElementTree

import nbgrad
from svgdata import SVG, box, groups, name_arrows, overlap, waits
from svgdata import steps as steps_of
from nbgrad.views.hookgraph import hook_graph_svg

INPUT = "The cat sat on the"
SEEDS = ("hs = model.transformer.h[1].output\n"
         "g = hs.grad.save()\n"
         "loss = model.output.logits[0, -1].max()\n"
         "loss.backward()")


def test_the_seeds_cell_shows_the_name_it_waits_for_and_the_pass_it_runs_in(default_model):
    compiled = nbgrad.trace(default_model, INPUT, SEEDS).graph.to_dict()
    compiled["runs"] = []                     # the `--graph` picture before anything ran
    svg = hook_graph_svg(compiled)
    # line 2 reads `hs` that line 1 binds; line 4 reads `loss` that line 3 binds
    assert name_arrows(svg) == {(0, 1): "hs", (2, 3): "loss"}
    [group] = groups(svg, "nbg-pass")
    assert (group.get("data-pass"), group.get("data-start-line"), group.get("data-members")) == ("0", "4", "1")
    assert "backward pass 0 · started by line 4: loss.backward()" in "".join(group.itertext())
    statements = {g.get("data-line"): box(g) for g in groups(svg, "nbg-statement")}
    inside, around = statements["2"], box(group)
    assert around[0] < inside[0] and around[1] < inside[1] and inside[2] < around[2] and inside[3] < around[3]
    assert around[1] > statements["4"][3]       # the pass's box sits below the line that starts it
    assert not groups(svg, "nbg-step")       # no run yet: no steps


def test_the_run_view_numbers_every_step_and_colours_it_by_phase(default_model):
    graph = nbgrad.trace(default_model, INPUT, SEEDS).graph
    default_model.zero_grad(set_to_none=True)
    svg = hook_graph_svg(graph.to_dict())
    steps = steps_of(svg)
    assert steps == {step: (run.node, run.phase) for step, run in enumerate(graph.runs, start=1)}
    assert steps[max(steps)] == (1, "backward pass 0")        # line 2 ran last, inside the backward pass
    phases = [g.get("data-phase") for g in groups(svg, "nbg-legend")]
    assert phases == ["before the model runs", "forward", "backward pass 0"]
    chip_fill = {g.get("data-phase"): g.find(f"{SVG}rect").get("fill") for g in groups(svg, "nbg-step")}
    legend_fill = {g.get("data-phase"): g.find(f"{SVG}rect").get("fill") for g in groups(svg, "nbg-legend")}
    assert chip_fill == legend_fill and len(set(legend_fill.values())) == 3
    [group] = groups(svg, "nbg-pass")
    assert group.get("data-members") == "1"


def test_a_backward_block_is_a_group_around_its_body(default_model):
    cell = ("hs = model.transformer.h[1].output\n"
            "with model.output.logits[0, -1].max().backward():\n"
            "    g = hs.grad.save()\n"
            "    k = (g * 2).save()\n")
    graph = nbgrad.trace(default_model, INPUT, cell).graph
    default_model.zero_grad(set_to_none=True)
    svg = hook_graph_svg(graph.to_dict())
    [group] = groups(svg, "nbg-pass")
    assert (group.get("data-start-line"), group.get("data-members")) == ("2", "2 3")
    assert name_arrows(svg) == {(0, 2): "hs", (2, 3): "g"}


def test_forty_statements_fit_without_overlapping_boxes_or_labels(default_model):
    lines = [f"h{i} = model.transformer.h[{i % 4}].output" for i in range(4)]
    lines += [f"x{i} = (h{i % 4} * {i} + h{(i + 1) % 4}).save()" for i in range(33)]
    lines += ["loss = model.output.logits[0, -1].max()", "loss.backward()"]
    lines.insert(2, "g = h1.grad.save()")
    assert len(lines) == 40
    graph = nbgrad.trace(default_model, INPUT, "\n".join(lines)).graph
    default_model.zero_grad(set_to_none=True)
    svg = hook_graph_svg(graph.to_dict())
    root = ElementTree.fromstring(svg)
    statements = [box(g) for g in groups(svg, "nbg-statement")]
    events = [box(g) for g in groups(svg, "nbg-event")]
    labels = [box(g) for g in groups(svg, "nbg-name-arrow") if g.find(f"{SVG}rect") is not None]
    boxes = statements + events + labels
    # one label per name and the statement that binds it: h0, h1, h2, h3, loss
    assert len(statements) == 40 and len(name_arrows(svg)) > 60 and len(labels) == 5
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if overlap(a, b)]
    height = float(root.get("height"))
    assert height > 40 * 40 and all(part[3] <= height for part in boxes)          # it grows: scroll, not shrink
    assert float(root.get("width")) == float(root.get("viewBox").split()[2])


def test_a_statement_that_reads_a_cache_says_it_runs_after_the_forward_pass(default_model):
    compiled = nbgrad.trace(default_model, INPUT, "c = cache('transformer.h.*')\nn = len(c)", graph=True).graph.to_dict()
    svg = hook_graph_svg(compiled)
    statements = {g.get("data-line"): g for g in groups(svg, "nbg-statement")}
    assert "[after the forward pass] line 2: n = len(c)" in "".join(statements["2"].itertext())
    assert "after the forward pass (it reads a cache, whole only then)" in "".join(statements["2"].itertext())
    assert "after" not in "".join(statements["1"].itertext())


def test_a_cache_has_a_box_of_its_own_with_arrows_to_the_statements_that_wait_for_it(default_model):
    """The cache's hooks are no event a statement names, yet the statements that read it wait for them."""
    cell = ("c = cache('transformer.h.*', grads=True)\nn = len(c)\nx = model.transformer.h[0].output.save()\n"
            "model.output.logits[0, -1].max().backward()\ng = c.grads['transformer.h.0'].norm().save()")
    graphs = (nbgrad.trace(default_model, INPUT, cell, graph=True).graph.to_dict(),
              nbgrad.trace(default_model, INPUT, cell).graph.to_dict())
    default_model.zero_grad(set_to_none=True)          # the run's backward pass filled the shared model's .grad
    for graph in graphs:
        svg = hook_graph_svg(graph)
        events = [g.get("data-event") for g in groups(svg, "nbg-event")]
        assert events == ["cache c (line 1): every module", "model.transformer.h[0].output", "model.output"]
        assert waits(svg) == {("cache c (line 1): every module", 1), ("cache c (line 1): every module", 4),
                              ("model.transformer.h[0].output", 2), ("model.output", 3)}
