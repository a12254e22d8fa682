"""The forward side of the engine, each case against raw forward hooks on the same weights."""
import gc
import weakref

import pytest
import torch
from torch import nn

import nbgrad
from nbgrad.engine.compile.compiler import compile_cell
from helpers import assert_clean, hooked, model_state, tiny_gpt2


def raw_outputs(model, ids, modules, edit=None):
    """Run with plain register_forward_hook: the outputs of `modules` (after `edit`), and the logits."""
    seen, handles = {}, []
    for index, module in enumerate(modules):
        def hook(mod, args, output, index=index):
            if edit is not None:
                replaced = edit(index, output)
                if replaced is not None:
                    output = replaced
            seen[index] = output
            return output
        handles.append(module.register_forward_hook(hook))
    try:
        logits = model(ids).logits
    finally:
        for handle in handles:
            handle.remove()
    return seen, logits


def test_reads_out_of_execution_order(tiny, ids):
    before = model_state(tiny)
    result = nbgrad.trace(tiny, ids, """
last = model.transformer.h[-1].output.save()
first = model.transformer.h[0].output.save()
mid = model.transformer.h[2].mlp.output.save()
""")
    blocks = tiny.transformer.h
    seen, _ = raw_outputs(tiny, ids, [blocks[3], blocks[0], blocks[2].mlp])
    assert torch.equal(result.saved["last"], seen[0])
    assert torch.equal(result.saved["first"], seen[1])
    assert torch.equal(result.saved["mid"], seen[2])
    assert list(result.saved) == ["last", "first", "mid"]
    assert_clean(tiny, before)


def test_read_of_later_layer_then_earlier_inside_one_statement(tiny, ids):
    result = nbgrad.trace(tiny, ids, "diff = (model.transformer.h[3].output - model.transformer.h[1].output).save()")
    seen, _ = raw_outputs(tiny, ids, [tiny.transformer.h[3], tiny.transformer.h[1]])
    assert torch.allclose(result.saved["diff"], seen[0] - seen[1])


def test_replace_output(tiny, ids):
    before = model_state(tiny)
    result = nbgrad.trace(tiny, ids, """
model.transformer.h[1].output = model.transformer.h[1].output * 2 + 1
logits = model.output.logits.save()
""")
    _, logits = raw_outputs(tiny, ids, [tiny.transformer.h[1]], edit=lambda i, out: out * 2 + 1)
    assert torch.allclose(result.saved["logits"], logits)
    plain = tiny(ids).logits
    assert not torch.allclose(plain, logits)
    assert_clean(tiny, before)


def test_in_place_edit_reaches_later_modules(tiny, ids):
    result = nbgrad.trace(tiny, ids, """
before = model.transformer.h[0].output.clone().save()
model.transformer.h[0].output[:, -1] = 0
after = model.transformer.h[0].output.save()
logits = model.lm_head.output.save()
""")

    def edit(index, out):
        out[:, -1] = 0
    seen, logits = raw_outputs(tiny, ids, [tiny.transformer.h[0]], edit=edit)
    assert torch.allclose(result.saved["logits"], logits)
    assert torch.equal(result.saved["after"], seen[0])
    assert result.saved["after"][:, -1].abs().sum() == 0
    assert result.saved["before"][:, -1].abs().sum() > 0


def test_per_layer_loop_scales_every_block(tiny, ids):
    before = model_state(tiny)
    result = nbgrad.trace(tiny, ids, """
for i in range(len(model.transformer.h)):
    model.transformer.h[i].output[:] *= 0.5
logits = model.output.logits.save()
""")

    def edit(index, out):
        out.mul_(0.5)
    _, logits = raw_outputs(tiny, ids, list(tiny.transformer.h), edit=edit)
    assert torch.allclose(result.saved["logits"], logits)
    assert_clean(tiny, before)


