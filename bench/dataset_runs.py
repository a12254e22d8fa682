"""`%%trace --over`: examples per second against hand-written loops, Ray against local, and peak memory
with `--out` as the dataset grows. The embedded model, on this machine's CPU.

  (a) --over (batches of 16)  vs  a loop of single-prompt nbgrad.trace calls
  (b) --over (batches of 16)  vs  hand-batched raw forward hooks, the fair baseline: the same model and
      weights, the same batches of 16 in the same order, tokenized as a user would (one tokenizer call per
      batch, padded on the left, with the attention mask and position ids nbgrad passes), under no_grad, one
      forward hook on the same block keeping the same values (each example's last position as a [1, 128]
      copy of its own, not a view that holds the whole batch's output). Each repeat runs both sides on a
      fresh draw of prompts (neither finds the prompts of an earlier repeat tokenized), in alternating
      order; the medians of `--repeats` repeats in one process are printed, wall time and the process's
      CPU time (the steadier of the two on a machine shared with other work), with the load average
  (c) --engine ray, 2 workers vs --engine local (a local Ray cluster of 2 CPUs): the first run, which starts
      the actors, and the next, which finds them
  (d) with a backward pass per example: --over (batches of 8) vs a loop of single-prompt traces
  (e) peak RSS above the start, --out DIR vs in memory, over 250 / 1000 / 2000 examples

Run: `python bench/dataset_runs.py [--examples N] [--repeats R] [--skip-ray]`.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import threading
import time

import psutil
import torch

import nbgrad

BODY = "last = model.transformer.h[-1].output[:, -1].save()"
WHOLE = "hidden = model.transformer.h[-1].output.save()"
WORDS = "the a tower city river of in is was about many long short red green blue paris rome".split()


def prompts(count: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 24))) for _ in range(count)]


def per_second(run, count: int) -> float:
    start = time.perf_counter()
    run()
    return count / (time.perf_counter() - start)


def raw_batched(model, texts: list, batch_size: int) -> list:
    """What a user writes by hand: pad on the left, a forward hook, keep a copy of each example's last position."""
    tokenizer = nbgrad.tokenizer_for(model)
    tokenizer.padding_side = "left"
    kept = []
    handle = model.transformer.h[-1].register_forward_hook(
        lambda m, a, o: kept.extend(row.clone() for row in o[:, -1:].unbind(0)))
    try:
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                batch = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True)
                positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
                model(**batch, position_ids=positions)
    finally:
        handle.remove()
    return kept


