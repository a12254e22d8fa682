"""`cache(...)` in a cell and `nbgrad.run_with_cache`, each case against plain forward hooks / tensor hooks
on the same weights."""
import re

import pytest
import torch
from torch import nn

import nbgrad
from nbgrad.engine.results.cache import main_tensor
from helpers import assert_clean, hooked, model_state

IDS = torch.tensor([[5, 9, 2, 7, 11]])


def tensors_in(value):
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for v in value for t in tensors_in(v)] if isinstance(value, (list, tuple)) else []


def same(a, b):
    return torch.equal(main_tensor(a), main_tensor(b))


def test_every_module_of_the_embedded_model(default_model):
    before = model_state(default_model)
    ns = {"model": default_model}
    nbgrad.trace(default_model, IDS, "c = cache()", ns)
    outputs, _, _, _ = hooked(default_model, IDS)
    c = ns["c"]
    assert isinstance(c, nbgrad.Cache)
    assert list(c) == list(outputs)             # the modules that fired, in call order (the root last)
    assert len(c) > 40 and "transformer.h" not in c        # a ModuleList never runs
    for path in outputs:
        assert same(c[path], outputs[path]), path
    # each element once: two tensors that show the same elements of one storage count once
    every = {(t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride()): t.nelement() * t.element_size()
             for v in outputs.values() for t in tensors_in(v)}
    assert c.nbytes == sum(every.values()) > 0
    assert_clean(default_model, before)


def test_a_glob_with_grads(tiny):
    ns = {"model": tiny}
    nbgrad.trace(tiny, IDS, """
c = cache("transformer.h.*", grads=True)
model.output.logits[0, -1].max().backward()
""", ns)
    tiny.zero_grad()
    before = model_state(tiny)
    names = [n for n, _ in tiny.named_modules() if n.startswith("transformer.h.")]
    outputs, _, grads, _ = hooked(tiny, IDS, names, loss=lambda out: out.logits[0, -1].max())
    tiny.zero_grad()
    c = ns["c"]
    assert set(c) == {n for n in names if n in outputs}
    assert list(c.grads) == [n for n in c if n in grads]     # forward order
    assert set(c.grads) == set(grads) and len(grads) > 8
    for path, grad in grads.items():
        assert torch.allclose(c.grads[path], grad), path
    assert_clean(tiny, before)


def test_inputs(tiny):
    """`Cache.inputs`, after the cell and read in it: `c.inputs` is the cache's attribute, not a module's event, so
    the statement runs once the cache is whole (it ran first, and found it empty)."""
    ns = {"model": tiny}
    nbgrad.trace(tiny, IDS, "c = cache(['transformer.h.1', model.lm_head], inputs=True)\n"
                            "x = c.inputs['transformer.h.1'].save()", ns)
    outputs, inputs, _, _ = hooked(tiny, IDS, ["transformer.h.1", "lm_head"])
    c = ns["c"]
    assert list(c) == ["transformer.h.1", "lm_head"] and list(c.inputs) == list(c)
    for path in c:
        assert torch.equal(c.inputs[path], inputs[path]) and torch.equal(c[path], outputs[path])
    assert torch.equal(ns["x"], inputs["transformer.h.1"])
    with pytest.raises(nbgrad.NbgradError, match="grads=True"):
        c.grads


def test_device_and_dtype_keep_detached_cast_copies(tiny):
    ns = {"model": tiny, "torch": torch}
    nbgrad.trace(tiny, IDS, """
c = cache("transformer.h.?", device="cpu", dtype=torch.float16, grads=True)
model.output.logits[0, -1].max().backward()
""", ns)
    outputs, _, grads, _ = hooked(tiny, IDS, [f"transformer.h.{i}" for i in range(4)],
                                  loss=lambda out: out.logits[0, -1].max())
    tiny.zero_grad()
    c = ns["c"]
    for path, value in c.items():
        assert value.dtype == torch.float16 and value.device.type == "cpu"
        assert not value.requires_grad and value.grad_fn is None
        assert torch.equal(value, outputs[path].detach().half())
        assert c.grads[path].dtype == torch.float16 and torch.equal(c.grads[path], grads[path].half())
    assert c.nbytes == 2 * 2 * sum(v.nelement() for v in c.values())     # outputs and grads, 2 bytes each


