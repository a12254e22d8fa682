"""Invokes made in a `for` loop (one invoke per block entered, one batch) and `.grad` of a name a loop
rebinds, checked against one trace per patch and against plain hooks on the same weights."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
LAYERS, POSITIONS = 2, 3


@pytest.fixture(scope="module")
def model():
    return nbgrad.load_model()


def hooked_patch(model, layer, pos, clean_out):
    """Plain PyTorch: CORRUPT with block `layer`'s output at `pos` replaced by the clean run's; last logits."""
    ids = nbgrad.tokenizer_for(model)(CORRUPT, return_tensors="pt")["input_ids"]

    def hook(module, args, output):
        output = output.clone()
        output[:, pos] = clean_out[layer][:, pos]
        return output
    handle = model.transformer.h[layer].register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(ids).logits[0, -1]
    finally:
        handle.remove()


def clean_outputs(model):
    ids = nbgrad.tokenizer_for(model)(CLEAN, return_tensors="pt")["input_ids"]
    seen = {}
    handles = [model.transformer.h[i].register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, o))
               for i in range(LAYERS)]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def test_invokes_in_nested_loops_patch_every_layer_and_position_in_one_batch(model):
    before = model_state(model)
    namespace = {"model": model, "clean": CLEAN, "corrupt": CORRUPT, "LAYERS": LAYERS, "POSITIONS": POSITIONS}
    nbgrad.trace(model, CLEAN, "acts = [model.transformer.h[i].output.save() for i in range(LAYERS)]", namespace,
                 no_grad=True)        # the clean run first, as an earlier cell
    result = nbgrad.trace(model, None, """
patched = {}
for layer in range(LAYERS):
    for pos in range(POSITIONS):
        with invoke(corrupt):
            model.transformer.h[layer].output[:, pos] = acts[layer][:, pos]
            logits = model.lm_head.output[0, -1]
            patched[layer, pos] = logits.save()
""", namespace, no_grad=True)
    assert len(result.invokes) == LAYERS * POSITIONS        # one batch: every block entered is an invoke
    clean = clean_outputs(model)
    for layer in range(LAYERS):
        for pos in range(POSITIONS):
            expected = hooked_patch(model, layer, pos, clean)
            assert torch.allclose(namespace["patched"][layer, pos], expected, atol=1e-4), (layer, pos)
            one = nbgrad.trace(model, CORRUPT, f"""
model.transformer.h[{layer}].output[:, {pos}] = acts[{layer}][:, {pos}]
out = model.lm_head.output[0, -1].save()
""", {"model": model, "acts": namespace["acts"]}, no_grad=True).saved["out"]
            assert torch.allclose(namespace["patched"][layer, pos], one, atol=1e-4), (layer, pos)
    # after the loop its names hold their last iteration's values, as in Python; nothing of the copies is left
    assert (namespace["layer"], namespace["pos"]) == (LAYERS - 1, POSITIONS - 1)
    assert not [name for name in namespace if name.startswith("_nbgrad")]
    assert_clean(model, before)


def hooked_grads(model, prompt):
    """Plain PyTorch: d logits.sum() / d (each block's c_proj input)."""
    ids = nbgrad.tokenizer_for(model)(prompt, return_tensors="pt")["input_ids"]
    inputs = []
    handles = [block.attn.c_proj.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
               for block in model.transformer.h]
    try:
        logits = model(ids).logits
    finally:
        for handle in handles:
            handle.remove()
    return torch.autograd.grad(logits.sum(), inputs)


def test_grad_of_a_name_a_loop_rebinds_is_each_iterations_own_tensor(model):
    before = model_state(model)
    namespace = {"model": model}
    nbgrad.trace(model, CLEAN, """
grads = []
for layer in model.transformer.h:
    attn_out = layer.attn.c_proj.input
    grads.append(attn_out.grad.save())
model.output.logits.sum().backward()
""", namespace)
    expected = hooked_grads(model, CLEAN)
    assert len(namespace["grads"]) == len(expected) == len(model.transformer.h)
    for got, want in zip(namespace["grads"], expected):
        assert torch.allclose(got, want, atol=1e-5)
    assert not [name for name in namespace if name.startswith("_nbgrad")]
    model.zero_grad(set_to_none=True)
    assert_clean(model, before)


def test_grad_of_a_rebound_name_inside_an_invoke(model):
    namespace = {"model": model, "clean": CLEAN, "corrupt": CORRUPT}
    nbgrad.trace(model, None, """
grads = []
with invoke(clean):
    for layer in model.transformer.h:
        attn_out = layer.attn.c_proj.input
        grads.append(attn_out.grad.save())
with invoke(corrupt):
    other = model.lm_head.output.save()
model.output.logits.sum().backward()
""", namespace)
    expected = hooked_grads(model, CLEAN)
    for got, want in zip(namespace["grads"], expected):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    model.zero_grad(set_to_none=True)


def test_a_loop_of_invokes_over_a_name_the_cell_binds_is_an_error_that_says_so(model):
    before = model_state(model)
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, "n = 2\nfor i in range(n):\n    with invoke('Paris'):\n"
                                  "        x = model.lm_head.output.save()", {"model": model})
    assert ("line 2: a `for` loop that makes invokes (or reads `.grad` of a name it binds) runs over its elements "
            "before the model does: `range(n)` could not be evaluated from the notebook's names (NameError"
            in str(caught.value))
    assert_clean(model, before)