def test_loop_reading_in_reverse_order_uses_kept_values(tiny, ids):
    ns = {"model": tiny}
    result = nbgrad.trace(tiny, ids, """
norms = []
for i in reversed(range(4)):
    norms.append(model.transformer.h[i].output.norm().item())
""", ns)
    seen, _ = raw_outputs(tiny, ids, list(tiny.transformer.h))
    expected = [seen[i].norm().item() for i in (3, 2, 1, 0)]
    assert result.saved == {}
    # `norms` holds floats, not traced tensors: it stays bound in the namespace
    assert ns["norms"] == pytest.approx(expected, rel=1e-6)
    nbgrad.trace(tiny, ids, "norms = [model.transformer.h[i].output.norm().item() for i in (3, 2, 1, 0)]", ns)
    assert ns["norms"] == pytest.approx(expected, rel=1e-6)


def test_input_and_inputs(tiny, ids):
    ns = {"model": tiny}
    result = nbgrad.trace(tiny, ids, """
x = model.transformer.h[2].input.save()
args, kwargs = model.transformer.h[2].inputs
first = args[0].save()
kwarg_names = sorted(kwargs)
n_args = len(args)
""", ns)
    seen, _ = raw_outputs(tiny, ids, [tiny.transformer.h[1]])
    called = {}
    handle = tiny.transformer.h[2].register_forward_pre_hook(
        lambda mod, args, kwargs: called.update(args=args, kwargs=kwargs), with_kwargs=True)
    try:
        tiny(ids)
    finally:
        handle.remove()
    assert torch.equal(ns["x"], seen[0])
    assert torch.equal(ns["first"], called["args"][0])
    assert any(torch.equal(value, seen[0]) for value in result.saved.values())
    assert ns["n_args"] == len(called["args"])
    assert ns["kwarg_names"] == sorted(called["kwargs"]) and ns["kwarg_names"]


def test_input_replacement(tiny, ids):
    result = nbgrad.trace(tiny, ids, """
model.transformer.ln_f.input = model.transformer.ln_f.input * 0
logits = model.output.logits.save()
""")

    def pre(mod, args):
        return (args[0] * 0,)
    handle = tiny.transformer.ln_f.register_forward_pre_hook(pre)
    try:
        expected = tiny(ids).logits
    finally:
        handle.remove()
    assert torch.allclose(result.saved["logits"], expected)


def test_plain_module_with_tensor_input():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    result = nbgrad.trace(net, x, """
hidden = model[1].output.save()
model[0].output[:] = model[0].output.abs()
out = model.output.save()
""")
    seen = {}
    h0 = net[0].register_forward_hook(lambda m, a, o: o.abs())
    h1 = net[1].register_forward_hook(lambda m, a, o: seen.setdefault("hidden", o))
    try:
        expected = net(x)
    finally:
        h0.remove(), h1.remove()
    assert torch.allclose(result.saved["out"], expected)
    assert torch.allclose(result.saved["hidden"], seen["hidden"])