def test_stack_in_forward_order(tiny):
    ns = {"model": tiny}
    nbgrad.trace(tiny, IDS, "c = cache()", ns)
    outputs, _, _, _ = hooked(tiny, IDS)
    c = ns["c"]
    blocks = [f"transformer.h.{i}" for i in range(4)]
    expected = torch.stack([outputs[p] for p in blocks])
    assert torch.equal(c.stack("transformer.h.?"), expected)
    assert c["model.transformer.h[2]"] is c["transformer.h.2"]            # a path as the cell writes it
    with pytest.raises(KeyError, match="the run called no cached module of that path"):
        c["transformer.h.9"]
    assert torch.equal(c.stack(blocks[::-1]), expected)      # forward order, whatever order is asked
    with pytest.raises(nbgrad.NbgradError, match="different shapes"):
        c.stack(["transformer.h.0", "transformer.h.0.attn.c_attn"])
    with pytest.raises(nbgrad.NbgradError) as caught:       # each shape's paths, and those a subtree's glob meant
        c.stack("transformer.h.*")
    assert str(caught.value) == (
        "Cache.stack: the values have different shapes ((1, 5, 32) at 'transformer.h.0.ln_1', "
        "'transformer.h.0.attn.c_proj', ...; (1, 5, 96) at 'transformer.h.0.attn.c_attn', 'transformer.h.1.attn.c_attn', "
        "...; (1, 5, 128) at 'transformer.h.0.mlp.c_fc', 'transformer.h.0.mlp.act', ...). Stack paths whose outputs "
        "have one shape: a list of paths (those nearest the root agree: ['transformer.h.0', 'transformer.h.1', "
        "'transformer.h.2', 'transformer.h.3']), or a narrower glob")
    with pytest.raises(nbgrad.NbgradError, match="no cached path matches"):
        c.stack("decoder.*")
    ns = {"model": tiny}
    nbgrad.trace(tiny, IDS, "blocks = cache(model.transformer.h)\nmodules = cache(model.transformer.h[1].children())", ns)
    assert list(ns["blocks"]) == blocks and torch.equal(ns["blocks"].stack(), expected)
    assert list(ns["modules"]) == ["transformer.h.1.ln_1", "transformer.h.1.attn", "transformer.h.1.ln_2",
                                   "transformer.h.1.mlp"]


def test_a_module_called_several_times_maps_to_its_list():
    torch.manual_seed(0)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(3, 3)

        def forward(self, x):
            return self.layer(self.layer(x))
    model, x = Twice(), torch.randn(2, 3)
    ns = {"model": model}
    nbgrad.trace(model, x, "c = cache('layer', grads=True)\n(model.output ** 2).sum().backward()", ns)
    model.zero_grad()
    calls, grads = [], {}

    def keep(module, args, output):
        index = len(calls)
        calls.append(output)
        output.register_hook(lambda grad: grads.__setitem__(index, grad))
    handle = model.layer.register_forward_hook(keep)
    try:
        (model(x) ** 2).sum().backward()
    finally:
        handle.remove()
    model.zero_grad()
    c = ns["c"]
    assert isinstance(c["layer"], list) and len(c["layer"]) == 2 and len(c.grads["layer"]) == 2
    for index in range(2):
        assert torch.allclose(c["layer"][index], calls[index])
        assert torch.allclose(c.grads["layer"][index], grads[index])


def test_the_cache_holds_the_edited_value(tiny):
    ns = {"model": tiny}
    nbgrad.trace(tiny, IDS, "c = cache('transformer.h.1')\nmodel.transformer.h[1].output[:, -1] = 0", ns)
    assert (ns["c"]["transformer.h.1"][:, -1] == 0).all()


