"""Pasted nnsight code: in a body, `tracer.cache(...)`, `tracer.stop()`, `with tracer.invoke(...)`, and in
%%generate `tracer.iter[...]` / `tracer.all()`, equal nbgrad's own forms and plain hooks on the same weights;
a form nbgrad lacks is an error that names nbgrad's way; a notebook's own `tracer` is left alone."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state, tiny_gpt2

IDS = torch.tensor([[5, 9, 2, 7, 11]])
CLEAN, CORRUPT = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"


def plain_outputs(model, ids, names, edit=None):
    """The outputs of named modules, by plain forward hooks (`edit(name, output)` may change one)."""
    modules, kept = dict(model.named_modules()), {}

    def keep(name):
        def hook(module, args, output):
            if edit is not None:
                edit(name, output)
            kept[name] = output.detach().clone()
        return hook
    handles = [modules[n].register_forward_hook(keep(n)) for n in names]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return kept


def test_tracer_cache_is_cache_and_equals_plain_hooks():
    model = tiny_gpt2()
    pasted = nbgrad.trace(model, IDS, 'c = tracer.cache("transformer.h.*")\n', {"model": model}).saved["c"]
    own = nbgrad.trace(model, IDS, 'c = cache("transformer.h.*")\n', {"model": model}).saved["c"]
    names = [f"transformer.h.{i}" for i in range(4)]
    plain = plain_outputs(model, IDS, names)
    assert list(pasted) == list(own) and set(names) <= set(pasted)
    for name in names:
        torch.testing.assert_close(pasted[name].detach(), plain[name])
        torch.testing.assert_close(pasted[name], own[name])


def test_tracer_stop_is_stop():
    model = tiny_gpt2()
    before = model_state(model)
    calls = []
    handle = model.lm_head.register_forward_hook(lambda *args: calls.append(1))
    try:
        namespace = {"model": model}
        saved = nbgrad.trace(model, IDS, "h = model.transformer.h[1].output.save()\ntracer.stop()\n", namespace).saved
    finally:
        handle.remove()
    assert calls == []                                   # the run ended at block 1
    plain = plain_outputs(model, IDS, ["transformer.h.1"])
    torch.testing.assert_close(saved["h"].detach(), plain["transformer.h.1"])
    assert "tracer" not in namespace
    assert_clean(model, before)


PATCH = """with {t}invoke(clean):
    h = model.transformer.h[1].output[:, -1].save()
with {t}invoke(corrupt):
    model.transformer.h[1].output[:, -1] = h
    patched = model.lm_head.output[:, -1].save()
