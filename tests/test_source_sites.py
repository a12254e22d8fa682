"""`M.source.SITE`: sites inside a forward, against plain PyTorch with the called function patched by hand."""
import copy

import pytest
import torch
from torch import nn

import nbgrad
from helpers import hook_count
from sitemodels import ATTENTION, FAMILIES, expression


def run(model, inputs, cell):
    namespace = {"model": model, "torch": torch}
    nbgrad.trace(model, inputs, cell, namespace=namespace)
    return namespace


def assert_untouched(model):
    for module in model.modules():
        assert "forward" not in vars(module), f"{type(module).__name__} keeps an instance forward"
    assert hook_count(model) == 0


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_names_are_nnsights(family):
    nnsight = pytest.importorskip("nnsight")
    build, path, _, _, _ = FAMILIES[family]
    model = build()
    twin = nnsight.NNsight(copy.deepcopy(model))       # nnsight wraps what it is given: never the model we trace
    envoy = twin
    for part in path.split("."):
        envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
    assert nbgrad.source(model.get_submodule(path)).names == tuple(envoy.source.names)


def test_the_spec_names_of_gpt2_attention():
    names = nbgrad.source(FAMILIES["gpt2"][0]().transformer.h[0].attn).names
    # `_0` of each stands earlier in the source: the cross-attention branch, and the assignment picking the function
    assert names.index("self_c_attn_0") < names.index("self_c_attn_1")
    assert names.index("attention_interface_0") < names.index("attention_interface_1")


def test_the_listing_puts_each_name_beside_its_line():
    listing = nbgrad.source(FAMILIES["plain"][0]().body)
    assert isinstance(listing, str)
    assert listing.names == ("self_fc1_0", "h_0", "torch_relu_0", "h_1", "self_fc2_0")
    lines = listing.splitlines()
    assert any("self_fc1_0, h_0" in line and "h = self.fc1(x)" in line for line in lines)
    assert any("self_fc2_0" in line and "return self.fc2(h)" in line for line in lines)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_call_site_output_is_the_submodules_hook_output(family):
    build, path, site, child, inputs = FAMILIES[family]
    model = build()
    seen = {}
    handle = model.get_submodule(path).get_submodule(child).register_forward_hook(
        lambda m, a, out: seen.update(out=out, given=a))
    model(inputs)
    handle.remove()
    namespace = run(model, inputs, f"got = {expression(path)}.source.{site}.output.save()\n"
                                   f"given = {expression(path)}.source.{site}.input.save()\n"
                                   f"args, kwargs = {expression(path)}.source.{site}.inputs\n"
                                   f"n_args = len(args)")
    assert torch.equal(namespace["got"], seen["out"])
    assert torch.equal(namespace["given"], seen["given"][0]) and namespace["n_args"] == len(seen["given"])
    assert_untouched(model)
    assert type(model.get_submodule(path)).forward is type(model.get_submodule(path)).__dict__["forward"]


def test_an_assignment_site_holds_the_value_assigned():
    model = FAMILIES["plain"][0]()
    x = FAMILIES["plain"][4]
    namespace = run(model, x, "h1 = model.body.source.h_1.output.save()")
    assert torch.equal(namespace["h1"], torch.relu(model.body.fc1(x)))


def test_a_site_that_holds_a_function_used_as_a_tensor_says_so():
    """GPT-2's `attention_interface_0` is the assignment that picks the attention function (the call is
    `_1`): indexing it raises Python's own TypeError, with a note that says what the site holds and where to
    see which line it is."""
    model = FAMILIES["gpt2"][0]()
    inputs = FAMILIES["gpt2"][4]
    with pytest.raises(TypeError, match="'function' object is not subscriptable") as caught:
        run(model, inputs, "w = model.transformer.h[0].attn.source.attention_interface_0.output[1].save()")
    assert caught.value.__notes__ == [
        "nbgrad: model.transformer.h[0].attn.source.attention_interface_0.output (line 1) is a function, not a "
        "tensor: `%source model.transformer.h[0].attn` shows which line of its forward each site is"]
    assert_untouched(model)
    namespace = run(model, inputs, "w = model.transformer.h[0].attn.source.attention_interface_1.output[1].save()")
    assert namespace["w"].shape[-1] == namespace["w"].shape[-2]       # the pattern: (batch, heads, seq, seq)


