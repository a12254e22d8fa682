"""Where a cell's fixed cost goes: the time of a run split at the model's own forward call, nbgrad against
the same work with raw hooks (the scenarios of overhead.py), so that the next change to the engine knows
which part to work on.

    before   from the call to the model's forward starting: arguments, compiling (cached), the run's
             set-up, the statements that start before the model, registering hooks
    forward  the model's forward with every hook on its modules (the statements woken by events)
    after    from the forward's end to the call returning and its result freed: hooks on the model
             itself, the result, clean-up, and freeing what the run held (raw hooks free the same graph)

The gradient scenario (e) splits `after` further: `to backward` runs until the first gradient of the backward pass
(the logits'), `backward` until the last (the input embeddings', where the pass ends), and `after` is the rest.

Each scenario runs nbgrad and raw hooks in alternating pairs; each phase is the median over the runs, and
the difference column is nbgrad minus raw. With `--small`, on the GPT-2-small shape: there each block's weights
push out of the caches (and the address translation's) what nbgrad's code at an event touches, so the forward
column shows best what an event costs, and which objects it reads that are old and far apart (the model's own
dicts, the compiled program; run/elements.py). Run: `python bench/phases.py [--runs N] [--small]`.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import nbgrad
from overhead import (GRAD_ONE, SAVE_ALL, SAVE_ONE, SCALE_ALL, embedded_setup, raw_grad_one, raw_save_all,
                      raw_save_one, raw_scale_all)


class Clock:
    """Timestamps of the model's forward starting and ending, from hooks on the model put first and last."""
    PHASES = ("before", "forward", "after")

    def __init__(self, model):
        self.start = self.end = None
        self.handles = [model.register_forward_pre_hook(self._started, prepend=True),
                        model.register_forward_hook(self._ended, always_call=True)]

    def _started(self, module, args):
        self.start = time.perf_counter()

    def _ended(self, module, args, output):
        self.end = time.perf_counter()

    def phases(self, run) -> tuple:
        """(before, forward, after) of one call of `run`, in seconds; its result is freed inside `after`."""
        began = time.perf_counter()
        run()
        finished = time.perf_counter()
        return self.start - began, self.end - self.start, finished - self.end

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


class GradientClock(Clock):
    """A Clock that marks the backward pass from the model's output too: it starts with the logits' gradient and ends
    with the input embeddings' (the first module of the forward is the last of the backward)."""
    PHASES = ("before", "forward", "to backward", "backward", "after")

    def __init__(self, model):
        super().__init__(model)
        self.backward_start = self.backward_end = None
        self.handles.append(model.get_input_embeddings().weight.register_hook(self._backward_ended))

    def _ended(self, module, args, output):
        super()._ended(module, args, output)
        output.logits.register_hook(self._backward_started)

    def _backward_started(self, grad):
        self.backward_start = time.perf_counter()

    def _backward_ended(self, grad):       # tied weights get a gradient twice: the last is the pass's end
        self.backward_end = time.perf_counter()

    def phases(self, run) -> tuple:
        began = time.perf_counter()
        run()
        finished = time.perf_counter()
        return (self.start - began, self.end - self.start, self.backward_start - self.end,
                self.backward_end - self.backward_start, finished - self.backward_end)


def split(model, nbgrad_fn, raw_fn, runs: int, clock_type: type = Clock) -> tuple:
    """(nbgrad's phases, raw's phases): per-phase medians in seconds, over `runs` alternating pairs."""
    clock = clock_type(model)
    try:
        for _ in range(5):
            nbgrad_fn(), raw_fn()
        ours, theirs = [], []
        for index in range(runs):
            pair = (nbgrad_fn, raw_fn) if index % 2 else (raw_fn, nbgrad_fn)
            for fn in pair:
                (ours if fn is nbgrad_fn else theirs).append(clock.phases(fn))
    finally:
        clock.close()
    return tuple(statistics.median(column) for column in zip(*ours)), \
        tuple(statistics.median(column) for column in zip(*theirs))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--small", action="store_true", help="the GPT-2-small shape (random weights)")
    args = parser.parse_args(argv)
    model, _, ids = embedded_setup()
    if args.small:
        model, ids = GPT2LMHeadModel(GPT2Config()).eval(), torch.randint(0, 50257, (1, 16))
    scenarios = {
        "(a) save one block output": (lambda: nbgrad.trace(model, ids, SAVE_ONE), lambda: raw_save_one(model, ids)),
        "(b) save every block output": (lambda: nbgrad.trace(model, ids, SAVE_ALL),
                                        lambda: raw_save_all(model, ids)),
        "(c) scale every block in place": (lambda: nbgrad.trace(model, ids, SCALE_ALL),
                                           lambda: raw_scale_all(model, ids)),
    }
    print(f"{'GPT-2-small-shaped model' if args.small else 'embedded default model'}, {args.runs} runs each in "
          f"alternating pairs; medians in us (nbgrad / raw hooks / difference)")
    table(model, scenarios, args.runs, Clock)
    zero = functools.partial(model.zero_grad, set_to_none=True)
    table(model, {"(e) one block's gradient": (lambda: (nbgrad.trace(model, ids, GRAD_ONE), zero()),
                                               lambda: (raw_grad_one(model, ids), zero()))}, args.runs, GradientClock)


def table(model, scenarios: dict, runs: int, clock_type: type) -> None:
    print(f"  {'':32s}" + "".join(f"{phase:>29s}" for phase in clock_type.PHASES))
    for label, (ours, raw) in scenarios.items():
        mine, theirs = split(model, ours, raw, runs, clock_type)
        cells = "".join(f"{a * 1e6:9.1f} /{b * 1e6:9.1f} /{(a - b) * 1e6:+7.1f}" for a, b in zip(mine, theirs))
        print(f"  {label:32s}{cells}")


if __name__ == "__main__":
    main()
