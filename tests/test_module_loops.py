"""Loops and comprehensions over modules read and edit their events in any order, each case against plain
forward hooks / tensor hooks on the same weights."""
import re

import pytest
import torch

import nbgrad
from helpers import assert_clean, hooked, model_state

IDS_TEXT = "The Eiffel Tower is in"


def hooked_outputs(model, ids, names, edit=None):
    """Every named module's output with plain forward hooks (after `edit(name, output)`), and the logits."""
    modules = dict(model.named_modules())
    seen, handles = {}, []
    for name in names:
        def hook(mod, args, output, name=name):
            if edit is not None:
                output = edit(name, output)
            seen[name] = output
            return output
        handles.append(modules[name].register_forward_hook(hook))
    try:
        logits = model(ids).logits
    finally:
        for handle in handles:
            handle.remove()
    return seen, logits


def test_named_modules_reads_a_container_before_its_children(default_model):
    before = model_state(default_model)
    ids = torch.tensor([[5, 9, 2, 7]])
    ns = {"model": default_model}
    nbgrad.trace(default_model, ids, """
d = {n: m.output.save() for n, m in model.named_modules() if n in ("transformer", "transformer.h.0")}
""", ns)
    seen, _ = hooked_outputs(default_model, ids, ["transformer", "transformer.h.0"])
    d = ns["d"]
    assert list(d) == ["transformer", "transformer.h.0"]      # the loop's own order
    assert torch.equal(d["transformer"].last_hidden_state, seen["transformer"].last_hidden_state)
    assert torch.equal(d["transformer.h.0"], seen["transformer.h.0"])
    assert_clean(default_model, before)


def test_every_module_the_run_calls_in_a_for_loop(default_model):
    ids = torch.tensor([[5, 9, 2, 7]])
    every = [n for n, _ in default_model.named_modules() if n]
    fired, _ = hooked_outputs(default_model, ids, every)
    names = [n for n in every if n in fired]      # a ModuleList, and modules the model skips, never run
    ns = {"model": default_model, "wanted": set(names)}
    nbgrad.trace(default_model, ids, """
outs = {}
for name, module in model.named_modules():
    if name in wanted:
        outs[name] = module.output.save()
""", ns)
    seen, _ = hooked_outputs(default_model, ids, names)
    assert list(ns["outs"]) == names and len(names) > 20
    for name in names:
        value, expected = ns["outs"][name], seen[name]
        value, expected = (value, expected) if torch.is_tensor(expected) else (value[0], expected[0])
        assert torch.equal(value, expected), name


@pytest.mark.parametrize("iterable", ["reversed(model.transformer.h)", "model.transformer.h[::-1]",
                                      "list(reversed(model.transformer.h))",
                                      "[model.transformer.h[3], model.transformer.h[2], model.transformer.h[1], "
                                      "model.transformer.h[0]]"])
def test_blocks_read_in_reverse(tiny, ids, iterable):
    before = model_state(tiny)
    ns = {"model": tiny}
    nbgrad.trace(tiny, ids, f"resid = [b.output.save() for b in {iterable}]", ns)
    names = [f"transformer.h.{i}" for i in range(4)]
    seen, _ = hooked_outputs(tiny, ids, names)
    resid = ns["resid"]
    assert len(resid) == 4
    for value, name in zip(resid, reversed(names)):
        assert torch.equal(value, seen[name])
    assert_clean(tiny, before)


def test_children_with_enumerate_reads_in_any_order(tiny, ids):
    ns = {"model": tiny}
    nbgrad.trace(tiny, ids, """
firsts = {i: c.output.save() for i, c in enumerate(model.children())}
""", ns)
    seen, _ = hooked_outputs(tiny, ids, ["transformer", "lm_head"])
    firsts = ns["firsts"]
    assert torch.equal(firsts[0].last_hidden_state, seen["transformer"].last_hidden_state)
    assert torch.equal(firsts[1], seen["lm_head"])


