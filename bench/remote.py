"""`nbgrad.remote(...)`: what a round trip to the actor costs. The embedded model, on a local Ray cluster of
2 CPUs on this machine (the actor in another process of the same machine: no network).

  (a) a one-read cell (`h = model.transformer.h[1].output[:, -1].save()`): remote vs local, median ms
  (b) its fixed part: a cell that reads nothing of the model's run on the actor (`n = 1`, and no model call:
      the actor still runs nbgrad.trace) vs the same locally, and a bare `call` that returns at once
  (c) bytes sent and received for (a), against the model's parameter bytes

Run: `python bench/remote.py [--repeats N]`; the machine's load average is printed beside the numbers.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import nbgrad
from nbgrad.datasets.cluster import start_cluster

PROMPT = "The Eiffel Tower is in the city of"
ONE_READ = "h = model.transformer.h[1].output[:, -1].save()\n"


def median_ms(run, repeats: int) -> float:
    run()                                      # warm: compiled cells, the actor's first call
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    start_cluster(attempts=5, num_cpus=2, include_dashboard=False, logging_level="ERROR",
                  runtime_env={"env_vars": {"PYTHONPATH": root, "OMP_NUM_THREADS": "1"}})
    big, local = nbgrad.remote(), nbgrad.load_model()
    remote_ms = median_ms(lambda: nbgrad.trace(big, PROMPT, ONE_READ, {"model": big}), args.repeats)
    local_ms = median_ms(lambda: nbgrad.trace(local, PROMPT, ONE_READ, {"model": local}), args.repeats)
    fixed_remote = median_ms(lambda: nbgrad.trace(big, torch.tensor([[1]]), "n = 1\n", {"model": big}), args.repeats)
    fixed_local = median_ms(lambda: nbgrad.trace(local, torch.tensor([[1]]), "n = 1\n", {"model": local}), args.repeats)
    call_ms = median_ms(lambda: big.call(id), args.repeats)
    cell = big.stats()[0]
    print(f"load average {os.getloadavg()[0]:.1f} (2 cores); median of {args.repeats}")
    print(f"(a) one-read cell: remote {remote_ms:.1f} ms, local {local_ms:.1f} ms, ratio {remote_ms / local_ms:.1f}x")
    print(f"(b) fixed part: remote - local of a cell that reads nothing {fixed_remote - fixed_local:.1f} ms "
          f"({fixed_remote:.1f} vs {fixed_local:.1f}); a bare call {call_ms:.1f} ms")
    print(f"(c) bytes: sent {cell['sent']}, received {cell['received']}; the model's parameters {big.weight_bytes}")


if __name__ == "__main__":
    main()
