"""Invokes made under an `if`, in a function the cell calls and in a comprehension (SPEC §2, several inputs in
one cell): one batch row set per block entered, each value equal to one trace per patch and to plain hooks."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
OTHER = "Paris is"
LAYERS = 3


@pytest.fixture(scope="module")
def model():
    return nbgrad.load_model()


def ids_of(model, prompt):
    return nbgrad.tokenizer_for(model)(prompt, return_tensors="pt")["input_ids"]


def hooked_last_logits(model, prompt, layer=None, scale=0.0):
    """Plain PyTorch: the last position's logits of `prompt` alone, with block `layer`'s output at the last
    position multiplied by `scale` (no edit when `layer` is None)."""
    def hook(module, args, output):
        output = output.clone()
        output[:, -1] *= scale
        return output
    handle = None if layer is None else model.transformer.h[layer].register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(ids_of(model, prompt)).logits[0, -1]
    finally:
        if handle is not None:
            handle.remove()


def one_trace(model, prompt, layer):
    """The same patch as one trace of its own."""
    return nbgrad.trace(model, prompt, f"model.transformer.h[{layer}].output[:, -1] *= 0\n"
                                       "out = model.lm_head.output[0, -1].save()", {"model": model},
                        no_grad=True).saved["out"]


def test_an_if_in_a_loop_enters_the_invokes_its_test_chooses(model):
    before = model_state(model)
    namespace = {"model": model, "corrupt": CORRUPT, "other": OTHER, "LAYERS": LAYERS}
    result = nbgrad.trace(model, None, """
patched, plain = {}, {}
for layer in range(LAYERS):
    if layer % 2 == 0:
        with invoke(corrupt):
            model.transformer.h[layer].output[:, -1] *= 0
            logits = model.lm_head.output[0, -1]
            patched[layer] = logits.save()
    else:
        with invoke(other):
            plain[layer] = model.lm_head.output[0, -1].save()
""", namespace, no_grad=True)
    assert result.invokes == [CORRUPT, OTHER, CORRUPT]        # one invoke per block entered, in order
    assert sorted(namespace["patched"]) == [0, 2] and sorted(namespace["plain"]) == [1]
    for layer in (0, 2):
        expected = hooked_last_logits(model, CORRUPT, layer)
        assert torch.allclose(namespace["patched"][layer], expected, atol=1e-4), layer
        assert torch.allclose(namespace["patched"][layer], one_trace(model, CORRUPT, layer), atol=1e-4), layer
    assert torch.allclose(namespace["plain"][1], hooked_last_logits(model, OTHER), atol=1e-4)
    assert torch.equal(namespace["logits"], namespace["patched"][2])     # the last iteration that bound it
    assert not [name for name in namespace if name.startswith("_nbgrad")]
    assert_clean(model, before)


def test_an_if_at_the_top_level_takes_its_else(model):
    namespace = {"model": model, "use_clean": False}
    result = nbgrad.trace(model, None, f"""
if use_clean:
    with invoke({CLEAN!r}):
        out = model.lm_head.output[0, -1].save()
else:
    with invoke({OTHER!r}):
        out = model.lm_head.output[0, -1].save()
""", namespace, no_grad=True)
    assert result.invokes == [OTHER]
    assert torch.allclose(namespace["out"], hooked_last_logits(model, OTHER), atol=1e-4)


@pytest.mark.parametrize("source, message", [
    ("limit = 1\nfor layer in range(3):\n    if layer > limit:\n        with invoke('Paris'):\n"
     "            x = model.lm_head.output.save()",
     "line 3: an `if` around `with invoke(...)` is decided before the model runs: `0 > limit` reads `limit`, "
     "which this cell binds; compute it in an earlier cell"),
    ("n = 2\nfor i in range(n):\n    with invoke('Paris'):\n        x = model.lm_head.output.save()",
     "line 2: a `for` loop that makes invokes (or reads `.grad` of a name it binds) runs over its elements before "
     "the model does: `range(n)` reads `n`, which this cell binds; compute it in an earlier cell"),
    ("for i in range(2):\n    if model.lm_head.output.sum() > 0:\n        with invoke('Paris'):\n"
     "            x = model.lm_head.output.save()",
     "line 2: an `if` around `with invoke(...)` is decided before the model runs: "
     "`model.lm_head.output.sum() > 0` could not be evaluated from the notebook's names (AttributeError"),
])
def test_what_decides_the_invokes_must_be_known_before_the_run(model, source, message):
    """A test or an iterable that reads a name the cell binds would see the notebook's old value: refused."""
    before = model_state(model)
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, source, {"model": model, "n": 5, "limit": 0})
    assert message in str(caught.value)
    assert_clean(model, before)