def test_edit_in_a_loop_over_named_modules(tiny, ids):
    before = model_state(tiny)
    result = nbgrad.trace(tiny, ids, """
for name, module in model.named_modules():
    if name in ("transformer.h.1", "transformer.h.2.mlp"):
        module.output[:, -1] = 0
logits = model.output.logits.save()
""")

    def zero_last(name, output):
        if name in ("transformer.h.1", "transformer.h.2.mlp"):
            output = output.clone()
            output[:, -1] = 0
        return output
    _, logits = hooked_outputs(tiny, ids, ["transformer.h.1", "transformer.h.2.mlp"], zero_last)
    assert torch.allclose(result.saved["logits"], logits, atol=1e-6)
    assert_clean(tiny, before)


def test_gradients_of_blocks_read_in_reverse(tiny, ids):
    ns = {"model": tiny}
    nbgrad.trace(tiny, ids, """
grads = [b.output.grad.save() for b in reversed(model.transformer.h)]
model.output.logits[0, -1].max().backward()
""", ns)
    tiny.zero_grad()
    before = model_state(tiny)
    blocks = list(tiny.transformer.h)
    outs, handles = {}, [b.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o))
                         for i, b in enumerate(blocks)]
    try:
        logits = tiny(ids).logits
        for out in outs.values():
            out.retain_grad()
        tiny.zero_grad()
        logits[0, -1].max().backward()
    finally:
        for handle in handles:
            handle.remove()
    assert len(ns["grads"]) == 4
    for value, index in zip(ns["grads"], reversed(range(4))):
        assert torch.allclose(value, outs[index].grad)
    tiny.zero_grad()
    assert_clean(tiny, before)


def test_a_module_the_run_never_calls_is_named(default_model):
    before = model_state(default_model)
    with pytest.raises(nbgrad.OrderError) as caught:
        nbgrad.trace(default_model, "Hello", "d = {n: m.output.save() for n, m in model.named_modules() if n}")
    message = str(caught.value)
    assert "model.transformer.h" in message and "ModuleList" in message and "never ran" in message
    assert "leave out those that do not (an `if` in the loop), or use cache(...)" in message
    assert_clean(default_model, before)
    assert nbgrad.trace(default_model, "Hello", "x = model.lm_head.output.save()").saved["x"].dim() == 3


@pytest.mark.parametrize("target", ["b", "b.mlp"])
def test_an_edit_out_of_call_order_in_a_loop_is_an_error_that_says_why(tiny, ids, target):
    before = model_state(tiny)
    with pytest.raises(nbgrad.OrderError, match=rf"line 3: {re.escape(target)}.output is edited too late: .*the loop "
                                                r"waited for this expression's event on another module first.*"
                                                r"in the order the model calls them \(not reversed"):
        nbgrad.trace(tiny, ids, f"""
for b in reversed(model.transformer.h):
    {target}.output[:] = 0
""")
    assert_clean(tiny, before)


def test_a_submodule_or_site_of_each_element_is_read_in_any_order(default_model):
    """`b.attn.output` (a module reached through the loop variable) and a site of it are hooked on every element
    before the run, as `b.output` is: a loop over `reversed(...)` reads them all (it found the first and waited
    there while the others ran unhooked). Values against plain hooks on the same weights."""
    model = nbgrad.load_model(attn_implementation="eager")
    before = model_state(model)
    ns = {"model": model}
    result = nbgrad.trace(model, "The Eiffel Tower is in", """
attn = [b.attn.output.save() for b in reversed(model.transformer.h)]
mlp = {n: m.mlp.c_fc.output.save() for n, m in model.transformer.h.named_children() if n != "1"}
pats = [b.attn.source.attention_interface_1.source.nn_functional_softmax_0.output
        for b in reversed(model.transformer.h)]
loss = model.output.logits[0, -1].max()
with loss.backward():
    grads = [p.grad.save() for p in pats]
""", ns)
    model.zero_grad(set_to_none=True)
    layers = len(model.transformer.h)
    names = [f"transformer.h.{i}.{m}" for m in ("attn", "mlp.c_fc") for i in range(layers)]
    seen, _ = hooked_outputs(model, result.input_ids, names)
    for index, value in enumerate(ns["attn"]):
        assert torch.equal(value[0], seen[f"transformer.h.{layers - 1 - index}.attn"][0]), index     # a tuple
    assert list(ns["mlp"]) == ["0", "2", "3"]
    for name, value in ns["mlp"].items():
        assert torch.equal(value, seen[f"transformer.h.{name}.mlp.c_fc"]), name
    # the same gradients as the loop in forward order, which found each site before it ran
    forward = nbgrad.trace(model, "The Eiffel Tower is in", """
pats = [b.attn.source.attention_interface_1.source.nn_functional_softmax_0.output for b in model.transformer.h]
loss = model.output.logits[0, -1].max()
with loss.backward():
    grads = [p.grad.save() for p in pats]
""", forward_ns := {"model": model})
    model.zero_grad(set_to_none=True)
    assert len(ns["grads"]) == layers and len(forward.saved) == layers
    for index, grad in enumerate(ns["grads"]):
        assert grad.abs().sum() > 0 and torch.allclose(grad, forward_ns["grads"][layers - 1 - index]), index
    assert_clean(model, before)