def test_run_with_cache_with_a_loss(tiny):
    tiny.zero_grad()
    before = model_state(tiny)
    loss = lambda out: out.logits[0, -1].logsumexp(-1)      # noqa: E731
    output, c = nbgrad.run_with_cache(tiny, IDS, "transformer.h.*", grads=True, loss=loss)
    tiny.zero_grad()
    names = [n for n, _ in tiny.named_modules() if n.startswith("transformer.h.")]
    outputs, _, grads, expected = hooked(tiny, IDS, names, loss=loss)
    tiny.zero_grad()
    assert torch.equal(output.logits, expected.logits)
    assert set(c.grads) == set(grads)
    for path in grads:
        assert torch.allclose(c.grads[path], grads[path]) and same(c[path], outputs[path])
    assert_clean(tiny, before)
    with pytest.raises(nbgrad.NbgradError, match="needs loss="):
        nbgrad.run_with_cache(tiny, IDS, grads=True)
    # the call's errors speak of the call, with no line of the cell it runs inside
    with pytest.raises(nbgrad.GradError, match=r"^run_with_cache\(\.\.\., loss=\.\.\.\): loss\(output\) gave a "
                       r"tensor of shape \(1, 5, 97\), not a scalar: return the one number"):
        nbgrad.run_with_cache(tiny, IDS, grads=True, loss=lambda out: out.logits)
    with pytest.raises(nbgrad.NbgradError, match=r"^run_with_cache\(\.\.\.\): no module of the model matches "
                       r"'nothing\.\*'; its top-level modules: transformer, lm_head$"):
        nbgrad.run_with_cache(tiny, IDS, "nothing.*")
    assert_clean(tiny, before)
    _, plain = nbgrad.run_with_cache(tiny, IDS, "lm_head", dtype=torch.bfloat16)
    assert list(plain) == ["lm_head"] and plain["lm_head"].dtype == torch.bfloat16


def test_grads_of_every_module_include_the_model_itself_and_a_block_a_backward_waits_on(tiny):
    """The model's own output arrives as the backward statement that waits on it runs, and a block's output
    can be what a statement waiting on it backpropagates from: each still gets its gradient."""
    tiny.zero_grad()
    before = model_state(tiny)
    loss = lambda out: out.logits[0, -1].logsumexp(-1)      # noqa: E731
    _, c = nbgrad.run_with_cache(tiny, IDS, grads=True, loss=loss)
    tiny.zero_grad()
    _, _, grads, _ = hooked(tiny, IDS, loss=loss)
    tiny.zero_grad()
    assert "" in grads and set(c.grads) == set(grads)
    for path in grads:
        assert torch.allclose(c.grads[path], grads[path]), path
    ns = {"model": tiny}
    nbgrad.trace(tiny, IDS, "c = cache('transformer.h.1', grads=True)\n"
                 "model.transformer.h[1].output.sum().backward()", ns)
    tiny.zero_grad()
    assert torch.equal(ns["c"].grads["transformer.h.1"], torch.ones_like(ns["c"]["transformer.h.1"]))
    assert_clean(tiny, before)


def test_a_cache_per_generation_step(default_model):
    before = model_state(default_model)
    ns = {"model": default_model}
    result = nbgrad.generate(default_model, "The Eiffel Tower is in", "c = cache('lm_head')", ns,
                             max_new_tokens=3)
    kept = []
    handle = default_model.lm_head.register_forward_hook(lambda m, a, o: kept.append(o.clone()))
    try:
        ids = default_model.generate(**nbgrad.tokenizer_for(default_model)("The Eiffel Tower is in",
                                                                          return_tensors="pt"),
                                     max_new_tokens=3, do_sample=False)
    finally:
        handle.remove()
    assert torch.equal(result.output, ids)
    assert isinstance(ns["c"], list) and len(ns["c"]) == len(kept) == 3
    for step, cache in enumerate(ns["c"]):
        assert isinstance(cache, nbgrad.Cache) and torch.equal(cache["lm_head"], kept[step])
    assert_clean(default_model, before)


@pytest.mark.parametrize("source, message", [
    ("c = cache('transformer.hh.*')", "no module of the model matches 'transformer.hh.*'"),
    ("c = cache(grads=True)", "runs no backward pass"),
    ("c = cache(model.transformer.h[0].output)", "must run before the model does"),
    ("c = cache(3)", "takes a glob, a module path, a module or a list of them, not an int"),
])
def test_errors_name_the_line_and_leave_the_model_clean(tiny, source, message):
    before = model_state(tiny)
    with pytest.raises(nbgrad.NbgradError, match=message) as caught:
        nbgrad.trace(tiny, IDS, "x = model.lm_head.output.save()\n" + source, {"model": tiny})
    assert "line 2" in str(caught.value)
    assert_clean(tiny, before)
    assert nbgrad.trace(tiny, IDS, "c = cache('lm_head')").saved["c"]["lm_head"].shape[-1] == 97


