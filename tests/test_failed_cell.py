"""A failed cell binds no name, whatever the error: the namespace is as it was before the cell (SPEC §4), on
the direct run and on the general runtime alike, and the model carries no hook."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state

READ = "a = model.transformer.h[1].output.save()\nx = 1\n"
FAILING = {
    "an OrderError": (nbgrad.OrderError, READ + "model.transformer.h[0].output[:] = a * 2\n"),
    "a TypeError of the cell": (TypeError, READ + "y = a + 'text'\n"),
    "a wrong module path": (nbgrad.NbgradError, READ + "model.transformer.h[9].output.save()\n"),
    "the cell's own raise": (ValueError, READ + "raise ValueError('mine')\n"),
    "a bad skip": (nbgrad.NbgradError, READ + "model.transformer.h[2].skip(None)\n"),
    "an error inside the model": (RuntimeError, READ + "model.transformer.h[2].output = torch.zeros(3)\n"),
    "a site write of the wrong shape": (nbgrad.NbgradError,
                                        READ + "model.transformer.h[2].attn.source.self_c_attn_1.output = torch.zeros(3)\n"),
    "stop with an argument": (nbgrad.NbgradError, READ + "stop(5)\n"),
}


@pytest.fixture(params=["fast", "general"], ids=["direct run", "general runtime"])
def runner(request):
    return request.param


@pytest.mark.parametrize("kind", sorted(FAILING))
def test_a_failed_cell_binds_no_name(default_model, runner, kind):
    error, cell = FAILING[kind]
    before = model_state(default_model)
    namespace = {"model": default_model, "torch": torch, "a": "a before", "y": "y before"}
    with pytest.raises(error):
        nbgrad.trace(default_model, "Hello there", cell, namespace, runner=runner)
    namespace.pop("__builtins__", None)     # put there as `exec` puts it, by any run
    assert namespace == {"model": default_model, "torch": torch, "a": "a before", "y": "y before"}
    assert_clean(default_model, before)
    nbgrad.trace(default_model, "Hello there", READ, namespace, runner=runner)         # the next cell works and binds
    assert namespace["x"] == 1 and namespace["a"].shape[:1] == (1,)


def test_an_interrupt_inside_the_model_binds_no_name(default_model, runner):
    before = model_state(default_model)

    def interrupt(*_):
        raise KeyboardInterrupt
    handle = default_model.transformer.h[2].register_forward_hook(interrupt)
    namespace = {"model": default_model}
    try:
        with pytest.raises(KeyboardInterrupt):
            nbgrad.trace(default_model, "Hello there", READ, namespace, runner=runner)
    finally:
        handle.remove()
    namespace.pop("__builtins__", None)
    assert namespace == {"model": default_model}
    assert_clean(default_model, before)