def count_hooks(monkeypatch):
    """The modules nbgrad hooks in a run, counted at the one place that hooks a module's events for a statement
    (ForwardEvents.hook), the model's own output answered from what its call returns included."""
    from nbgrad.engine.run.forward import ForwardEvents
    hooked, original = [], ForwardEvents.hook

    def hook(self, module, kind, **options):
        new = original(self, module, kind, **options)
        if new:
            hooked.append(module)
        return new
    monkeypatch.setattr(ForwardEvents, "hook", hook)
    return hooked


def test_a_loop_condition_hooks_only_the_modules_it_keeps(default_model, monkeypatch):
    hooked = count_hooks(monkeypatch)
    ns = {"model": default_model}
    nbgrad.trace(default_model, IDS_TEXT, """
d = {n: m.output.save() for n, m in model.named_modules() if n in ("transformer", "transformer.h.0")}
for name, module in model.named_modules():
    if name.startswith("transformer.h.1.mlp."):
        last = module.output.save()
""", ns)
    modules = dict(default_model.named_modules())
    assert set(map(id, hooked)) == {id(modules[n]) for n in ("transformer", "transformer.h.0")} | {
        id(m) for n, m in modules.items() if n.startswith("transformer.h.1.mlp.")}
    assert list(ns["d"]) == ["transformer", "transformer.h.0"]


def test_a_condition_nbgrad_cannot_judge_early_hooks_every_module(default_model, monkeypatch):
    hooked = count_hooks(monkeypatch)
    ns = {"model": default_model, "wanted": lambda name: name == "transformer"}
    nbgrad.trace(default_model, IDS_TEXT, "d = {n: m.output.save() for n, m in model.named_modules() if wanted(n)}",
                 ns)
    assert len(hooked) > 40 and list(ns["d"]) == ["transformer"]


def test_an_index_the_cell_computes_then_a_submodule_is_read_in_any_order(default_model):
    """`model.transformer.h[i].attn` with `i` from `reversed(range(...))` or a list of layers of interest: what
    the path names in every block is hooked before the run, as `model.transformer.h[i]` is."""
    model = default_model
    before = model_state(model)
    ns = {"model": model}
    result = nbgrad.trace(model, IDS_TEXT, """
attn = [model.transformer.h[i].attn.output[0].save() for i in reversed(range(len(model.transformer.h)))]
mlp = [model.transformer.h[i].mlp.c_proj.output.save() for i in [3, 1]]
""", ns)
    layers = len(model.transformer.h)
    names = [f"transformer.h.{i}.attn" for i in range(layers)] + [f"transformer.h.{i}.mlp.c_proj" for i in (3, 1)]
    seen, _ = hooked_outputs(model, result.input_ids, names)
    for index, value in enumerate(ns["attn"]):
        assert torch.equal(value, seen[f"transformer.h.{layers - 1 - index}.attn"][0]), index
    assert torch.equal(ns["mlp"][0], seen["transformer.h.3.mlp.c_proj"])
    assert torch.equal(ns["mlp"][1], seen["transformer.h.1.mlp.c_proj"])
    assert_clean(model, before)


