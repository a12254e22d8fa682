"""`stop()` in a cell ends the model run after the current statement: later modules never run (checked
with plain forward hooks that count their calls)."""
import pytest
import torch

import nbgrad
from helpers import assert_clean, model_state

IDS = torch.tensor([[5, 9, 2, 7, 11]])


class Counting:
    """Plain forward hooks that count each module's calls and keep its output."""

    def __init__(self, model, names):
        modules = dict(model.named_modules())
        self.calls, self.outputs = {n: 0 for n in names}, {}
        self.handles = [modules[n].register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name):
        def hook(mod, args, output):
            self.calls[name] += 1
            self.outputs[name] = output
        return hook

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


NAMES = ["transformer.h.0", "transformer.h.1", "transformer.h.2", "lm_head"]


def test_later_modules_never_run(tiny):
    before = model_state(tiny)
    ns = {"model": tiny}
    with Counting(tiny, NAMES) as counted:
        nbgrad.trace(tiny, IDS, "h1 = model.transformer.h[1].output.save()\nstop()\nc = cache()", ns)
    assert counted.calls == {"transformer.h.0": 1, "transformer.h.1": 1, "transformer.h.2": 0, "lm_head": 0}
    assert torch.equal(ns["h1"], counted.outputs["transformer.h.1"])
    assert list(ns["c"])[-1] == "transformer.h.1"          # nothing after the stop was cached
    assert_clean(tiny, before)


def test_stop_inside_a_statement_that_reads(tiny):
    with Counting(tiny, NAMES) as counted:
        nbgrad.trace(tiny, IDS, "if model.transformer.h[0].output.abs().sum() > 0:\n    stop()")
    assert counted.calls["transformer.h.0"] == 1 and counted.calls["transformer.h.1"] == 0


def test_stop_with_nothing_above_runs_no_module(tiny):
    with Counting(tiny, NAMES) as counted:
        nbgrad.trace(tiny, IDS, "stop()")
    assert set(counted.calls.values()) == {0}


def test_reading_a_later_event_names_both_lines(tiny):
    before = model_state(tiny)
    with Counting(tiny, NAMES) as counted:
        with pytest.raises(nbgrad.OrderError) as caught:
            nbgrad.trace(tiny, IDS, "a = model.transformer.h[0].output.save()\nstop()\n"
                                    "b = model.lm_head.output.save()")
    message = str(caught.value)
    assert message.startswith("line 3:") and "stop() at line 2" in message and "model.lm_head" in message
    assert counted.calls["lm_head"] == 0
    assert_clean(tiny, before)
    assert nbgrad.trace(tiny, IDS, "x = model.lm_head.output.save()").saved["x"].shape[-1] == 97


def test_stop_in_generate_says_what_to_use(tiny):
    tiny.generation_config.pad_token_id = 0
    before = model_state(tiny)
    with pytest.raises(nbgrad.NbgradError, match="--max-new-tokens"):
        nbgrad.generate(tiny, IDS, "stop()", max_new_tokens=2)
    assert_clean(tiny, before)


def test_stop_in_one_invoke_says_it_ended_the_run_of_every_invoke(tiny):
    before = model_state(tiny)
    """The invokes are one batch and one model call: another invoke's later read cannot come, and the message says
    why, naming the stop's line."""
    source = ("with invoke(torch.tensor([[5, 9, 2]])):\n    x = model.transformer.h[0].output.save()\n    stop()\n"
              "with invoke(torch.tensor([[7, 1, 3]])):\n    y = model.transformer.h[1].output.save()\n")
    with pytest.raises(nbgrad.OrderError) as caught:
        nbgrad.trace(tiny, None, source, {"model": tiny, "torch": torch})
    assert str(caught.value).startswith("line 5: model.transformer.h[1].output never came: stop() at line 3 ended the "
                                        "model run (for the whole batch: every invoke runs in that one call) before "
                                        "model.transformer.h[1] ran")
    assert_clean(tiny, before)


@pytest.mark.parametrize("call, given", [("stop(5)", "5"), ("stop(after=model.transformer.h[0])", "after=")])
def test_stop_with_an_argument_says_it_takes_none(tiny, call, given):
    before = model_state(tiny)
    with Counting(tiny, NAMES) as counted:
        with pytest.raises(nbgrad.NbgradError) as caught:
            nbgrad.trace(tiny, IDS, "a = model.transformer.h[0].output.save()\n" + call, {"model": tiny})
    message = str(caught.value)
    assert message.startswith(f"line 2: stop() takes no arguments (given: {given}")
    assert message.endswith("): it ends the model run once the statement that calls it has run. To stop after a "
                            "module, call stop() after the line that reads that module's output")
    assert counted.calls["lm_head"] == 0            # it stopped all the same: nothing ran on past line 2
    assert_clean(tiny, before)
