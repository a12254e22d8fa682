"""Where a cell's fixed cost goes: the time of a run split at the model's own forward call, nbgrad against
the same work with raw hooks (the scenarios of overhead.py), so that the next change to the engine knows
which part to work on.

    before   from the call to the model's forward starting: arguments, compiling (cached), the run's
             set-up, the statements that start before the model, registering hooks
    forward  the model's forward with every hook on its modules (the statements woken by events)
    after    from the forward's end to the call returning and its result freed: hooks on the model
             itself, the result, clean-up, and freeing what the run held (raw hooks free the same graph)

Each scenario runs nbgrad and raw hooks in alternating pairs; each phase is the median over the runs, and
the difference column is nbgrad minus raw. With `--small`, on the GPT-2-small shape: there each block's weights
push out of the caches (and the address translation's) what nbgrad's code at an event touches, so the forward
column shows best what an event costs, and which objects it reads that are old and far apart (the model's own
dicts, the compiled program; run/elements.py). Run: `python bench/phases.py [--runs N] [--small]`.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import nbgrad
from overhead import (SAVE_ALL, SAVE_ONE, SCALE_ALL, embedded_setup, raw_save_all, raw_save_one,
                      raw_scale_all)

PHASES = ("before", "forward", "after")


class Clock:
    """Timestamps of the model's forward starting and ending, from hooks on the model put first and last."""

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


def split(model, nbgrad_fn, raw_fn, runs: int) -> tuple:
    """(nbgrad's phases, raw's phases): per-phase medians in seconds, over `runs` alternating pairs."""
    clock = Clock(model)
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
          f"alternating pairs; medians in us "
          f"(nbgrad / raw hooks / difference)")
    print(f"  {'':32s}" + "".join(f"{phase:>29s}" for phase in PHASES))
    for label, (ours, raw) in scenarios.items():
        mine, theirs = split(model, ours, raw, args.runs)
        cells = "".join(f"{a * 1e6:9.1f} /{b * 1e6:9.1f} /{(a - b) * 1e6:+7.1f}" for a, b in zip(mine, theirs))
        print(f"  {label:32s}{cells}")


if __name__ == "__main__":
    main()