def timed(run) -> tuple:
    """(wall seconds, CPU seconds of this process) of `run()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def over_against_raw(model, count: int, repeats: int) -> dict:
    """{side: ([examples/s by wall time per repeat], [by CPU time])}, the sides interleaved, each repeat on fresh
    prompts (the same for both sides) and the side that goes first alternating."""
    def over(texts):
        namespace = {"model": model}
        nbgrad.trace(model, None, BODY, namespace, over=texts, batch_size=16, no_grad=True, progress=False)
        return namespace["last"]
    sides = {"over": over, "raw": lambda texts: raw_batched(model, texts, 16)}
    check = prompts(32, seed=10**6)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(over(check), sides["raw"](check)))
    rates = {side: ([], []) for side in sides}
    for repeat in range(repeats):
        texts = prompts(count, seed=repeat + 1)
        for side in (("over", "raw") if repeat % 2 == 0 else ("raw", "over")):
            wall, cpu = timed(lambda: sides[side](texts))
            rates[side][0].append(count / wall)
            rates[side][1].append(count / cpu)
    return rates


def speed(model, count: int, repeats: int, skip_ray: bool) -> None:
    texts = prompts(count)
    rates = over_against_raw(model, count, repeats)
    (over, over_cpu), (raw, raw_cpu) = ([statistics.median(r) for r in rates[s]] for s in ("over", "raw"))
    paired = statistics.median(o / r for o, r in zip(rates["over"][0], rates["raw"][0]))
    single = per_second(lambda: [nbgrad.trace(model, text, BODY, no_grad=True) for text in texts], count)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\n{count} prompts of 3-24 words, batches of 16, --no-grad, one read per example; medians of "
          f"{repeats} interleaved repeats (load average {load} on {os.cpu_count()} cores)")
    print(f"  --over                          {over:8.1f} examples/s   ({over_cpu:.1f}/s of CPU time)")
    print(f"  (a) loop of single-prompt traces {single:8.1f} examples/s   --over is {over / single:5.2f}x that")
    print(f"  (b) hand-batched raw hooks       {raw:8.1f} examples/s   --over is {over / raw:5.2f}x that "
          f"(per repeat, median {paired:.2f}x; by CPU time {over_cpu / raw_cpu:.2f}x: {raw_cpu:.1f}/s)")
    if skip_ray:
        return
    import ray
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    # local runs with one thread, the fastest here: two threads on two cores shared with other work thrash
    try:
        local = per_second(lambda: nbgrad.trace(model, None, BODY, {"model": model}, over=texts, batch_size=16,
                                                no_grad=True, progress=False), count)
        def on_ray():
            return per_second(lambda: nbgrad.trace(model, None, BODY, {"model": model}, over=texts, batch_size=16,
                                                   no_grad=True, progress=False, engine="ray", workers=2), count)
        cold, warm = on_ray(), on_ray()      # the second run finds the actors and their models in place
    finally:
        ray.shutdown()
    print(f"  (c) --engine ray, 2 workers, first run  {cold:8.1f} examples/s   {cold / local:5.2f}x --engine local "
          f"({local:.1f}/s with 2 threads; actors start and load the model)")
    print(f"      --engine ray, 2 workers, next run   {warm:8.1f} examples/s   {warm / local:5.2f}x --engine local "
          f"({os.cpu_count()} cores here, shared with other work)")


GRAD_BODY = ("g = model.transformer.h[1].output.grad[:, -1].save()\n"
             "model.lm_head.output[:, -1].max().backward()\n")


def gradient_speed(model, count: int = 64) -> None:
    """Each example's backward pass runs through the whole batch's graph (one pass per example), so
    batching gains less with gradients than with reads."""
    texts = prompts(count, seed=1)
    over = per_second(lambda: nbgrad.trace(model, None, GRAD_BODY, {"model": model}, over=texts, batch_size=8,
                                           progress=False), count)
    single = per_second(lambda: [nbgrad.trace(model, text, GRAD_BODY) for text in texts], count)
    model.zero_grad(set_to_none=True)
    print(f"  (d) with a backward per example: --over (batches of 8) {over:8.1f} examples/s, loop of "
          f"single-prompt traces {single:8.1f}/s: --over is {over / single:5.2f}x that")


class PeakRss:
    """The largest resident set size seen while the block runs, sampled every few milliseconds."""

    def __enter__(self):
        self.process, self.peak, self.running = psutil.Process(), 0, True
        self.start = self.process.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *_):
        self.running = False
        self.thread.join()

    @property
    def above_start_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def memory_child(mode: str, count: int) -> None:
    """One measurement in a process of its own, so no run inherits another's freed memory."""
    torch.set_num_threads(1)
    model = nbgrad.load_model()
    texts = prompts(count, seed=count)
    namespace = {"model": model}
    with tempfile.TemporaryDirectory() as folder:
        with PeakRss() as peak:
            nbgrad.trace(model, None, WHOLE, namespace, over=texts, batch_size=16, no_grad=True,
                         out=folder if mode == "out" else None, progress=False)
    print(f"{peak.above_start_mb:.1f}")


def memory() -> None:
    import subprocess
    import sys
    print("\npeak RSS above the start of the run (a fresh process each), saving each example's whole "
          "last-block output ([1, tokens, 128] float32)")
    for count in (250, 1000, 2000):
        peaks = [subprocess.run([sys.executable, __file__, "--memory-child", mode, str(count)], check=True,
                                capture_output=True, text=True).stdout.strip().splitlines()[-1]
                 for mode in ("out", "memory")]
        print(f"  {count:5d} examples   --out DIR {float(peaks[0]):7.1f} MiB   in memory {float(peaks[1]):7.1f} MiB")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--memory-child", nargs=2, metavar=("MODE", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        return memory_child(args.memory_child[0], int(args.memory_child[1]))
    torch.set_num_threads(1)
    model = nbgrad.load_model()
    speed(model, args.examples, args.repeats, args.skip_ray)
    gradient_speed(model)
    memory()


if __name__ == "__main__":
    main()