def test_cache_kept_after_a_magic_cell(shell, tiny):
    shell.user_ns.update(model=tiny, ids=IDS)
    shell.run_cell("%%trace model ids -q\nc = cache('transformer.h.0')\nh = model.transformer.h[0].output", store_history=False)
    assert isinstance(shell.user_ns["c"], nbgrad.Cache) and "h" not in shell.user_ns
    outputs, _, _, _ = hooked(tiny, IDS, ["transformer.h.0"])
    assert torch.equal(shell.user_ns["c"]["transformer.h.0"], outputs["transformer.h.0"])


def test_an_interrupt_mid_run_leaves_no_cache_hook(tiny):
    before = model_state(tiny)
    with pytest.raises(KeyboardInterrupt):
        nbgrad.trace(tiny, IDS, """
c = cache(grads=True)
if model.transformer.h[1].output is not None:
    raise KeyboardInterrupt
model.output.logits.sum().backward()
""", {"model": tiny})
    assert_clean(tiny, before)


def test_the_cache_panel_has_a_row_per_module_and_the_memory(shell, tiny):
    ns = {"model": tiny}
    nbgrad.trace(tiny, IDS, "c = cache('transformer.h.?', grads=True)\nmodel.output.logits[0, -1].max().backward()",
                 ns)
    tiny.zero_grad()
    c = ns["c"]
    panel = nbgrad.show(c, name="c")
    bundle = panel._repr_mimebundle_()
    summary = c.summary()
    assert [row["path"] for row in summary["rows"]] == [p for path in c for p in (path, f"{path} grad×act")]
    outputs, _, grads, _ = hooked(tiny, IDS, list(c), loss=lambda out: out.logits[0, -1].max())
    tiny.zero_grad()
    norms = outputs["transformer.h.2"][0].norm(dim=-1)
    assert torch.allclose(torch.tensor(summary["rows"][4]["values"]), norms, atol=1e-5)
    signed = (outputs["transformer.h.2"][0] * grads["transformer.h.2"][0]).sum(-1)
    assert torch.allclose(torch.tensor(summary["rows"][5]["values"]), signed, atol=1e-5)
    assert bundle["text/html"].count("<tr>") == 1 + len(summary["rows"])
    assert "blue = negative" in bundle["text/html"]          # the diverging legend of the gradient rows
    assert f"{c.nbytes / 1024:.1f} KB" in bundle["text/plain"] and "transformer.h.3" in bundle["text/plain"]


def test_a_cell_shows_the_cache_panel(shell, tiny):
    from nbgrad.notebook.cells import split_caches
    shell.user_ns.update(model=tiny, ids=IDS)
    result = nbgrad.trace(tiny, IDS, "c = cache('lm_head')\nx = model.lm_head.output.save()", shell.user_ns)
    rest, panels = split_caches(result, nbgrad.tokenizer_for(tiny))
    assert list(rest.saved) == ["x"] and list(result.saved) == ["c", "x"]
    assert len(panels) == 1 and "lm_head" in panels[0].text()
    assert panels[0].tokens is None          # the tiny model has no tokenizer: positions are numbered
    assert "<th" in panels[0].html() and ">4</th>" in panels[0].html()


def test_a_cache_inside_an_invoke_holds_its_rows(default_model):
    ns = {"model": default_model}
    nbgrad.trace(default_model, None, """
with invoke("The Eiffel Tower is in the city of"):
    c = cache("transformer.h.1", grads=True)
with invoke("The Colosseum is in"):
    other = model.transformer.h[1].output.save()
model.output.logits[:, -1].max(-1).values.sum().backward()
""", ns)
    default_model.zero_grad()
    alone, _, grads, _ = hooked(default_model, nbgrad.tokenizer_for(default_model)(
        "The Eiffel Tower is in the city of", return_tensors="pt")["input_ids"], ["transformer.h.1"],
        loss=lambda out: out.logits[:, -1].max(-1).values.sum())
    default_model.zero_grad()
    c = ns["c"]
    assert c["transformer.h.1"].shape == alone["transformer.h.1"].shape       # one row: its own, not the batch
    assert torch.allclose(c["transformer.h.1"], alone["transformer.h.1"], atol=1e-4)
    assert torch.allclose(c.grads["transformer.h.1"], grads["transformer.h.1"], atol=1e-4)