PATCH = """
def patch(layer, scale=0.0):
    with invoke(corrupt):
        model.transformer.h[layer].output[:, -1] *= scale
        logits = model.lm_head.output[0, -1]
        return logits.save()
"""


@pytest.mark.parametrize("calls", [
    "outs = [patch(layer) for layer in range(LAYERS)]",
    "outs = []\nfor layer in range(LAYERS):\n    outs.append(patch(layer))",
    "outs = [patch(0), patch(1, scale=0.0), patch(layer=2)]",
    "outs = list(iter(patch(layer) for layer in range(LAYERS) if layer < LAYERS))",
])
def test_a_function_the_cell_defines_makes_one_invoke_per_call(model, calls):
    before = model_state(model)
    namespace = {"model": model, "corrupt": CORRUPT, "LAYERS": LAYERS}
    result = nbgrad.trace(model, None, PATCH + calls, namespace, no_grad=True)
    assert result.invokes == [CORRUPT] * LAYERS
    for layer in range(LAYERS):
        expected = hooked_last_logits(model, CORRUPT, layer)
        assert torch.allclose(namespace["outs"][layer], expected, atol=1e-4), layer
        assert torch.allclose(namespace["outs"][layer], one_trace(model, CORRUPT, layer), atol=1e-4), layer
    assert callable(namespace["patch"]) and "logits" not in namespace        # its own names stay its own
    assert not [name for name in namespace if name.startswith("_nbgrad")]
    assert_clean(model, before)


def test_a_comprehension_of_prompts_through_a_helper_gives_each_prompt_its_rows(model):
    prompts = [CLEAN, OTHER, CORRUPT]
    namespace = {"model": model, "prompts": prompts}
    result = nbgrad.trace(model, None, """
def last(prompt):
    with invoke(prompt):
        out = model.lm_head.output[:, -1].save()
    return out
outs = {prompt: last(prompt) for prompt in prompts}
""", namespace, no_grad=True)
    assert result.invokes == prompts and "prompt" not in namespace
    for prompt in prompts:
        assert torch.allclose(namespace["outs"][prompt][0], hooked_last_logits(model, prompt), atol=1e-4), prompt


def test_a_helper_from_an_earlier_cell_makes_invokes_in_a_loop(shell, model):
    shell.user_ns.update(model=model, corrupt=CORRUPT, LAYERS=LAYERS)
    assert shell.run_cell(PATCH).success
    try:
        result = shell.run_cell("%%trace model --no-grad -q\nouts = {}\nfor layer in range(LAYERS):\n"
                                "    if layer != 1:\n        outs[layer] = patch(layer)")
        assert result.success, result.error_in_exec
        outs = shell.user_ns["outs"]
        assert sorted(outs) == [0, 2]
        for layer in (0, 2):
            assert torch.allclose(outs[layer], hooked_last_logits(model, CORRUPT, layer), atol=1e-4), layer
        assert not [name for name in shell.user_ns if name.startswith("_nbgrad")]
    finally:
        for name in ("patch", "outs", "layer", "corrupt", "LAYERS"):
            shell.user_ns.pop(name, None)


@pytest.mark.parametrize("calls, message", [
    ("outs = list(map(patch, range(2)))", "line 7: `patch` makes invokes, which nbgrad lays out before the model "
     "runs, so it must be called by name at the cell's level, in a `for` loop, under an `if` or in a comprehension "
     "(`outs = [patch(x) for x in xs]`), not used as a value (passed to another function, stored or bound)"),
    ("outs = [patch(0) if LAYERS else None]", "not inside a lambda, a conditional expression or `and` / `or` "
     "(write an `if` statement)"),
    ("def twice():\n    return patch(0), patch(1)\nouts = twice()", "not inside another function, class or `try`"),
    ("outs = patch(*[0])", "not with `*args` or `**kwargs` (give each argument by name or position)"),
])
def test_a_form_that_cannot_make_invokes_says_what_to_write(model, calls, message):
    before = model_state(model)
    namespace = {"model": model, "corrupt": CORRUPT, "LAYERS": LAYERS}
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, PATCH + calls, namespace, no_grad=True)
    assert message in str(caught.value)
    assert_clean(model, before)


