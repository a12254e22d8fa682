"""The hook graph's picture says everything it shows in full: long statements wrap onto more lines inside a
taller box (never cut with "…"), a backward pass's title is never cut, the run's step numbers are explained in
the picture itself, and `--graph` says the cell was not run."""
from xml.etree import ElementTree

import nbgrad
from svgdata import SVG, box, groups
from nbgrad.views.hookgraph import hook_graph_svg
from nbgrad.views.hookgraph_layout import CHAR_W, TEXT_W

LONG = ("hidden = model.transformer.h[1].output\n"
        "scaled = hidden * 0.5 + hidden.mean(dim=-1, keepdim=True) * 0.25 + hidden.std(dim=-1, keepdim=True) * 0.125\n"
        "kept = hidden.grad.save()\n"
        "model.output.logits[0, -1].max().backward() if True else model.output.logits[0, -1].min().backward()")


def _texts(group) -> list:
    return [t.text for t in group.iter(f"{SVG}text")]


def test_a_long_statement_wraps_inside_its_box_and_is_never_cut(default_model):
    graph = nbgrad.trace(default_model, "The cat sat", LONG).graph
    default_model.zero_grad(set_to_none=True)
    for compiled in (graph.to_dict(), {**graph.to_dict(), "runs": []}):       # after a run, and as --graph
        svg = hook_graph_svg(compiled)
        assert "…" not in svg
        by_line = {g.get("data-line"): g for g in groups(svg, "nbg-statement")}
        texts = _texts(by_line["2"])
        source = LONG.splitlines()[1]
        assert "".join(t.replace(" ", "") for t in texts).startswith(f"line2:{source.replace(' ', '')}")
        left, top, right, bottom = box(by_line["2"])
        assert len(texts) >= 2
        assert all(len(text) * TEXT_W <= right - left - 8 for text in texts)       # each line inside the box
        ys = [float(t.get("y")) for t in by_line["2"].iter(f"{SVG}text")]
        assert max(ys) < bottom and min(ys) > top
        tops = sorted(box(g)[1] for g in groups(svg, "nbg-statement"))
        bottoms = sorted(box(g)[3] for g in groups(svg, "nbg-statement"))
        assert all(b <= t for b, t in zip(bottoms, tops[1:]))                    # taller boxes push the next down


def test_the_backward_box_title_is_never_cut(default_model):
    graph = nbgrad.trace(default_model, "The cat sat", LONG).graph
    default_model.zero_grad(set_to_none=True)
    passes = groups(hook_graph_svg(graph.to_dict()), "nbg-pass")
    assert passes
    for group in passes:         # the line's two backward() calls: a pass each, both started by line 4
        title = _texts(group)[0]
        assert title.startswith(f"backward pass {group.get('data-pass')} · started by line 4") and "…" not in title
        assert len(title) * TEXT_W <= box(group)[2] - box(group)[0]


def test_the_run_view_explains_its_step_numbers():
    graph = nbgrad.trace(nbgrad.load_model(), "The cat", "x = model.transformer.h[0].output.save()").graph
    legend = " ".join(t.text for t in ElementTree.fromstring(hook_graph_svg(graph.to_dict())).iter(f"{SVG}text"))
    assert "#n: the run's nth step" in legend and '"ran #1, #4": the statement ran at steps 1 and 4' in legend
    compiled = {**graph.to_dict(), "runs": []}
    assert "ran #1" not in hook_graph_svg(compiled)             # nothing ran: nothing to explain


def test_graph_option_says_the_cell_was_not_run(shell, tiny, ids):
    from IPython.core.displaypub import CapturingDisplayPublisher
    shell.user_ns.update(tiny_model=tiny, ids=ids)
    shell.user_ns.pop("graph_probe", None)          # the session's shell: another test may have bound names
    publisher, shell.display_pub = shell.display_pub, CapturingDisplayPublisher()
    try:
        shell.run_cell_magic("trace", "tiny_model ids --graph", "graph_probe = tiny_model.transformer.h[1].output.save()")
        data = shell.display_pub.outputs[-1]["data"]
    finally:
        shell.display_pub = publisher
    assert "graph_probe" not in shell.user_ns
    assert data["text/plain"].startswith("--graph: the cell was not run")
    svg = data["image/svg+xml"]
    assert "the cell was not run" in svg
    title = next(t.text for t in ElementTree.fromstring(svg).iter(f"{SVG}text") if "not run" in t.text)
    assert 12 + 8 * len(title) <= float(ElementTree.fromstring(svg).get("width"))     # the svg holds its whole title


def test_a_long_event_name_is_drawn_whole_inside_its_box(default_model):
    from nbgrad.views.hookgraph_layout import EVENT_W
    cell = "q = model.transformer.h[3].attn.c_attn.output.save()\nm = model.transformer.h[0].output.save()"
    svg = hook_graph_svg(nbgrad.trace(default_model, "The cat", cell, no_grad=True).graph.to_dict())
    names = {g.get("data-event"): g.find(f"{SVG}text") for g in groups(svg, "nbg-event")}
    long = names["model.transformer.h[3].attn.c_attn.output"]
    assert long.text == "model.transformer.h[3].attn.c_attn.output"            # whole, not cut
    assert float(long.get("textLength")) == EVENT_W - 16 and long.get("lengthAdjust") == "spacingAndGlyphs"
    assert names["model.transformer.h[0].output"].get("textLength") is None     # one that fits is drawn as it is


def test_a_long_run_line_wraps_inside_its_box_and_is_never_cut(default_model):
    cell = ("outs = []\n"
            "for block in model.transformer.h:\n"
            "    outs.append(block.mlp.c_proj.output[:, -1].save())\n"
            "with model.output.logits[0, -1].max().backward():\n"
            "    g = model.transformer.h[3].mlp.c_proj.output.grad.save()\n")
    graph = nbgrad.trace(default_model, "The cat sat", cell, {"model": default_model}).graph
    default_model.zero_grad(set_to_none=True)
    steps = [step for step, run in enumerate(graph.runs, 1) if run.line == 5]
    whole = (f"ran {', '.join(f'#{step}' for step in steps)} · backward pass 0 · by "
             f"model.transformer.h[3].mlp.c_proj.output.grad")
    assert len(whole) > 64                                     # more than one line of the box holds
    svg = hook_graph_svg(graph.to_dict())
    assert "…" not in svg
    by_line = {g.get("data-line"): g for g in groups(svg, "nbg-statement")}
    texts = [t for t in by_line["5"].findall(f"{SVG}text") if t.get("font-size") == "11"]     # not the step chips
    assert " ".join(t.text for t in texts) == whole and len(texts) == 2
    left, top, right, bottom = box(by_line["5"])
    assert all(len(t.text) * CHAR_W <= right - left - 8 for t in texts)        # each line inside the box
    assert all(top < float(t.get("y")) < bottom for t in texts)
    tops = sorted(box(g)[1] for g in groups(svg, "nbg-statement"))
    bottoms = sorted(box(g)[3] for g in groups(svg, "nbg-statement"))
    assert all(b <= t for b, t in zip(bottoms, tops[1:]))                       # the taller box pushes the next down