NO_CUDA = "cache(device='cuda'): this machine cannot hold tensors there"


@pytest.mark.parametrize("option, says", [("device='nope'", "cache(device='nope'): not a device torch knows"),
                                          ("dtype='half'", "cache(dtype='half'): give a torch.dtype"),
                                          pytest.param("device='cuda'", NO_CUDA, marks=pytest.mark.skipif(
                                              torch.cuda.is_available(), reason="this machine has CUDA"))])
def test_a_bad_device_or_dtype_is_refused_before_the_run(tiny, option, says):
    before = model_state(tiny)
    ran = []
    handle = tiny.register_forward_hook(lambda *_: ran.append(1))
    try:
        with pytest.raises(nbgrad.NbgradError, match=re.escape(says)) as error:
            nbgrad.trace(tiny, IDS, f"c = cache('*', {option})", {"model": tiny})
    finally:
        handle.remove()
    assert error.value.line == 1 and ran == []
    assert_clean(tiny, before)


def test_a_model_whose_top_module_is_named_model_is_found_by_its_own_paths():
    """Llama's blocks are `model.layers.N` in `named_modules()`: `cache`, `Cache[...]`, `attribute(site=)` and
    `attribution_patching(sites=)` take that path as written (they once dropped the `model.` in front, as
    they do for a notebook path such as `model.transformer.h[3]`, and found nothing); the notebook's own
    spelling, `model.model.layers[0]`, still works."""
    from sitemodels import llama
    model = llama()
    before = model_state(model)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    namespace = {"model": model}
    nbgrad.trace(model, ids, "c = cache('model.layers.*')\nd = cache(['model.model.layers[1]'])", namespace)
    outputs, _, _, _ = hooked(model, ids)
    cache, other = namespace["c"], namespace["d"]
    assert [path for path in cache if path.count(".") == 2] == ["model.layers.0", "model.layers.1"]
    assert list(other) == ["model.layers.1"]
    torch.testing.assert_close(main_tensor(cache["model.layers.0"]), main_tensor(outputs["model.layers.0"]))
    assert cache["model.model.layers[0]"] is cache["model.layers.0"]
    assert cache.stack("model.layers.?").shape[0] == 2
    by_path = nbgrad.attribute(model, ids, 5, method="saliency", site="model.layers.1")
    assert by_path.sites == ["model.layers.1"]
    assert nbgrad.attribute(model, ids, 5, method="saliency", site="model.model.layers[-1]").sites == ["model.layers.1"]
    patched = nbgrad.attribution_patching(model, ids, ids.flip(-1), lambda logits: logits[0, -1, 5],
                                          sites="model.layers.?")
    assert patched.sites == ["model.layers.0", "model.layers.1"]
    assert_clean(model, before)


CACHE_READ_AFTER = """
c = cache("transformer.h.*", grads=True)
n = len(c)
diff = (c["transformer.h.1"] - c["transformer.h.0"]).norm().save()
loss = model.output.logits[0, -1].max()
with loss.backward():
    g = c.grads["transformer.h.0"].save()
    n_grads = len(c.grads)
"""


def test_a_statement_that_reads_the_cache_and_waits_for_no_event_runs_once_it_is_whole(tiny):
    """A cache fills as the model runs. A statement that reads it and waits for no event of its own (`len(c)`,
    a difference of two entries) runs after the forward pass, wherever it is written; inside a backward block,
    after that pass, when `c.grads` is whole. Before, it ran before the model and saw an empty cache."""
    before = model_state(tiny)
    ns = {"model": tiny}
    result = nbgrad.trace(tiny, IDS, CACHE_READ_AFTER, ns)
    tiny.zero_grad()
    names = [n for n, _ in tiny.named_modules() if n.startswith("transformer.h.")]
    outputs, _, grads, _ = hooked(tiny, IDS, names, loss=lambda out: out.logits[0, -1].max())
    tiny.zero_grad()
    assert ns["n"] == len(outputs) > 8
    assert torch.allclose(result.saved["diff"], (outputs["transformer.h.1"] - outputs["transformer.h.0"]).norm())
    assert torch.allclose(result.saved["g"], grads["transformer.h.0"])
    assert ns["n_grads"] == len(grads)
    # The backward pass runs inside the model's call (from its own output's hook): the statements that read the
    # cache start after that call has returned, those in the block once the pass is over
    runs = [(run.line, run.woke_by, run.phase) for run in result.graph.runs]
    assert runs == [(2, None, "before the model runs"), (5, None, "before the model runs"),
                    (5, "model.output", "forward"), (6, None, "forward"), (7, None, "forward"), (8, None, "forward"),
                    (3, None, "after the forward pass"), (4, None, "after the forward pass")]
    text = str(nbgrad.trace(tiny, IDS, CACHE_READ_AFTER, {"model": tiny}, graph=True).graph)
    assert text.count("after the forward pass (it reads a cache, whole only then)") == 2
    assert text.count("after its backward pass (it reads a cache, whose gradients are whole only then)") == 2
    assert_clean(tiny, before)