def test_an_invoke_in_a_loop_with_break_is_still_refused(model):
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, "for i in range(2):\n    with invoke('Paris'):\n"
                                  "        x = model.lm_head.output.save()\n    break", {"model": model})
    assert "line 2: `with invoke(...)` must stand at the top level of the cell, in a `for` loop or an `if` there" \
           in str(caught.value)


@pytest.mark.parametrize("loop", ["for prompt, block in zip(prompts, model.transformer.h):\n    with invoke(prompt):",
                                  "for i, block in enumerate(model.transformer.h[:3]):\n    with invoke(prompts[i]):"])
def test_each_invoke_of_a_loop_takes_its_own_input_and_module(model, loop):
    prompts = [CLEAN, "Paris", CORRUPT]
    namespace = {"model": model, "prompts": prompts}
    result = nbgrad.trace(model, None, f"last = []\n{loop}\n        last.append(block.output[:, -1].save())",
                          namespace, no_grad=True)
    assert result.invokes == prompts
    for i, prompt in enumerate(prompts):
        ids = nbgrad.tokenizer_for(model)(prompt, return_tensors="pt")["input_ids"]
        seen = {}
        handle = model.transformer.h[i].register_forward_hook(lambda m, a, o: seen.__setitem__("out", o))
        try:
            with torch.no_grad():
                model(ids)
        finally:
            handle.remove()
        assert torch.allclose(namespace["last"][i], seen["out"][:, -1], atol=1e-5), prompt


def test_an_error_in_an_unrolled_loop_leaves_no_name_of_its_copies_and_a_clean_model(model):
    before = model_state(model)
    namespace = {"model": model}
    with pytest.raises(ZeroDivisionError):
        nbgrad.trace(model, None, "for i in range(2):\n    with invoke('Paris'):\n"
                                  "        x = model.transformer.h[i].output.save()\n        y = 1 / 0", namespace)
    assert not [name for name in namespace if name.startswith("_nbgrad")]
    assert_clean(model, before)
    assert nbgrad.trace(model, "Paris", "z = model.lm_head.output.save()", namespace).saved["z"].shape[0] == 1


class _NeverCopied:
    def __deepcopy__(self, memo):
        raise AssertionError("a tree hanging off the parser's shared nodes was copied")


def test_a_parent_set_on_the_parsers_shared_nodes_is_never_copied(model):
    """IPython's tracebacks set `parent` on every node of the trees they parse, the parser's shared context and operator
    nodes included: after the first traceback of a session, a deep copy of any cell's tree followed them into earlier
    trees (a cell unrolling a loop of invokes, copied before every run, took seconds in a long session). Here the
    shared nodes point at something that may not be copied while such a cell compiles and runs."""
    import ast
    from nbgrad.engine.compile.astcopy import SHARED
    cell = ("outs = []\nfor i in range(2):\n    with invoke(corrupt):\n        model.transformer.h[i].output[:, 0] = 0\n"
            "        outs.append(model.lm_head.output[:, -1].save())\n")
    shared = {id(node): node for node in ast.walk(ast.parse(cell)) if isinstance(node, SHARED)}
    assert {type(node).__name__ for node in shared.values()} == {"Load", "Store", "USub"}
    poisoned = {"model": model, "corrupt": CORRUPT}
    try:
        for node in shared.values():
            node.parent = _NeverCopied()
        nbgrad.trace(model, None, cell, poisoned, no_grad=True)
    finally:
        for node in shared.values():
            del node.parent
    plain = {"model": model, "corrupt": CORRUPT}
    nbgrad.trace(model, None, cell, plain, no_grad=True)
    assert len(poisoned["outs"]) == 2 and all(torch.equal(a, b) for a, b in zip(poisoned["outs"], plain["outs"]))
