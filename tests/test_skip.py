"""`M.skip(v)`: M does not run and `v` is its output, against a forward patched by hand to return `v`."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nbgrad
from helpers import hook_count
from sitemodels import FAMILIES

# family -> (the module skipped, a module inside it, the module whose output makes v)
SKIPS = {"gpt2": ("transformer.h[0].mlp", "transformer.h[0].mlp.c_fc", "transformer.h[0].ln_2"),
         "llama": ("model.layers[0].mlp", "model.layers[0].mlp.gate_proj", "model.layers[0].post_attention_layernorm"),
         "plain": ("body", "body.fc1", None)}


def module_at(model, text):
    return eval("model." + text, {"model": model})


@pytest.mark.parametrize("family", sorted(SKIPS))
def test_skip_is_a_forward_that_returns_v(family):
    build, _, _, _, inputs = FAMILIES[family]
    model = build()
    skipped, inner, source = SKIPS[family]
    v = f"model.{source}.output * 3" if source else "torch.full((2, 3), 0.5)"
    namespace = {"model": model, "torch": torch}
    nbgrad.trace(model, inputs, f"model.{skipped}.skip({v})\nout = model.output.save()", namespace=namespace)
    got = namespace["out"].logits if family != "plain" else namespace["out"]
    assert "forward" not in vars(module_at(model, skipped)) and hook_count(model) == 0

    calls = []
    module_at(model, inner).register_forward_hook(lambda *a: calls.append(1))
    if source:
        kept = {}
        module_at(model, source).register_forward_hook(lambda m, a, out: kept.update(v=out * 3))
        module_at(model, skipped).forward = lambda *a, **k: kept["v"]
    else:
        module_at(model, skipped).forward = lambda *a, **k: torch.full((2, 3), 0.5)
    expected = model(inputs)
    expected = expected.logits if family != "plain" else expected
    assert torch.equal(got, expected)
    assert not calls                                   # the hand-patched forward skipped the module too
    del module_at(model, skipped).forward


def test_reading_inside_a_skipped_module_is_an_error():
    model = FAMILIES["gpt2"][0]()
    namespace = {"model": model, "torch": torch}
    for inner in ("model.transformer.h[0].mlp.c_fc.output", "model.transformer.h[0].mlp.source.self_c_fc_0.output"):
        with pytest.raises(nbgrad.OrderError, match="GPT2MLP was skipped .*so nothing inside it ran"):
            nbgrad.trace(model, FAMILIES["gpt2"][4], f"model.transformer.h[0].mlp.skip(torch.zeros(1, 6, 32))\n"
                                                     f"x = {inner}.save()", namespace=namespace)
        assert not [m for m in model.modules() if "forward" in vars(m)] and hook_count(model) == 0


@pytest.mark.parametrize("value", ["model.transformer.h[0].mlp.c_fc.output[..., :32]", "model.transformer.h[1].output"])
def test_skip_with_a_value_from_inside_the_module_or_after_it_is_too_late(value):
    """The message speaks of the skip as the cell wrote it, not of the gate's output it compiles to."""
    model = FAMILIES["gpt2"][0]()
    with pytest.raises(nbgrad.OrderError) as caught:
        nbgrad.trace(model, FAMILIES["gpt2"][4], f"model.transformer.h[0].mlp.skip({value})",
                     namespace={"model": model})
    message = str(caught.value)
    assert message.startswith("line 1: model.transformer.h[0].mlp.skip(...) comes too late: its value takes the place "
                              "of the call of model.transformer.h[0].mlp, so it must exist before")
    assert f"could only run once {value.split('[..')[0]} (this line) existed" in message
    assert "skip.output" not in message
    assert not [m for m in model.modules() if "forward" in vars(m)] and hook_count(model) == 0


def test_skip_of_a_module_the_run_never_calls_says_it_skipped_nothing():
    model = FAMILIES["gpt2"][0]()                  # a ModuleList holds the blocks; nothing calls it
    with pytest.raises(nbgrad.OrderError) as caught:
        nbgrad.trace(model, FAMILIES["gpt2"][4], "model.transformer.h.skip(model.transformer.wte.output)",
                     namespace={"model": model})
    assert str(caught.value) == ("line 1: model.transformer.h.skip(...) skipped nothing: model.transformer.h never ran "
                                 "during this call of the model")
    assert not [m for m in model.modules() if "forward" in vars(m)] and hook_count(model) == 0