def test_batch_of_prompts_is_one_padded_batch(default_model):
    tokenizer = nbgrad.tokenizer_for(default_model)
    prompts = ["Hello World", "The cat sat on the mat"]
    result = nbgrad.trace(default_model, prompts, "hs = model.transformer.h[1].output.save()")
    # padded on the left, with positions counted from each row's first real token (as invokes are)
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    positions = (encoded["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    seen = {}
    handle = default_model.transformer.h[1].register_forward_hook(lambda m, a, o: seen.setdefault("hs", o))
    try:
        default_model(**encoded, position_ids=positions)
    finally:
        handle.remove()
    assert result.saved["hs"].shape[0] == 2
    assert torch.equal(result.saved["hs"], seen["hs"])


def test_dict_and_tuple_inputs(tiny, ids):
    by_dict = nbgrad.trace(tiny, {"input_ids": ids}, "out = model.output.logits.save()")
    by_tuple = nbgrad.trace(tiny, (ids,), "out = model.output.logits.save()")
    assert torch.equal(by_dict.saved["out"], by_tuple.saved["out"])
    assert torch.equal(by_dict.saved["out"], tiny(ids).logits)


def test_magic_and_api_give_the_same_values(shell, tiny, ids):
    shell.user_ns.update(tiny_model=tiny, ids=ids)
    before = model_state(tiny)
    shell.run_cell_magic("trace", "tiny_model ids -q", """
hs = tiny_model.transformer.h[2].output.save()
tiny_model.transformer.h[0].output[:] *= 3
logits = tiny_model.output.logits.save()
""")
    api = nbgrad.trace(tiny, ids, """
hs = model.transformer.h[2].output.save()
model.transformer.h[0].output[:] *= 3
logits = model.output.logits.save()
""")
    assert torch.equal(shell.user_ns["hs"], api.saved["hs"])
    assert torch.equal(shell.user_ns["logits"], api.saved["logits"])
    assert type(shell.user_ns["hs"]) is torch.Tensor
    assert_clean(tiny, before)


def test_saved_values_keep_autograd_history(tiny, ids):
    result = nbgrad.trace(tiny, ids, "hs = model.transformer.h[1].output.save()")
    assert result.saved["hs"].grad_fn is not None


def test_nothing_outlives_the_cell_but_what_was_saved(tiny, ids):
    refs = {}

    class Watch(nn.Module):
        pass
    ns = {"model": tiny, "refs": refs, "weakref": weakref}
    gc.disable()
    try:
        nbgrad.trace(tiny, ids, """
h0 = model.transformer.h[0].output.save()
h2 = model.transformer.h[2].output
h3 = model.transformer.h[3].output
refs['h2'] = weakref.ref(h2)
refs['h3'] = weakref.ref(h3)
refs['logits'] = weakref.ref(model.output.logits)
""", ns)
        assert "h0" in ns and "h2" not in ns and "h3" not in ns
        assert refs["h2"]() is None and refs["h3"]() is None and refs["logits"]() is None
        handles_seen = []
        original = nn.Module.register_forward_hook

        def spy(self, *args, **kwargs):
            handle = original(self, *args, **kwargs)
            handles_seen.append(weakref.ref(handle))
            return handle
        nn.Module.register_forward_hook = spy
        try:
            nbgrad.trace(tiny, ids, "x = model.transformer.h[1].output.save()", {"model": tiny})
        finally:
            nn.Module.register_forward_hook = original
        assert handles_seen and all(ref() is None for ref in handles_seen)
    finally:
        gc.enable()


def test_unsaved_name_raises_name_error_that_says_to_save(shell, tiny, ids):
    shell.user_ns.update(tiny_model=tiny, ids=ids)
    shell.run_cell_magic("trace", "tiny_model ids -q", "kept = tiny_model.transformer.h[0].output.save()\n"
                                                      "lost = tiny_model.transformer.h[1].output\n"
                                                      "count = 3")
    assert "kept" in shell.user_ns and shell.user_ns["count"] == 3 and "lost" not in shell.user_ns
    result = shell.run_cell("lost")
    assert isinstance(result.error_in_exec, NameError)
    assert ".save()" in str(result.error_in_exec) and "lost" in str(result.error_in_exec)


def test_the_unsaved_names_kept_are_those_of_the_namespaces_used_last(shell, tiny, ids):
    """Traces in namespaces of their own (a loop of `nbgrad.trace` without one makes one per call) leave names unsaved
    in each: those kept do not add up, and the notebook's namespace, used every so often meanwhile, keeps its
    NameError hint throughout."""
    from nbgrad.engine.run import cellstate
    shell.user_ns.update(tiny_model=tiny, ids=ids)
    cellstate._unsaved.pop(id(shell.user_ns), None)     # the shell is shared: what earlier tests left unsaved in it
    unsaved, namespaces = "lost = tiny_model.transformer.h[1].output", []
    shell.run_cell_magic("trace", "tiny_model ids -q", unsaved)
    for index in range(3 * cellstate._UNSAVED_KEPT):
        namespaces.append({"model": tiny})           # each alive, so each has an id of its own
        nbgrad.trace(tiny, ids, "lost = model.transformer.h[1].output", namespaces[-1])
        if index % (cellstate._UNSAVED_KEPT // 2) == 0:
            shell.run_cell_magic("trace", "tiny_model ids -q", unsaved)
        assert cellstate.unsaved_names(shell.user_ns) == {"lost": "Tensor"}, index
    assert len(cellstate._unsaved) <= cellstate._UNSAVED_KEPT
    assert ".save()" in str(shell.run_cell("lost").error_in_exec)


def test_a_container_unbound_for_an_unsaved_value_says_to_save_its_values(shell, tiny, ids):
    """A dict that holds one saved and one unsaved traced value is unbound (it holds a value of the trace);
    the NameError says so, and saving each value keeps the dict."""
    shell.user_ns.update(tiny_model=tiny, ids=ids)
    mixed = "d = {}\nd['x'] = tiny_model.transformer.h[0].output\nd['y'] = tiny_model.transformer.h[1].output.save()"
    shell.run_cell_magic("trace", "tiny_model ids -q", mixed)
    message = str(shell.run_cell("d").error_in_exec)
    assert message == ("name 'd' is not defined: it was bound inside a %%trace cell to a dict that holds a traced "
                       "value that was not saved. Save each value you keep in it (`d[...] = ....save()`), and the "
                       "dict stays after the cell")
    shell.run_cell_magic("trace", "tiny_model ids -q", mixed.replace("h[0].output", "h[0].output.save()"))
    assert sorted(shell.user_ns["d"]) == ["x", "y"]


def test_graph_option_shows_the_graph_without_running(shell, tiny, ids, capsys):
    shell.user_ns.update(tiny_model=tiny, ids=ids, calls=[])
    handle = tiny.register_forward_hook(lambda *a: shell.user_ns["calls"].append(1))
    try:
        shell.run_cell_magic("trace", "tiny_model ids --graph", "a = tiny_model.transformer.h[1].output.save()\n"
                                                               "tiny_model.transformer.h[0].output[:] = 0")
    finally:
        handle.remove()
    text = capsys.readouterr().out
    assert "tiny_model.transformer.h[1].output  [forward hook]  line 1 reads" in text
    assert "tiny_model.transformer.h[0].output  [forward hook]  line 2 writes" in text
    assert shell.user_ns["calls"] == []


def test_no_grad_option_runs_without_autograd(tiny, ids):
    result = nbgrad.trace(tiny, ids, "hs = model.transformer.h[0].output.save()", no_grad=True)
    assert result.saved["hs"].grad_fn is None
    assert torch.is_grad_enabled()


def test_functions_defined_in_a_cell_keep_working(tiny, ids):
    ns = {"model": tiny}
    nbgrad.trace(tiny, ids, "def double(v):\n    return 2 * v\nd = double(model.transformer.h[0].output).save()", ns)
    seen, _ = raw_outputs(tiny, ids, [tiny.transformer.h[0]])
    assert torch.equal(ns["d"], 2 * seen[0])
    assert ns["double"](3) == 6


def test_an_edit_inside_a_function_that_comes_too_late_is_an_error_not_lost(tiny, ids):
    """The function's body is rewritten from a copy: its in-place edits must still count as edits, so one that
    comes after its module ran says so instead of editing a tensor the model has already used."""
    before = model_state(tiny)
    cell = "def zero0(t):\n    model.transformer.h[0].output[:] = 0\nzero0(model.transformer.h[2].output)"
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(tiny, ids, cell, {"model": tiny})
    assert str(caught.value).startswith("line 2: model.transformer.h[0].output is edited too late: "
                                        "model.transformer.h[0] has already run")
    assert_clean(tiny, before)


def test_flags_restored_after_the_model_changes_shape(tiny, ids):
    nbgrad.trace(tiny, ids, "a = model.transformer.h[0].output.save()")
    tiny.extra = torch.nn.Linear(2, 2)
    before = model_state(tiny)
    nbgrad.trace(tiny, ids, "model.extra.weight.requires_grad_(False)\nb = model.transformer.h[0].output.save()")
    assert tiny.extra.weight.requires_grad
    assert_clean(tiny, before)


@pytest.mark.parametrize("source, plain", [
    ("h = model.transformer.h[0].output[:, -1].save()", True),
    ("model.transformer.h[0].output[:, 0] = 0.0\nmodel.transformer.h[1].output *= -1", True),
    ("with invoke('a'):\n    h = model.transformer.h[0].output.save()", True),
    ("model.transformer.wte.weight.requires_grad = False", False),
    ("model.requires_grad_(False)", False),
    ("h = model.transformer.h[0].output.clone().save()", True),
    ("hs = model.transformer.h[1].output\nloss = hs.float().norm(dim=-1).sum()\nwith loss.backward():\n"
     "    g = hs.grad.save()", True),
    ("with model.output.logits.sum().backward():\n    g = model.transformer.h[0].output.grad.save()", True),
    ("model.transformer.h[0].output.requires_grad_(False)", False),
    ("hs = model.transformer.h[0].output\nhs.register_hook(print)", False),
    ("w = model.transformer.wte.weight\nw.sum().save()", False),
    ("h = model.transformer.h[0].output.sum(prompt())", False),
    ("with model.output.logits.sum().backward(), torch.no_grad():\n    pass", False),
    ("with invoke(prompt()):\n    h = model.transformer.h[0].output.save()", False),
    ("h = [b.output.save() for b in model.transformer.h]", True),
    ("outs = [model.transformer.h[i].output.save() for i in range(len(model.transformer.h))]", True),
    ("for i in range(len(model.transformer.h)):\n    model.transformer.h[i].output[:] *= 0.5", True),
    ("for name, m in model.named_modules():\n    if name.endswith('mlp'):\n        x = m.output.save()", True),
    ("for p in model.parameters():\n    p.requires_grad = False", False),
    ("for b in model.transformer.h:\n    b.output.requires_grad_(False)", False),
    ("h = [freeze(b) for b in model.transformer.h]", False),
    ("len = model.requires_grad_\nlen(False)", False),
    ("print(model.transformer.h[0].output)", False),
])
def test_which_cells_cannot_change_a_flag(source, plain):
    """A cell that calls nothing but `.save()`, `invoke(...)`, tensor methods of traced values, module listings
    and a few counting builtins skips the flag snapshot: every other cell takes it."""
    assert compile_cell(source).calls_nothing is plain


def test_flags_set_without_a_call_are_restored(tiny, ids):
    before = model_state(tiny)
    nbgrad.trace(tiny, ids, "model.transformer.wte.weight.requires_grad = False\n"
                            "h = model.transformer.h[0].output.save()")
    assert tiny.transformer.wte.weight.requires_grad
    assert_clean(tiny, before)


def test_flags_set_inside_an_invoke_are_restored(default_model):
    before = model_state(default_model)
    nbgrad.trace(default_model, None, "with invoke('The cat sat'):\n"
                                      "    model.transformer.wte.weight.requires_grad = False\n"
                                      "    h = model.transformer.h[0].output.save()", {"model": default_model})
    assert default_model.transformer.wte.weight.requires_grad
    assert_clean(default_model, before)


def test_graph_text_lists_events_nodes_and_edges(tiny, ids):
    result = nbgrad.trace(tiny, ids, "hs = model.transformer.h[1].output\n"
                                     "with model.output.logits.sum().backward():\n    g = hs.grad.save()", graph=True)
    text = str(result.graph)
    assert "model.transformer.h[1].output  [forward hook]  line 1 reads" in text
    assert "hs.grad  [tensor hook]  line 3 reads" in text
    assert "pass 0: line 2 (with-block)" in text
    assert "model.transformer.h[1].output -> node 0" in text and "node 0 -> node 2" in text
    assert result.saved == {}


NO_GRAD_AROUND_A_READ = """
with torch.no_grad():
    h1 = model.transformer.h[1].output.clone().save()
loss = model.output.logits[0, -1].max()
with loss.backward():
    g0 = model.transformer.h[0].output.grad.save()
    with torch.no_grad():
        g2 = (model.transformer.h[2].output.grad * 2).save()
"""


def test_a_statement_paused_inside_no_grad_does_not_take_the_model_with_it(tiny, ids):
    """`with torch.no_grad():` around a read pauses the statement inside the block until the event comes. Grad
    mode is the thread's, so the model ran on without autograd up to that event: block 0's output had no
    gradient. Now the statement keeps its mode to itself. Against tensor hooks on the same weights."""
    before = model_state(tiny)
    ns = {"model": tiny, "torch": torch}
    nbgrad.trace(tiny, ids, NO_GRAD_AROUND_A_READ, ns)
    tiny.zero_grad()
    seen, _, grads, _ = hooked(tiny, ids, [f"transformer.h.{index}" for index in (0, 1, 2)],
                               loss=lambda out: out.logits[0, -1].max())
    tiny.zero_grad()
    assert not ns["h1"].requires_grad and torch.equal(ns["h1"], seen["transformer.h.1"].detach())
    assert torch.allclose(ns["g0"], grads["transformer.h.0"]) and torch.allclose(ns["g2"], grads["transformer.h.2"] * 2)
    assert torch.is_grad_enabled()
    assert_clean(tiny, before)


@pytest.mark.parametrize("context", ["torch.inference_mode()", "torch.autocast('cpu', dtype=torch.bfloat16)"])
def test_a_statement_that_would_pause_inside_inference_mode_or_autocast_says_so(tiny, ids, context):
    """Those modes are the thread's, and nbgrad cannot hand them back and forth as it does grad mode: the model ran
    in them until the event (block 0 in bfloat16, or a crash inside the model in inference mode). Refused, with
    what to write instead; the same block around a value that already exists works."""
    before = model_state(tiny)
    ns = {"model": tiny, "torch": torch}
    with pytest.raises(nbgrad.NbgradError, match=r"line 3: this statement waits for an event inside a `with` block "
                                                 r"that sets inference mode or autocast.*Read the value first"):
        nbgrad.trace(tiny, ids, f"h0 = model.transformer.h[0].output.save()\nwith {context}:\n"
                                "    h = model.transformer.h[1].output.float().save()\n", ns)
    assert not torch.is_inference_mode_enabled() and not torch.is_autocast_enabled("cpu")
    assert_clean(tiny, before)
    nbgrad.trace(tiny, ids, f"h = model.transformer.h[1].output\nwith {context}:\n    y = (h * 2).save()\n"
                            "z = model.transformer.h[0].output.save()", ns)
    assert ns["z"].dtype == torch.float32 and ns["z"].requires_grad
    assert_clean(tiny, before)
    with pytest.raises(nbgrad.NbgradError, match="line 4: this statement waits for an event inside a `with` block"):
        nbgrad.trace(tiny, ids, f"h = model.transformer.h[1].output\nwith {context}:\n"
                                "    y = (h * model.transformer.h[0].output).save()\n"     # block 0 has run: answered
                                "    z = model.transformer.h[3].output.float().save()", ns)    # then it pauses
    assert_clean(tiny, before)


def test_a_deleted_model_is_freed_by_the_caches_read_before_every_cell(ids):
    """The caches that spare each cell its checks (the model's input embeddings and token limits, ids already
    checked) hold a model weakly: once the notebook lets it go, it goes, and nothing of it stays in them."""
    from nbgrad.models import inputs, limits
    model = tiny_gpt2()
    for _ in range(2):      # the second cell reads what the first kept
        saved = nbgrad.trace(model, ids, "h = model.transformer.h[0].output.save()").saved["h"]
    assert id(model) in limits._limits and id(model) in limits._embeddings
    gone, model_id = weakref.ref(model), id(model)
    del model
    gc.collect()
    assert gone() is None
    assert model_id not in limits._limits and model_id not in limits._embeddings
    assert all(type(entry[2]) is weakref.ref for entry in inputs._checked.values())   # dead ones bounded in number
    assert saved.shape[:2] == ids.shape