def test_a_statement_that_reads_an_entry_not_cached_yet_says_why(tiny):
    """A statement with an event of its own runs at that event: an entry the model has not reached by then is
    missing, and the error says so and what to write instead (not that the run never called the module)."""
    before = model_state(tiny)
    with pytest.raises(KeyError, match=r"'transformer.h.1' is not in the cache yet: this statement ran before the "
                                       r"model called that module.*read the module's own `.output` here"):
        nbgrad.trace(tiny, IDS, 'c = cache("transformer.h.*")\nmodel.transformer.h[0].output[:] = c["transformer.h.1"]',
                     {"model": tiny})
    assert_clean(tiny, before)
    ns = {"model": tiny}
    nbgrad.trace(tiny, IDS, 'c = cache("transformer.h.0")', ns)
    with pytest.raises(KeyError, match="'transformer.h.1' is not in the cache: the run called no cached module"):
        ns["c"]["transformer.h.1"]


def test_the_hook_graph_names_the_cache_and_no_event_of_its_inputs(tiny):
    """A cache hooks what it matches when the run starts: the graph lists it, on its line, and does not say the model
    runs with no hooks; `c.inputs` is the cache's own attribute, not a module's input event."""
    cell = "c = cache('transformer.h.*', inputs=True)\nx = c.inputs['transformer.h.1'].save()"
    for graph in (nbgrad.trace(tiny, IDS, cell, {"model": tiny}, graph=True).graph,
                  nbgrad.trace(tiny, IDS, cell, {"model": tiny}).graph):
        text = graph.to_text()
        assert "cache(...)  [a forward hook on every module it matches]  line 1" in text, text
        assert "no hooks" not in text and "c.inputs" not in text.split("nodes:")[0], text
        assert graph.to_dict()["caches"] == [1]
    plain = nbgrad.trace(tiny, IDS, "x = 1", {"model": tiny}, graph=True).graph
    assert "(none: the model runs with no hooks)" in plain.to_text() and plain.to_dict()["caches"] == []


def test_a_cache_shown_on_its_own_draws_its_panel(tiny):
    """`c` as a cell's last line: the heatmap the magic shows after the cell, one row per module (and its
    gradient × activation), with the cache's short repr as the text."""
    ns = {"model": tiny}
    nbgrad.trace(tiny, IDS, "c = cache('transformer.h.?', grads=True)\nmodel.output.logits.sum().backward()", ns)
    bundle = ns["c"]._repr_mimebundle_()
    assert bundle["text/plain"] == repr(ns["c"]) and bundle["text/plain"].startswith("Cache(4 modules with grads")
    rows = re.findall(r"<tr><th style=[^>]*>([^<]*)</th>", bundle["text/html"])
    assert rows == [f"transformer.h.{i}{kind}" for i in range(4) for kind in ("", " grad×act")]
    assert bundle["text/html"].count('<td title="') == 8 * IDS.shape[1]


def test_the_checked_options_are_those_cache_takes():
    """`cache(...)`'s arguments are checked (engine/checks.py) against the keywords the run's cache takes."""
    import inspect
    from nbgrad.engine.checks import CACHE_OPTIONS
    from nbgrad.engine.run.caching import start_cache
    assert CACHE_OPTIONS == tuple(inspect.signature(start_cache).parameters)[2:]
