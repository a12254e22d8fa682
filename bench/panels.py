"""Kernel-side time and payload size of the panel for two big tensors.

Run: `python bench/panels.py`. The payload bound is 256 KB per tensor whatever its size.
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


def measure(name, tensor, tokenizer=None, runs=5):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        panel = show(tensor, name, tokenizer=tokenizer)
        bundle = panel._repr_mimebundle_()
        times.append(time.perf_counter() - start)
    payload = len(json.dumps(panel.items[0]))
    html = len(bundle["text/html"])
    print(f"  {name:28s} {str(tuple(tensor.shape)):16s} build {statistics.median(times) * 1e3:7.1f} ms   "
          f"payload {payload / 1024:6.1f} KB (bound {MAX_BYTES // 1024} KB)   static html {html / 1024:6.1f} KB")


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    print("panel build (kernel side, median of 5) and size")
    measure("hidden states", torch.randn(1, 1024, 768, generator=generator))
    measure("logits", torch.randn(1, 10, 50257, generator=generator), VocabTokenizer())


if __name__ == "__main__":
    main()