"""


def test_tracer_invoke_is_invoke_and_equals_hand_patching(default_model):
    model = default_model
    namespace = {"model": model, "clean": CLEAN, "corrupt": CORRUPT}
    pasted = nbgrad.trace(model, None, PATCH.format(t="tracer."), dict(namespace)).saved
    own = nbgrad.trace(model, None, PATCH.format(t=""), dict(namespace)).saved
    tokenizer = nbgrad.tokenizer_for(model)
    clean_ids, corrupt_ids = (tokenizer(p, return_tensors="pt")["input_ids"] for p in (CLEAN, CORRUPT))
    clean_h = plain_outputs(model, clean_ids, ["transformer.h.1"])["transformer.h.1"][:, -1]

    def patch(name, output):
        if name == "transformer.h.1":
            output[:, -1] = clean_h
    patched = plain_outputs(model, corrupt_ids, ["transformer.h.1", "lm_head"], edit=patch)["lm_head"][:, -1]
    torch.testing.assert_close(pasted["patched"].detach(), patched, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(pasted["patched"], own["patched"])


def _lm():
    model = tiny_gpt2()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def hand_generation(model, halve_at):
    """`model.generate` with a plain hook that halves block 0's output at the steps in `halve_at`: the tokens, and
    the logits of every step."""
    step, logits = [-1], []

    def count(module, args):
        step[0] += 1

    def halve(module, args, output):
        if step[0] in halve_at:
            return output * 0.5
    handles = [model.register_forward_pre_hook(count), model.transformer.h[0].register_forward_hook(halve),
               model.lm_head.register_forward_hook(lambda module, args, output: logits.append(output.clone()))]
    try:
        return model.generate(input_ids=IDS, max_new_tokens=5, do_sample=False), logits
    finally:
        for handle in handles:
            handle.remove()


KEEP = "logits = model.lm_head.output.save()\n"


@pytest.mark.parametrize("header, steps", [("with tracer.iter[1:3]:", {1, 2}), ("with tracer.iter[-2:]:", {3, 4}),
                                           ("with tracer.iter[2]:", {2}), ("with tracer.all():", {0, 1, 2, 3, 4}),
                                           ("for i in tracer.iter[1::2]:", {1, 3})])
def test_tracer_iter_and_all_select_steps_as_hand_hooks_do(header, steps):
    model = _lm()
    before = model_state(model)
    body = f"{header}\n    model.transformer.h[0].output[:] *= 0.5\n" + KEEP
    pasted = nbgrad.generate(model, IDS, body, {"model": model}, max_new_tokens=5)
    own = nbgrad.generate(model, IDS, f"if step in {sorted(steps)}:\n    model.transformer.h[0].output[:] *= 0.5\n"
                          + KEEP, {"model": model}, max_new_tokens=5)
    tokens, logits = hand_generation(model, steps)
    _, unedited = hand_generation(model, set())
    assert torch.equal(pasted.output, tokens) and torch.equal(own.output, tokens)
    for step in range(5):
        torch.testing.assert_close(pasted.saved["logits"][step], logits[step])
        torch.testing.assert_close(own.saved["logits"][step], logits[step])
        if step <= min(steps):     # nothing changes before the first selected step; that step changes
            assert torch.equal(logits[step], unedited[step]) == (step < min(steps))
    assert_clean(model, before)


def test_a_loop_over_tracer_iter_binds_the_step():
    model = _lm()
    body = "for i in tracer.iter[1:4]:\n    k = torch.tensor(i).save()\n    h = model.transformer.h[0].output.save()\n"
    saved = nbgrad.generate(model, IDS, body, {"model": model, "torch": torch}, max_new_tokens=5).saved
    assert saved["k"][0] is None and saved["k"][4] is None and [int(k) for k in saved["k"][1:4]] == [1, 2, 3]
    assert [h is None for h in saved["h"]] == [True, False, False, False, True]


def test_the_notebooks_own_tracer_is_left_alone():
    model = tiny_gpt2()

    class Mine:
        def stop(self):
            return "mine"
    namespace = {"model": model, "tracer": Mine()}
    saved = nbgrad.trace(model, IDS, "r = tracer.stop()\nh = model.transformer.h[3].output.save()\n", namespace).saved
    assert namespace["r"] == "mine" and saved["h"].shape == (1, 5, 32)       # the run went on: no stop()


def test_a_cell_that_binds_tracer_itself_is_left_alone():
    model = tiny_gpt2()
    namespace = {"model": model}
    nbgrad.trace(model, IDS, "tracer = {'stop': 3}\nr = tracer['stop']\n", namespace)
    assert namespace["r"] == 3


@pytest.mark.parametrize("body, message, line", [
    ("h = model.transformer.h[0].output.save()\ntracer.log(h)\n",
     "line 2: `tracer.log` is nnsight's; nbgrad has no such form: print(...) prints from the body", 2),
    ("tracer.barrier(2)\n", "`tracer.barrier` is nnsight's; nbgrad has no such form: nbgrad needs no barrier", 1),
    ("x = tracer.result\n", "`tracer.result` is nnsight's; nbgrad has no such form: the model's output is "
                            "`model.output`", 1),
    ("print(tracer)\n", "`tracer` on its own is nnsight's tracer object; nbgrad has none to pass around. "
                        "nbgrad's forms: `cache(...)`, `stop()`, `with invoke(INPUT):`", 1),
    ("\nwith tracer.iter[1:2]:\n    pass\n", "`tracer.iter` / `tracer.all()` select generation steps: they belong "
                                            "in a %%generate cell", 2),
    ("x = tracer.iter\n", "`tracer.iter` is nnsight's; nbgrad has no such form: they select generation steps", 1),
])
def test_forms_nbgrad_lacks_name_nbgrads_way(body, message, line):
    model = tiny_gpt2()
    before = model_state(model)
    namespace = {"model": model}
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, IDS, body, namespace)
    assert message in str(caught.value) and caught.value.line == line
    assert set(namespace) == {"model"}
    assert_clean(model, before)


def test_a_pasted_body_runs_under_the_magic(shell, default_model):
    shell.user_ns.update(model=default_model, clean=CLEAN, corrupt=CORRUPT)
    shell.user_ns.pop("tracer", None)
    assert shell.run_cell("%%trace model\n" + PATCH.format(t="tracer."), store_history=False).success
    pasted = shell.user_ns.pop("patched")
    own = nbgrad.trace(default_model, None, PATCH.format(t=""), {"model": default_model, "clean": CLEAN,
                                                                 "corrupt": CORRUPT}).saved["patched"]
    torch.testing.assert_close(pasted, own)
    result = shell.run_cell("%%generate model clean --max-new-tokens 3 --out ids -q\nwith tracer.iter[1:]:\n"
                            "    model.transformer.h[0].output[:] *= 0.5\n", store_history=False)
    assert result.success and shell.user_ns.pop("ids").shape[1] == len(nbgrad.tokenizer_for(default_model)(CLEAN)
                                                                        ["input_ids"]) + 3