def test_a_return_before_the_end_is_refused(model):
    source = "def early(p):\n    if p:\n        return None\n    with invoke(p):\n" \
             "        return model.lm_head.output.save()\nx = early('Paris')"
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, source, {"model": model})
    assert "line 3: `early` makes invokes" in str(caught.value) and "not with a `return` before its end" \
        in str(caught.value)


def hooked_grad(model, prompt, layer):
    """Plain PyTorch: d (last position's logits summed) / d (block `layer`'s output), `prompt` alone."""
    kept = {}
    handle = model.transformer.h[layer].register_forward_hook(lambda m, a, o: kept.__setitem__("out", o))
    try:
        logits = model(ids_of(model, prompt)).logits
    finally:
        handle.remove()
    return torch.autograd.grad(logits[:, -1].sum(), kept["out"])[0]


def test_gradients_read_in_invokes_a_function_makes_are_each_prompts_own(model):
    before = model_state(model)
    prompts = [CLEAN, OTHER]
    namespace = {"model": model, "prompts": prompts}
    nbgrad.trace(model, None, """
def grad_of(prompt):
    with invoke(prompt):
        hidden = model.transformer.h[1].output
        grad = hidden.grad.save()
    return grad
grads = [grad_of(prompt) for prompt in prompts]
model.output.logits[:, -1].sum().backward()
""", namespace)
    for prompt, got in zip(prompts, namespace["grads"]):
        want = hooked_grad(model, prompt, 1)
        assert torch.allclose(got[:, -want.shape[1]:], want, rtol=1e-4, atol=1e-4), prompt
        assert not got[:, :-want.shape[1]].any(), prompt       # left padding gets no gradient
    model.zero_grad(set_to_none=True)
    assert_clean(model, before)


@pytest.mark.parametrize("source, message", [
    ("def last(p):\n    with invoke(p):\n        return model.lm_head.output.save()\nx = last(prompts[0].upper())",
     "line 4: `last` gives its parameter `p` to `invoke(...)`, whose INPUT is evaluated before the model runs, but "
     "the call passes `prompts[0].upper()`, which calls something: pass the input itself"),
    ("def last(p):\n    p = p + '!'\n    with invoke(p):\n        return model.lm_head.output.save()\nx = last('a')",
     "line 5: `last` gives its parameter `p` to `invoke(...)`, whose INPUT is evaluated before the model runs, but "
     "`last` assigns `p`: pass the input itself"),
])
def test_an_invoke_input_a_function_cannot_know_before_the_run_says_so(model, source, message):
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, source, {"model": model, "prompts": [OTHER]})
    assert message in str(caught.value)


def test_a_function_with_its_own_loop_of_invokes_called_in_a_loop(model):
    """Layers x positions: the function loops over positions, the cell over layers; one invoke per pair."""
    namespace = {"model": model, "corrupt": CORRUPT, "LAYERS": 2, "POSITIONS": [-1, -2]}
    result = nbgrad.trace(model, None, """
patched = {}
def sweep(layer):
    for pos in POSITIONS:
        with invoke(corrupt):
            model.transformer.h[layer].output[:, pos] *= 0
            patched[layer, pos] = model.lm_head.output[0, -1].save()
for layer in range(LAYERS):
    sweep(layer)
""", namespace, no_grad=True)
    assert len(result.invokes) == 4 and sorted(namespace["patched"]) == [(0, -2), (0, -1), (1, -2), (1, -1)]
    for (layer, pos), value in namespace["patched"].items():
        one = nbgrad.trace(model, CORRUPT, f"model.transformer.h[{layer}].output[:, {pos}] *= 0\n"
                                           "out = model.lm_head.output[0, -1].save()", {"model": model},
                           no_grad=True).saved["out"]
        assert torch.allclose(value, one, atol=1e-4), (layer, pos)