@pytest.mark.parametrize("part, v, given", [
    ("mlp", "(model.transformer.h[0].ln_2.output,)", "v a tuple"),
    ("mlp", "torch.zeros(2)", "v a tensor of shape [2]"),
    ("mlp", "torch.zeros(1, 5, 3)", "v a tensor of shape [1, 5, 3]"),
])
def test_skip_with_a_value_of_the_wrong_form_says_what_v_stands_for(part, v, given):
    """The model's own code fails on a `v` of the wrong form: the error is the skip's, with what v should be, and
    keeps the model's own error as its cause."""
    model = FAMILIES["gpt2"][0]()
    module = f"model.transformer.h[0].{part}"
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, FAMILIES["gpt2"][4], f"{module}.skip({v})\nout = model.output.save()",
                     namespace={"model": model, "torch": torch})
    message = str(caught.value)
    assert message.startswith(f"line 1: `{module}.skip(v)` gave {given}, and the model failed after that (")
    assert message.endswith(f"v stands in for that module's output, so it must have the form its forward returns "
                            f"(a tensor of the shape it returns; a tuple for many attention modules). Read "
                            f"`{module}.output` in a cell without the skip to see it")
    assert isinstance(caught.value.__cause__, (TypeError, RuntimeError))
    assert not [m for m in model.modules() if "forward" in vars(m)] and hook_count(model) == 0


@pytest.mark.parametrize("v, says", [
    ("None", "; None is no output. To let it run, leave the skip out"),
    ("'text'", ", not a str"),
    ("3", ", not an int"),
])
def test_skip_with_a_value_no_forward_returns_is_refused_before_the_model_goes_on(v, says):
    """`skip(None)` was ignored in silence (None is what "not skipped" holds); a str failed deep in transformers."""
    model = FAMILIES["gpt2"][0]()
    calls = []
    handle = model.transformer.h[1].register_forward_hook(lambda *a: calls.append(1))
    namespace = {"model": model, "torch": torch}
    try:
        with pytest.raises(nbgrad.NbgradError) as caught:
            nbgrad.trace(model, FAMILIES["gpt2"][4], f"x = 1\nmodel.transformer.h[0].attn.skip({v})\n"
                         "out = model.output.save()", namespace=namespace)
    finally:
        handle.remove()
    assert str(caught.value) == (
        "line 2: `model.transformer.h[0].attn.skip(v)` takes the value that model.transformer.h[0].attn's output "
        "becomes while it does not run: a tensor of the shape its forward returns (a tuple for many attention "
        "modules)" + says)
    assert calls == [] and "out" not in namespace and "x" not in namespace
    assert not [m for m in model.modules() if "forward" in vars(m)] and hook_count(model) == 0


