"""An edit in a later invoke that reads an element of a list or dict an earlier invoke built in a loop
(`clean = [model.transformer.h[i].output[:, -1] for i in range(4)]`, then `... = clean[layer]`): statements are
ordered by whole names, so the edit waits for the whole loop and comes too late. The error says so and names what to
write, with the cell's own texts; what it names runs and equals plain hooks."""
import pytest
import torch

import nbgrad
from helpers import alone, hook_count

CLEAN, CORRUPT = "The Eiffel Tower is in", "The Colosseum is in"
BUILT = {
    "a list comprehension": f"with invoke({CLEAN!r}):\n    clean = [model.transformer.h[i].output[:, -1] for i in range(4)]\n",
    "a dict comprehension": f"with invoke({CLEAN!r}):\n    clean = {{i: model.transformer.h[i].output[:, -1] for i in range(4)}}\n",
    "a loop appending": (f"clean = []\nwith invoke({CLEAN!r}):\n    for i in range(4):\n"
                         f"        clean.append(model.transformer.h[i].output[:, -1])\n"),
}
CONSTANT = f"with invoke({CORRUPT!r}):\n    model.transformer.h[1].output[:, -1] = clean[1]\n    out = model.lm_head.output[:, -1].save()\n"
LOOPED = (f"with invoke({CORRUPT!r}):\n    for layer in range(4):\n        model.transformer.h[layer].output[:, -1] = "
          f"clean[layer]\n    out = model.lm_head.output[:, -1].save()\n")


@pytest.mark.parametrize("built", sorted(BUILT))
def test_an_element_read_by_a_constant_index_names_a_statement_of_its_own(default_model, built):
    line = 4 if built == "a loop appending" else 2        # the line that reads the events of the loop
    with pytest.raises(nbgrad.OrderError) as raised:
        nbgrad.trace(default_model, None, BUILT[built] + CONSTANT, {"model": default_model})
    message = str(raised.value)
    assert "model.transformer.h[1].output is edited too late" in message
    assert "nbgrad orders statements by whole names, not elements" in message
    assert (f"Read the element the edit needs in a statement of its own, in the invoke of line {line}: "
            f"`clean_1 = model.transformer.h[1].output...`, and edit with `clean_1`") in message
    assert hook_count(default_model) == 0


def test_an_element_read_by_a_loops_index_names_one_loop_of_invokes(default_model):
    with pytest.raises(nbgrad.OrderError) as raised:
        nbgrad.trace(default_model, None, BUILT["a list comprehension"] + LOOPED, {"model": default_model})
    assert ("the read and the edit in one loop, an invoke each: `for layer in ...:`, `with invoke(...): clean = "
            "model.transformer.h[layer].output...`, then `with invoke(...): model.transformer.h[layer].output... = "
            "clean`") in str(raised.value)
    assert hook_count(default_model) == 0


def test_what_the_constant_error_names_equals_plain_hooks(default_model):
    cell = (f"with invoke({CLEAN!r}):\n    clean_1 = model.transformer.h[1].output[:, -1]\n"
            f"with invoke({CORRUPT!r}):\n    model.transformer.h[1].output[:, -1] = clean_1\n"
            f"    out = model.lm_head.output[:, -1].save()\n")
    result = nbgrad.trace(default_model, None, cell, {"model": default_model})
    clean = alone(default_model, CLEAN, 1)[0][:, -1]
    patched = alone(default_model, CORRUPT, 1, edit=lambda output: output[:, -1].copy_(clean))[1][:, -1]
    torch.testing.assert_close(result.saved["out"], patched)


def test_what_the_loop_error_names_equals_plain_hooks(default_model):
    cell = (f"outs = []\nfor layer in range(4):\n    with invoke({CLEAN!r}):\n"
            f"        clean = model.transformer.h[layer].output[:, -1]\n    with invoke({CORRUPT!r}):\n"
            f"        model.transformer.h[layer].output[:, -1] = clean\n"
            f"        outs.append(model.lm_head.output[:, -1].save())\n")
    namespace = {"model": default_model}
    nbgrad.trace(default_model, None, cell, namespace)
    for layer in range(4):
        clean = alone(default_model, CLEAN, layer)[0][:, -1]
        patched = alone(default_model, CORRUPT, layer, edit=lambda output: output[:, -1].copy_(clean))[1][:, -1]
        torch.testing.assert_close(namespace["outs"][layer], patched)