def test_a_callee_site_the_fused_attention_lacks_names_the_line_the_function_and_the_way_to_it():
    """The spec's pattern site on a model that runs sdpa: the callee is known only when it is called, inside
    the model; the error still names the cell's line, says which function ran, and how to reach the pattern."""
    model = FAMILIES["gpt2"][0]()
    model.config._attn_implementation = "sdpa"
    inputs = FAMILIES["gpt2"][4]
    cell = ("attn = model.transformer.h[0].attn.source.attention_interface_1\n"
            "pattern = attn.source.nn_functional_softmax_0.output.save()")
    with pytest.raises(nbgrad.NbgradError) as caught:
        run(model, inputs, cell)
    message = str(caught.value)
    assert message.startswith("line 2: GPT2Attention.source.attention_interface_1.source has no site "
                              "'nn_functional_softmax_0'; nearest: attention_mask_0. attention_interface_1 called "
                              "sdpa_attention_forward in this run: a fused attention function")
    assert 'nbgrad.load_model(..., attn_implementation="eager")' in message
    assert_untouched(model)
    model.config._attn_implementation = "eager"
    assert run(model, inputs, cell)["pattern"].shape == (1, 4, 6, 6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_source_of_an_assignment_site_says_it_is_no_call_and_names_the_call(family):
    """`attention_interface_0` is the assignment that picks the attention function, in both families: its
    `.source` is an error at the cell's line that says so and names the call site, not a note about nbgrad's
    own identity function. The call site's `.source` then works."""
    build, path, _, _, inputs = FAMILIES[family]
    model = build()
    model.config._attn_implementation = "eager"
    cell = f"p = {expression(path)}.source.attention_interface_0.source.nn_functional_softmax_0.output.save()"
    with pytest.raises(nbgrad.NbgradError) as caught:
        run(model, inputs, cell)
    assert str(caught.value) == (
        f"line 1: {type(model.get_submodule(path)).__name__}.source.attention_interface_0.source: attention_interface_0 is an assignment, not a call, so it has no "
        "`.source` (a call site's opens the function it calls). Sites of the same name: attention_interface_1")
    assert_untouched(model)
    assert run(model, inputs, cell.replace("_0.source", "_1.source"))["p"].shape[-1] == inputs.shape[-1]


def test_writing_a_site_input_and_editing_an_output_in_place():
    model = FAMILIES["plain"][0]()
    x = FAMILIES["plain"][4]
    namespace = run(model, x, "model.body.source.torch_relu_0.input = -torch.ones(2, 8)\n"
                              "model.body.source.self_fc1_0.output[:, 0] = 5\n"
                              "out = model.output.save()")
    assert torch.equal(namespace["out"], model.body.fc2(torch.zeros(2, 8)))
    namespace = run(model, x, "model.body.source.h_1.output.mul_(2)\nout = model.output.save()")
    assert torch.allclose(namespace["out"], model.body.fc2(2 * torch.relu(model.body.fc1(x))))
    assert_untouched(model)


def test_an_edit_that_comes_too_late_names_both_lines():
    model = FAMILIES["plain"][0]()
    with pytest.raises(nbgrad.OrderError, match="edited too late"):
        run(model, FAMILIES["plain"][4], "model.body.source.self_fc1_0.output[:] = "
                                         "model.body.source.self_fc2_0.output.sum()")
    assert_untouched(model)


def softmax_patched(monkeypatch, edit):
    """The oracle: torch's softmax patched by hand, `edit` applied to the first call's result (layer 0's
    attention pattern; nothing else in these models calls softmax)."""
    original, calls = torch.nn.functional.softmax, []

    def patched(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(out)
        return edit(out) if len(calls) == 1 else out
    monkeypatch.setattr(torch.nn.functional, "softmax", patched)
    return calls


PATTERN = "{attn}.source.attention_interface_1.source.nn_functional_softmax_0"


@pytest.mark.parametrize("family", sorted(ATTENTION))
def test_the_eager_pattern_is_output_attentions(family):
    build, _, _, _, ids = FAMILIES[family]
    model = build()
    namespace = run(model, ids, f"pattern = {PATTERN.format(attn='model.' + ATTENTION[family])}.output.save()")
    expected = model(ids, output_attentions=True).attentions[0]
    assert namespace["pattern"].shape == (1, 4, 6, 6)
    assert torch.equal(namespace["pattern"], expected)


@pytest.mark.parametrize("family", sorted(ATTENTION))
def test_zeroing_one_head_is_the_patched_function(family, monkeypatch):
    build, _, _, _, ids = FAMILIES[family]
    model = build()
    cell = f"pattern = {PATTERN.format(attn='model.' + ATTENTION[family])}.output\npattern[:, 2] = 0\n" \
           f"logits = model.output.logits.save()"
    got = run(model, ids, cell)["logits"]

    def zero_head(pattern):
        pattern[:, 2] = 0
        return pattern
    softmax_patched(monkeypatch, zero_head)
    expected = model(ids).logits
    assert torch.equal(got, expected)
    monkeypatch.undo()
    assert not torch.allclose(got, model(ids).logits)      # the edit changed something
    assert_untouched(model)


@pytest.mark.parametrize("family", sorted(ATTENTION))
def test_the_patterns_grad_is_a_retained_gradient(family, monkeypatch):
    build, _, _, _, ids = FAMILIES[family]
    model = build()
    cell = (f"pattern = {PATTERN.format(attn='model.' + ATTENTION[family])}.output\n"
            f"with model.output.logits[0, -1].max().backward():\n"
            f"    grad = pattern.grad.save()\n"
            f"attribution = (pattern * pattern.grad).save()")
    namespace = run(model, ids, cell)
    model.zero_grad(set_to_none=True)

    def retain(pattern):
        pattern.retain_grad()
        return pattern
    calls = softmax_patched(monkeypatch, retain)
    model(ids).logits[0, -1].max().backward()
    assert torch.allclose(namespace["grad"], calls[0].grad)
    assert torch.allclose(namespace["attribution"], calls[0] * calls[0].grad)
    assert namespace["grad"].abs().sum() > 0


def test_a_site_in_an_invoke_block_is_its_rows():
    model = FAMILIES["plain"][0]()
    x = FAMILIES["plain"][4]
    cell = ("with invoke(x[:1]):\n    first = model.body.source.h_1.output.save()\n"
            "with invoke(x[1:]):\n    model.body.source.h_1.output[:] = 0\n    second = model.output.save()")
    namespace = {"model": model, "torch": torch, "x": x}
    nbgrad.trace(model, None, cell, namespace=namespace)
    assert torch.allclose(namespace["first"], torch.relu(model.body.fc1(x[:1])))   # one row of a batch of two
    assert torch.allclose(namespace["second"], model.body.fc2(torch.zeros(1, 8)))


def test_modules_not_named_keep_the_class_forward_during_the_run():
    model = FAMILIES["gpt2"][0]()
    forwards = {}
    handles = [m.register_forward_hook(lambda m, a, o, key=key: forwards.update({key: m.forward}))
               for key, m in (("named", model.transformer.h[0].attn), ("other", model.transformer.h[1].attn))]
    run(model, FAMILIES["gpt2"][4], "p = model.transformer.h[0].attn.source.self_c_attn_1.output.save()")
    for handle in handles:
        handle.remove()
    assert forwards["other"].__func__ is type(model.transformer.h[1].attn).forward
    assert forwards["named"].__func__ is not type(model.transformer.h[0].attn).forward
    assert_untouched(model)


def test_a_cell_that_names_no_site_opens_no_forward():
    from nbgrad.engine.run import sites
    model = FAMILIES["gpt2"][0]()
    run(model, FAMILIES["gpt2"][4], "hs = model.transformer.h[0].attn.output[0].save()\n"
                                    "model.transformer.h[1].output[:] *= 2")
    assert not [m for m in model.modules() if m in sites._tables]
    assert_untouched(model)


def test_a_sites_own_grad_is_the_gradient_into_its_value():
    """`X.source.SITE.grad` as the cell writes it (the spec's list of what a site has) reads and edits the gradient
    into the site's value, `X.source.SITE.output.grad`: against a raw hook on the module the call calls."""
    build, _, _, _, ids = FAMILIES["gpt2"]
    model = build()
    site = "model.transformer.h[0].attn.source.self_c_attn_1"
    namespace = run(model, ids, f"g = {site}.grad.save()\nmodel.output.logits.sum().backward()")
    model.zero_grad(set_to_none=True)
    namespace_zeroed = run(model, ids, f"{site}.grad[:] = 0\nmodel.output.logits.sum().backward()")
    zeroed = model.transformer.h[0].attn.c_attn.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    kept = {}

    def forward_hook(module, args, output):
        output.register_hook(lambda grad: kept.setdefault("grad", grad))
    handle = model.transformer.h[0].attn.c_attn.register_forward_hook(forward_hook)
    try:
        model(ids).logits.sum().backward()
    finally:
        handle.remove()
    assert torch.equal(namespace["g"], kept["grad"]) and kept["grad"].abs().sum() > 0
    assert "g" not in namespace_zeroed and zeroed.abs().sum() == 0      # the edit reached the weights' gradient
    assert model.transformer.h[0].attn.c_attn.weight.grad.abs().sum() > 0
    assert_untouched(model)


@pytest.mark.parametrize("order", ["", "reversed"])
def test_a_loop_over_a_forwards_sites_reads_each_in_any_order(order):
    """`[s.output.save() for s in M.source]` over GPT2MLP's sites, forward and reversed: each call site's value is
    the module it calls' output (a plain forward hook), each assignment the value the next call gets."""
    model, ids = FAMILIES["gpt2"][0](), FAMILIES["gpt2"][4]
    mlp = model.transformer.h[0].mlp
    kept = {}
    handles = [getattr(mlp, name).register_forward_hook(lambda m, a, o, name=name: kept.setdefault(name, o))
               for name in ("c_fc", "act", "c_proj", "dropout")]
    with torch.no_grad():
        model(ids)
    for handle in handles:
        handle.remove()
    sites = "model.transformer.h[0].mlp.source"
    ns = run(model, ids, f"xs = {{s.name: s.output.save() for s in {order}({sites})}}" if order else
             f"xs = {{s.name: s.output.save() for s in {sites}}}")
    expected = {"self_c_fc_0": "c_fc", "hidden_states_0": "c_fc", "self_act_0": "act", "hidden_states_1": "act",
                "self_c_proj_0": "c_proj", "hidden_states_2": "c_proj", "self_dropout_0": "dropout",
                "hidden_states_3": "dropout"}
    assert list(ns["xs"]) == list(reversed(expected) if order else expected)
    assert all(torch.equal(ns["xs"][site], kept[module]) for site, module in expected.items())
    assert_untouched(model)


@pytest.mark.parametrize("cell, who", [
    ("x = model.transformer.h[0].attn.source.self_c_attn_0.output.save()",
     "model.transformer.h[0].attn.source.self_c_attn_0.output never came: "
     "model.transformer.h[0].attn.source.self_c_attn_0 never ran"),
    ("xs = [s.output.save() for s in model.transformer.h[0].attn.source]",
     "s.output never came: s (GPT2Attention.source."),
])
def test_a_site_in_a_branch_the_forward_did_not_take_says_so(cell, who):
    """Not that it was asked for too late: the forward ran without reaching it (`_0` is the cross-attention
    branch, and a loop over every site meets such sites)."""
    model, ids = FAMILIES["gpt2"][0](), FAMILIES["gpt2"][4]
    with pytest.raises(nbgrad.OrderError) as caught:
        run(model, ids, cell)
    message = str(caught.value)
    assert message.startswith(f"line 1: {who}") and "asked for it only while" not in message
    assert message.endswith("never ran during this call of the model: its forward ran without reaching it (a branch "
                            "it did not take; `%source` shows each site's line)")
    assert_untouched(model)