def test_an_interrupt_at_any_line_of_a_skip_cell_leaves_no_forward_and_no_hook():
    """A skip puts a forward on the module for the run: Ctrl-C at any line of a sample (every line that sets up or
    cleans up, and a stride of the rest) leaves none, no hook and no runtime, and the next run is the same. The
    sweep runs in a process of its own, apart from what a thousand earlier tests leave in this one: once, late in
    a full suite on a busy machine, the process crashed (SIGSEGV) during this sweep, and it never has alone."""
    sweep = subprocess.run([sys.executable, "-X", "faulthandler", "-c", "import test_skip; test_skip.skip_sweep()"],
                           cwd=Path(__file__).parent, capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    assert sweep.stdout.strip().endswith("swept")


def skip_sweep():
    """The sweep itself (not collected: it runs as `python -c`, in tests/)."""
    from interrupts import Injector, points
    from nbgrad.engine.run.runtime import active_runtime
    model, ids = FAMILIES["gpt2"][0](), FAMILIES["gpt2"][4]
    namespace = {"model": model}
    source = ("model.transformer.h[0].mlp.skip(model.transformer.h[0].ln_2.output * 0.5)\n"
              "out = model.output.logits.save()\n")
    nbgrad.trace(model, ids, source, namespace=namespace)
    expected = namespace["out"]
    with Injector(record=True) as counter:
        nbgrad.trace(model, ids, source, namespace=namespace)
    interrupted = 0
    for k in points(counter.lines, full=False, stride=max(1, counter.count // 100)):
        try:
            with Injector(k):
                nbgrad.trace(model, ids, source, namespace=namespace)
        except KeyboardInterrupt:
            interrupted += 1
        assert not [m for m in model.modules() if "forward" in vars(m)] and hook_count(model) == 0, k
        assert active_runtime() is None and not [n for n in namespace if n.startswith("__nbgrad")], k
    assert interrupted > 50
    nbgrad.trace(model, ids, source, namespace=namespace)
    assert torch.equal(namespace["out"], expected)
    print(f"{interrupted} interrupts swept")


PROMPTS = ["The Eiffel Tower is in", "Hi", "A much longer prompt than the others"]
# (the skip, a module inside the skipped one): a tensor v, and a tuple v with None for the attention's weights
ROW_SKIPS = [("model.transformer.h[1].mlp.skip(model.transformer.h[1].ln_2.output)\n", "mlp.c_fc"),
             ("model.transformer.h[1].attn.skip((model.transformer.h[1].ln_1.output, None))\n", "attn.c_attn")]


def alone(model, prompt, skip: str):
    ns = {"model": model}
    nbgrad.trace(model, prompt, skip + "x = model.lm_head.output[:, -1].save()", ns)
    return ns["x"]


@pytest.mark.parametrize("skip, inside", ROW_SKIPS)
def test_each_example_over_a_dataset_skips_with_its_own_rows(default_model, skip, inside):
    """Each example's v is M's output at its rows of the padded batch, as if it ran alone (M does not run: every
    example skips)."""
    ns, called = {"model": default_model}, []
    handle = module_at(default_model, f"transformer.h[1].{inside}").register_forward_hook(lambda *a: called.append(1))
    try:
        nbgrad.trace(default_model, None, skip + "x = model.lm_head.output[:, -1].save()", ns, over=PROMPTS,
                     batch_size=3)
    finally:
        handle.remove()
    assert not called
    for prompt, value in zip(PROMPTS, ns["x"]):
        torch.testing.assert_close(value, alone(default_model, prompt, skip), atol=1e-4, rtol=1e-4)
    assert not [m for m in default_model.modules() if "forward" in vars(m)] and hook_count(default_model) == 0


@pytest.mark.parametrize("skip, inside", ROW_SKIPS)
def test_an_invoke_that_skips_leaves_the_others_rows_to_the_module(default_model, skip, inside):
    """Only the second invoke skips: the module runs on the batch, and the other invokes' rows are its own."""
    source = "".join(f"with invoke({prompt!r}):\n" + ("    " + skip if index == 1 else "")
                     + f"    x{index} = model.lm_head.output[:, -1].save()\n" for index, prompt in enumerate(PROMPTS))
    ns = {"model": default_model}
    nbgrad.trace(default_model, None, source, ns)
    for index, prompt in enumerate(PROMPTS):
        expected = alone(default_model, prompt, skip if index == 1 else "")
        torch.testing.assert_close(ns[f"x{index}"], expected, atol=1e-4, rtol=1e-4)
    assert not [m for m in default_model.modules() if "forward" in vars(m)] and hook_count(default_model) == 0


@pytest.mark.parametrize("skip, inside", ROW_SKIPS)
def test_an_invoke_reading_inside_what_it_skipped_gets_the_error_it_gets_alone(default_model, skip, inside):
    """M runs for the other invokes' rows, not for the skipping invoke's: a read inside M (a module, a site of its
    forward) by that invoke never came, as alone; the other invoke reads inside M, and the skipping one M's own
    input and output."""
    with pytest.raises(nbgrad.OrderError, match="never came: .* was skipped"):
        nbgrad.trace(default_model, PROMPTS[0], skip + f"x = model.transformer.h[1].{inside}.output.save()",
                     {"model": default_model})
    module = inside.split(".")[0]
    site = "self_c_fc_0" if module == "mlp" else "self_c_attn_1"
    for read in (f"model.transformer.h[1].{inside}.output", f"model.transformer.h[1].{module}.source.{site}.output"):
        source = (f"with invoke({PROMPTS[0]!r}):\n    y = {read}.save()\n"
                  f"with invoke({PROMPTS[1]!r}):\n    {skip}    x = {read}.save()\n")
        with pytest.raises(nbgrad.OrderError, match=r"^line 5: .* never came for this invoke: it skipped GPT2(MLP|"
                           r"Attention) \(`\.skip\(\.\.\.\)`\), so nothing inside it ran at its rows"):
            nbgrad.trace(default_model, None, source, {"model": default_model})
        assert not [m for m in default_model.modules() if "forward" in vars(m)] and hook_count(default_model) == 0
    ns = {"model": default_model}
    nbgrad.trace(default_model, None, f"with invoke({PROMPTS[0]!r}):\n"
                 f"    y = model.transformer.h[1].{inside}.output.save()\n"
                 f"with invoke({PROMPTS[1]!r}):\n    {skip}    m = model.transformer.h[1].{module}.output.save()\n"
                 f"    i = model.transformer.h[1].{module}.input.save()\n", ns)
    assert ns["y"].shape[0] == 1 and ns["m"] is not None and ns["i"] is not None


def test_the_hook_graph_text_names_a_skip_as_the_cell_writes_it():
    model = FAMILIES["gpt2"][0]()
    text = nbgrad.trace(model, FAMILIES["gpt2"][4], "model.transformer.h[0].mlp.skip(model.transformer.h[0].ln_2.output)",
                        namespace={"model": model}, graph=True).graph.to_text()
    assert "  model.transformer.h[0].mlp.skip(...)  [the module's forward, in place for the run]  line 1\n" in text
    assert "waits for: model.transformer.h[0].ln_2.output, model.transformer.h[0].mlp.skip(...)\n" in text
    assert "model.transformer.h[0].mlp.skip(...) -> node 0" in text and "skip.output" not in text


@pytest.mark.parametrize("cell", ["y = model.transformer.h[0].mlp.skip(model.transformer.h[0].ln_2.output)",
                                  "model.transformer.h[0].mlp.skip()",
                                  "model.transformer.h[0].mlp.skip(v=model.transformer.h[0].ln_2.output)"])
def test_skip_written_other_than_as_a_statement_says_how_to_write_it(cell):
    model = FAMILIES["gpt2"][0]()
    with pytest.raises(AttributeError, match="'GPT2MLP' object has no attribute 'skip'") as caught:
        nbgrad.trace(model, FAMILIES["gpt2"][4], cell, namespace={"model": model})
    assert "nbgrad: `M.skip(v)` is a statement of its own: a line that is only `M.skip(v)`, with one value v" in \
        "\n".join(caught.value.__notes__)
    assert not [m for m in model.modules() if "forward" in vars(m)] and hook_count(model) == 0


def test_an_invoke_skips_its_rows_of_a_skip_the_whole_batch_made(default_model):
    """A skip outside the blocks gives the batch its v; a later skip inside an invoke replaces that invoke's rows."""
    whole, own = ROW_SKIPS[0][0], ROW_SKIPS[0][0].replace(".output)", ".output * 3)")
    source = (whole + f"with invoke({PROMPTS[0]!r}):\n    {own}    x0 = model.lm_head.output[:, -1].save()\n"
              f"with invoke({PROMPTS[1]!r}):\n    x1 = model.lm_head.output[:, -1].save()\n")
    ns = {"model": default_model}
    nbgrad.trace(default_model, None, source, ns)
    torch.testing.assert_close(ns["x0"], alone(default_model, PROMPTS[0], own), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ns["x1"], alone(default_model, PROMPTS[1], whole), atol=1e-4, rtol=1e-4)
    assert not [m for m in default_model.modules() if "forward" in vars(m)] and hook_count(default_model) == 0


def test_skip_with_a_value_of_the_wrong_form_in_invokes_says_what_v_is(default_model):
    """The error speaks of the invoke's own v, not of what the gate collects from every invoke."""
    source = "".join(f"with invoke({prompt!r}):\n    model.transformer.h[1].mlp.skip(torch.zeros(2))\n"
                     for prompt in PROMPTS[:2])
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(default_model, None, source, {"model": default_model, "torch": torch})
    assert "`model.transformer.h[1].mlp.skip(v)` gave v a tensor of shape [2], and the model failed" in str(caught.value)
    assert "RowsSkipped" not in str(caught.value)
    assert not [m for m in default_model.modules() if "forward" in vars(m)] and hook_count(default_model) == 0