def test_a_loop_that_edits_gradients_in_forward_order_is_told_the_order_of_the_pass(tiny, ids):
    before = model_state(tiny)
    with pytest.raises(nbgrad.OrderError, match=r"line 6: a.grad is edited too late: .*a loop that edits gradients "
                                                r"must visit them in the order the pass computes them \(the last"):
        nbgrad.trace(tiny, ids, """
acts = [b.output for b in model.transformer.h]
loss = model.output.logits.sum()
with loss.backward():
    for a in acts:
        a.grad[:] = 0
""")
    tiny.zero_grad()
    assert_clean(tiny, before)
    ns = {"model": tiny}
    nbgrad.trace(tiny, ids, """
acts = [b.output for b in model.transformer.h]
loss = model.output.logits.sum()
with loss.backward():
    for a in reversed(acts):
        a.grad[:] = 0
g = model.transformer.h[0].mlp.c_fc.weight.grad.save()
""", ns)
    tiny.zero_grad()
    assert ns["g"].abs().sum() == 0       # every block's gradient zeroed: nothing reaches block 0's weights


def test_gradients_of_what_a_loop_reaches_come_in_any_order(tiny, ids):
    """`b.mlp.output.grad` and `model.transformer.h[i].mlp.output.grad` read in forward order inside the block:
    every element's tensor is hooked when the pass starts, as `b.output.grad` is, so none flows past unseen.
    Against tensor hooks on the same weights."""
    before = model_state(tiny)
    ns = {"model": tiny}
    nbgrad.trace(tiny, ids, """
loss = model.output.logits[0, -1].max()
with loss.backward():
    through = [b.mlp.output.grad.save() for b in model.transformer.h]
    indexed = [model.transformer.h[i].mlp.c_fc.output.grad.save() for i in range(len(model.transformer.h))]
""", ns)
    tiny.zero_grad()
    layers = len(tiny.transformer.h)
    names = [f"transformer.h.{i}.{path}" for path in ("mlp", "mlp.c_fc") for i in range(layers)]
    _, _, grads, _ = hooked(tiny, ids, names, loss=lambda out: out.logits[0, -1].max())
    tiny.zero_grad()
    for i in range(layers):
        assert torch.allclose(ns["through"][i], grads[f"transformer.h.{i}.mlp"])
        assert torch.allclose(ns["indexed"][i], grads[f"transformer.h.{i}.mlp.c_fc"])
    assert_clean(tiny, before)


@pytest.mark.parametrize("cell", [
    "layers = model.transformer.h\nresid = [b.output.save() for b in reversed(layers)]",
    "layers = model.transformer.h\nresid = [layers[i].output.save() for i in reversed(range(len(layers)))]",
    "blocks = list(model.transformer.h)\nresid = [blocks[i].output.save() for i in (3, 2, 1, 0)]",
    "blocks = list(model.transformer.h)\nblocks.reverse()\nresid = [b.output.save() for b in blocks]",
])
def test_a_name_the_cell_binds_to_the_blocks_reads_them_in_any_order(tiny, ids, cell):
    """`layers = model.transformer.h` in the cell, then a loop over `reversed(layers)`: hooked ahead once the
    statements that bind and change `layers` have run, as `reversed(model.transformer.h)` is. Against forward
    hooks."""
    before = model_state(tiny)
    ns = {"model": tiny}
    nbgrad.trace(tiny, ids, cell, ns)
    outputs = hooked(tiny, ids, [f"transformer.h.{i}" for i in range(4)])[0]
    assert len(ns["resid"]) == 4
    for value, index in zip(ns["resid"], (3, 2, 1, 0)):
        assert torch.equal(value, outputs[f"transformer.h.{index}"])
    assert_clean(tiny, before)


def test_a_name_the_cell_binds_reads_blocks_in_any_order_at_every_generation_step(tiny):
    """In `%%generate` the targets are hooked before each step's statements start: one that reads a name the
    step binds is hooked once that statement has run. Against the same loop in forward order."""
    ns = {"model": tiny}
    prompt = torch.tensor([[3, 14, 15]])
    nbgrad.generate(tiny, prompt, "layers = model.transformer.h\n"
                                  "back = [b.output[0, -1].save() for b in reversed(layers)]", ns, max_new_tokens=3)
    nbgrad.generate(tiny, prompt, "fore = [b.output[0, -1].save() for b in model.transformer.h]", ns,
                    max_new_tokens=3)
    assert len(ns["back"]) == len(ns["fore"]) == 3
    for back, fore in zip(ns["back"], ns["fore"]):
        assert all(torch.equal(a, b) for a, b in zip(back, reversed(fore)))


