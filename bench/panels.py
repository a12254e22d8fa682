"""Kernel-side time and payload size of the panel for two big tensors.

Run: `python bench/panels.py`. The payload bound is 256 KB per tensor whatever its size. The time is
also given as a ratio against raw PyTorch computing the same statistics (min/max/mean/std/norm, NaN/Inf
counts, a 40-bin histogram, and the top-k per position of a logits tensor), measured in the same run.
"""
from __future__ import annotations

import json
import statistics
import time

import torch

from nbgrad.views import show
from nbgrad.views.payload import MAX_BYTES


class VocabTokenizer:
    """Stands in for a 50,257-token tokenizer: only its length and decode are used."""

    def __len__(self):
        return 50257

    def decode(self, ids):
        return f"tok{ids[0]}"


def raw_statistics(tensor, top_k=False):
    """What the panel reports, computed with plain torch calls: the floor for the panel's own time."""
    finite = tensor[torch.isfinite(tensor)]
    values = [finite.min(), finite.max(), finite.mean(), finite.std(), finite.norm(),
              torch.isnan(tensor).sum(), torch.isinf(tensor).sum(), torch.histc(finite, bins=40)]
    if top_k:
        values.append(torch.topk(tensor.float().softmax(-1), 5, dim=-1))
    return values


def median_time(work, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name, tensor, tokenizer=None, runs=5):
    panel = show(tensor, name, tokenizer=tokenizer)
    bundle = panel._repr_mimebundle_()
    built = median_time(lambda: show(tensor, name, tokenizer=tokenizer)._repr_mimebundle_(), runs)
    raw = median_time(lambda: raw_statistics(tensor, top_k=tokenizer is not None), runs)
    payload = len(json.dumps(panel.items[0]))
    html = len(bundle["text/html"])
    print(f"  {name:28s} {str(tuple(tensor.shape)):16s} build {built * 1e3:7.1f} ms "
          f"(raw torch statistics {raw * 1e3:6.1f} ms, ratio {built / raw:5.1f}x)   "
          f"payload {payload / 1024:6.1f} KB (bound {MAX_BYTES // 1024} KB)   static html {html / 1024:6.1f} KB")


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    print("panel build (kernel side, median of 5) and size")
    measure("hidden states", torch.randn(1, 1024, 768, generator=generator))
    measure("logits", torch.randn(1, 10, 50257, generator=generator), VocabTokenizer())


if __name__ == "__main__":
    main()
