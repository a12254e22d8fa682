"""Fuzzed cells: random small `%%trace` bodies of reads, saves, edits and gradient reads / edits on a tiny
GPT-2, each run through `nbgrad.trace`. After every cell, success or error: no hook of any kind on the
model, flags and grad mode as before, no temporary names left in the namespace; after a success, every
saved value and every parameter gradient equals the same cell done with plain PyTorch hooks.

`make test` runs a fixed, bounded set (derandomized: the same examples every run). More, random ones:
`NBGRAD_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz_cells.py`.
"""
import os
from collections import defaultdict
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbgrad
from helpers import hook_count, tensor_hook_count, tiny_gpt2

EXAMPLES = int(os.environ.get("NBGRAD_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=EXAMPLES or 40, deadline=None, derandomize=not EXAMPLES, database=None,
                suppress_health_check=list(HealthCheck), print_blob=True)

SITES = ["model.transformer.h[0]", "model.transformer.h[1]", "model.transformer.h[2]",
         "model.transformer.h[1].mlp", "model.transformer.ln_f", "model.lm_head"]
GRAD_SITES = SITES[:5]
# torch 2.13 segfaults in `register_hook` on a view that was edited by slice assignment (the MLP's output
# is a `.view()` of its projection): plain PyTorch crashes the same way, so the grammar does not make
# that pair. Slice edits go to outputs that are no views.
SLICE_SITES = [site for site in SITES if not site.endswith(".mlp")]
FACTORS = [0.5, 2.0, -1.0]
IDS = torch.tensor([[3, 17, 42, 5, 88]])
LENGTH = IDS.shape[1]
MODEL = tiny_gpt2(n_layer=3, seed=11)


@dataclass(frozen=True)
class Step:
    kind: str               # read | save | unsaved | input | mul | slice | replace | freeze* | g* | error kinds
    site: str = ""
    value: float = 0.0
    position: int = 0


forward_steps = st.one_of(
    st.builds(Step, st.sampled_from(["read", "save", "unsaved", "input"]), st.sampled_from(SITES)),
    st.builds(Step, st.sampled_from(["mul", "replace"]), st.sampled_from(SITES), st.sampled_from(FACTORS)),
    st.builds(Step, st.just("slice"), st.sampled_from(SLICE_SITES), st.sampled_from(FACTORS),
              st.integers(0, LENGTH - 1)),
    st.builds(Step, st.sampled_from(["freeze", "freeze_bound"]), st.sampled_from(["0", "1", "2"])),
)
# In-place edits of a gradient, both ways (`M.output.grad.mul_(c)` with the module's path is
# test_spec_promises.py::test_mul_edit_of_a_module_output_grad_by_its_path)
GRAD_EDITS = ["gmul", "gmul_"]
grad_steps = st.one_of(
    st.builds(Step, st.just("gread"), st.sampled_from(GRAD_SITES)),
    st.builds(Step, st.sampled_from(GRAD_EDITS), st.sampled_from(GRAD_SITES), st.sampled_from(FACTORS)),
    st.builds(Step, st.just("gslice"), st.sampled_from(GRAD_SITES), st.just(0.0), st.integers(0, LENGTH - 1)),
)
error_steps = st.sampled_from([Step("raise"), Step("badpath"), Step("late")])


@st.composite
def cells(draw):
    forward = draw(st.lists(forward_steps, min_size=1, max_size=6))
    backward = draw(st.lists(grad_steps, max_size=4)) if draw(st.booleans()) else []
    error = draw(st.one_of(st.none(), error_steps)) if draw(st.integers(0, 4)) == 0 else None
    if error is not None:
        forward.insert(draw(st.integers(0, len(forward))), error)
    no_grad = not backward and draw(st.booleans())
    return forward, backward, no_grad, draw(st.sampled_from(FORMS))


# --- the cell's text ---------------------------------------------------------------------------------

def line(step: Step, index: int) -> str:
    name, site = f"v{index}", step.site
    return {
        "read": f"{name} = {site}.output.clone().save()",
        "save": f"{name} = nbgrad.save({site}.output.clone())",
        "unsaved": f"{name} = {site}.output",
        "input": f"{name} = {site}.input.clone().save()",
        "mul": f"{site}.output.mul_({step.value})",
        "slice": f"{site}.output[:, {step.position}] = {step.value}",
        "replace": f"{site}.output = {site}.output * {step.value}",
        # a bare statement, as people write it: it changes no name, so later reads keep any order
        # (test_spec_promises.py::test_a_flag_change_between_reads_keeps_any_order)
        "freeze": f"model.transformer.h[{site}].mlp.c_fc.weight.requires_grad_(False)",
        "freeze_bound": f"{name} = model.transformer.h[{site}].mlp.c_fc.weight.requires_grad_(False)",
        "gread": f"{name} = {site}.output.grad.clone().save()",
        "gmul": f"{site}.output.grad[:] *= {step.value}",
        "gmul_": f"{site}.output.grad.mul_({step.value})",
        "gslice": f"{site}.output.grad[:, {step.position}] = 0",
        "raise": "raise ValueError('raised by the cell')",
        "badpath": f"{name} = model.transformer.h[7].output",
        "late": "model.transformer.h[0].output[:] = model.transformer.h[2].output",
    }[step.kind]


# How the same cell is written: with the model's own paths; with canonical names (nbgrad/names) for the modules it
# reads and edits, which are the same modules; or inside an invoke made in a loop (one invoke of the whole input),
# with no INPUT on the line. Each gives what the plain hooks give.
FORMS = ["paths", "canonical", "invoke loop"]
CANONICAL = {"model.transformer.h[": "model.layers[", "model.transformer.ln_f": "model.ln_final",
             "model.lm_head": "model.unembed"}


def source(forward, backward, form="paths") -> str:
    lines = [line(step, index) for index, step in enumerate(forward)]
    if backward:
        lines.append("with model.lm_head.output.sum().backward():")
        lines += ["    " + line(step, len(forward) + index) for index, step in enumerate(backward)]
    if form == "canonical":
        lines = [_canonical(text) for text in lines]
    elif form == "invoke loop":
        lines = ["for _ in range(1):", "    with invoke(fuzz_ids):"] + ["        " + text for text in lines]
    return "\n".join(lines) + "\n"


def _canonical(text: str) -> str:
    """A line's module paths in canonical names, but for parameters (`.mlp.c_fc.weight`) and the wrong paths of the
    error steps, which stay as written."""
    if ".weight" in text or "h[7]" in text or text.startswith("model.transformer.h[0].output[:] = model"):
        return text
    for path, canonical in CANONICAL.items():
        text = text.replace(path, canonical)
    return text


# --- the same cell with plain PyTorch hooks ------------------------------------------------------------

def plain(model, forward, backward, no_grad):
    """Values of the cell's saved reads and the parameter gradients, done with raw hooks."""
    expected, handles = {}, []
    on_output, on_input, on_grad = defaultdict(list), defaultdict(list), defaultdict(list)
    for index, step in enumerate(forward):
        if step.kind == "input":
            on_input[step.site].append((index, step))
        elif step.kind in ("read", "save", "mul", "slice", "replace"):
            on_output[step.site].append((index, step))
    for index, step in enumerate(backward, start=len(forward)):
        on_grad[step.site].append((index, step))

    def forward_hook(site):
        def hook(module, args, output):
            for index, step in on_output[site]:
                if step.kind in ("read", "save"):
                    expected[f"v{index}"] = output.clone()
                elif step.kind == "mul":
                    output.mul_(step.value)
                elif step.kind == "slice":
                    output[:, step.position] = step.value
                else:
                    output = output * step.value
            if on_grad[site]:
                output.register_hook(grad_hook(site))
            return output
        return hook

    def grad_hook(site):
        def hook(grad):
            for index, step in on_grad[site]:
                if step.kind == "gread":
                    expected[f"v{index}"] = grad.clone()
                elif step.kind in ("gmul", "gmul_"):
                    grad = grad.clone().mul_(step.value)
                else:
                    grad = grad.clone()
                    grad[:, step.position] = 0
            return grad
        return hook

    def pre_hook(site):
        def hook(module, args):
            for index, _ in on_input[site]:
                expected[f"v{index}"] = args[0].clone()
        return hook

    frozen = [model.transformer.h[int(s.site)].mlp.c_fc.weight for s in forward if s.kind.startswith("freeze")]
    flags = [(p, p.requires_grad) for p in frozen]
    for site in set(on_output) | set(on_grad):
        handles.append(eval(site, {"model": model}).register_forward_hook(forward_hook(site)))
    for site in on_input:
        handles.append(eval(site, {"model": model}).register_forward_pre_hook(pre_hook(site)))
    try:
        for param in frozen:
            param.requires_grad_(False)
        with torch.set_grad_enabled(not no_grad):
            logits = model(IDS).logits
        if backward:
            logits.sum().backward()
    finally:
        for handle in handles:
            handle.remove()
        for param, flag in flags:
            param.requires_grad_(flag)
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return expected, grads


# --- the checks ------------------------------------------------------------------------------------------

def assert_clean_after(model, namespace, flags, grad_mode):
    assert hook_count(model) == 0, "hooks left on the model or its parameters"
    assert [p.requires_grad for p in model.parameters()] == flags, "requires_grad flags changed"
    assert torch.is_grad_enabled() == grad_mode, "grad mode changed"
    temporary = [n for n in namespace if n.startswith("__nbgrad")]     # nothing of ours is left
    assert not temporary, temporary
    for name, value in namespace.items():
        if isinstance(value, torch.Tensor):
            assert tensor_hook_count(value) == 0, f"a hook left on the saved value {name}"


def close(actual, expected):
    return actual.shape == expected.shape and torch.allclose(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.fuzz
@FUZZ
@given(cells())
def test_fuzzed_cells_leave_nothing_behind_and_equal_plain_pytorch(cell):
    forward, backward, no_grad, form = cell
    model = MODEL
    model.zero_grad(set_to_none=True)         # whatever an earlier failing example left
    text = source(forward, backward, form)
    namespace = {"model": model, "torch": torch, "nbgrad": nbgrad, "fuzz_ids": IDS}
    flags, grad_mode = [p.requires_grad for p in model.parameters()], torch.is_grad_enabled()
    failing = any(step.kind in ("raise", "badpath", "late") for step in forward)
    try:
        nbgrad.trace(model, None if form == "invoke loop" else IDS, text, namespace, no_grad=no_grad)
    except (ValueError, nbgrad.NbgradError) as error:
        assert failing, f"{type(error).__name__}: {error}\n--- cell:\n{text}"
        assert_clean_after(model, namespace, flags, grad_mode)
        model.zero_grad(set_to_none=True)
        return
    assert not failing, f"the cell should have failed:\n{text}"
    assert_clean_after(model, namespace, flags, grad_mode)
    got_grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    expected, expected_grads = plain(model, forward, backward, no_grad)
    for name, value in expected.items():
        assert name in namespace and close(namespace[name], value), f"{name} differs\n--- cell:\n{text}"
    for index, step in enumerate(forward):
        if step.kind == "unsaved":
            assert f"v{index}" not in namespace, f"v{index} was not saved but is still bound"
    for (name, _), got, want in zip(model.named_parameters(), got_grads, expected_grads):
        assert (got is None) == (want is None) and (got is None or close(got, want)), f"{name}.grad\n{text}"


def test_the_grammar_reaches_every_statement_kind():
    """The generator and its plain-PyTorch twin know every kind of step (a new kind needs both)."""
    kinds = {"read", "save", "unsaved", "input", "mul", "slice", "replace", "freeze", "freeze_bound", "gread", "gmul",
             "gmul_", "gslice", "raise", "badpath", "late"}
    for kind in kinds:
        assert line(Step(kind, "model.lm_head" if not kind.startswith("freeze") else "0", 2.0, 1), 3)


def test_each_form_writes_the_cell_its_way():
    forward, backward = [Step("read", "model.transformer.h[1]"), Step("freeze", "0")], [Step("gread", "model.lm_head")]
    assert source(forward, backward, "canonical") == (
        "v0 = model.layers[1].output.clone().save()\n"
        "model.transformer.h[0].mlp.c_fc.weight.requires_grad_(False)\n"
        "with model.unembed.output.sum().backward():\n"
        "    v2 = model.unembed.output.grad.clone().save()\n")
    assert source(forward, [], "invoke loop") == (
        "for _ in range(1):\n    with invoke(fuzz_ids):\n        v0 = model.transformer.h[1].output.clone().save()\n"
        "        model.transformer.h[0].mlp.c_fc.weight.requires_grad_(False)\n")