@pytest.mark.parametrize("made", ["iter(model.transformer.h)", "(b for b in model.transformer.h)"])
@pytest.mark.parametrize("loop", ["[b.output.save() for b in it]", "[b.output.save() for _, b in enumerate(it)]"])
def test_an_iterator_of_the_users_is_left_for_the_loop_to_consume(tiny, ids, made, loop):
    """Hooking a loop's modules ahead must not iterate an iterator the user made: the loop would find it
    empty and save nothing. It is left to the loop, which reads in forward order. Against forward hooks."""
    before = model_state(tiny)
    ns = {"model": tiny}
    exec(f"it = {made}", ns)
    nbgrad.trace(tiny, ids, f"resid = {loop}", ns)
    outputs = hooked(tiny, ids, [f"transformer.h.{i}" for i in range(4)])[0]
    assert len(ns["resid"]) == 4
    for index, value in enumerate(ns["resid"]):
        assert torch.equal(value, outputs[f"transformer.h.{index}"])
    assert_clean(tiny, before)


@pytest.mark.parametrize("cell, order", [
    ("def attn_of(b):\n    return b.attn.output[0]\nouts = [attn_of(b).save() for b in reversed(model.transformer.h)]",
     (3, 2, 1, 0)),
    ("def attn_of(block):\n    return block.attn.output[0]\nouts = [attn_of(x).save() for x in model.transformer.h[::-1]]",
     (3, 2, 1, 0)),
    ("def attn_at(i):\n    return model.transformer.h[i].attn.output[0]\nouts = [attn_at(i).save() for i in (2, 0, 3)]",
     (2, 0, 3)),
    ("def attn_of(b, scale=1):\n    return b.attn.output[0] * scale\n"
     "outs = [attn_of(scale=1, b=b).save() for b in reversed(model.transformer.h)]", (3, 2, 1, 0)),
    ("def attns(blocks):\n    return [b.attn.output[0].save() for b in reversed(blocks)]\n"
     "outs = attns(model.transformer.h)", (3, 2, 1, 0)),
    ("def attns(blocks):\n    return [b.attn.output[0].save() for b in blocks]\n"
     "outs = attns(model.transformer.h[::-2])", (3, 1)),
])
def test_a_function_the_cell_defines_reads_what_each_call_passes_in_any_order(tiny, ids, cell, order):
    """A loop that calls the cell's own function: what the function reads of its parameter, for what each call
    passes, is hooked before the run (`b.attn` of every block), as the same read written in the loop is.
    Against forward hooks."""
    before = model_state(tiny)
    ns = {"model": tiny}
    nbgrad.trace(tiny, ids, cell, ns)
    outputs = hooked(tiny, ids, [f"transformer.h.{i}.attn" for i in range(4)])[0]
    assert len(ns["outs"]) == len(order)
    for value, index in zip(ns["outs"], order):
        assert torch.equal(value, outputs[f"transformer.h.{index}.attn"][0])
    assert_clean(tiny, before)


def test_an_edit_inside_a_function_the_cell_defines_is_an_edit(tiny, ids):
    """`def zero(b): b.mlp.output[:] = 0` edits: called in call order it is the hooks' edit; called in reverse it
    is an error that says why (its edits of blocks that have run would be lost), not a silent no-op."""
    before = model_state(tiny)
    body = "def zero(b):\n    b.mlp.output[:] = 0\nfor b in {blocks}:\n    zero(b)\nlogits = model.output.logits.save()"
    result = nbgrad.trace(tiny, ids, body.format(blocks="model.transformer.h"), {"model": tiny})
    names = [f"transformer.h.{i}.mlp" for i in range(4)]
    _, logits = hooked_outputs(tiny, ids, names, lambda name, output: torch.zeros_like(output))
    assert torch.allclose(result.saved["logits"], logits, atol=1e-6)
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(tiny, ids, body.format(blocks="reversed(model.transformer.h)"), {"model": tiny})
    assert str(caught.value).startswith("line 2: b.mlp.output is edited too late: b.mlp has already run")
    assert "must visit the modules in the order the model calls them" in str(caught.value)
    assert_clean(tiny, before)
