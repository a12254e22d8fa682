"""What a canonical name costs: the same read written with canonical names and with the model's own path, run
in pairs on the same model and ids (each first in every other pair); the ratio is median(canonical) /
median(real path), beside the median of the per-pair differences (less sensitive to a busy machine). A
canonical cell is rewritten once and cached, so a run costs one regular-expression
search and one dictionary look-up more. Run: `python bench/canonical.py [--runs N]`.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import nbgrad
from nbgrad.names import rewrite_of

PAIRS = {
    "resid_post of the last block": ("h = model.layers[-1].resid_post.save()",
                                     "h = model.transformer.h[-1].output.save()"),
    "resid_mid of block 2": ("h = model.layers[2].resid_mid.save()", "h = model.transformer.h[2].ln_2.input.save()"),
    "attn.z of block 1": ("z = model.layers[1].attn.z.save()",
                          "z = model.transformer.h[1].attn.c_proj.input.unflatten(-1, (4, 32)).save()"),
}


def _timed(model, ids, cell) -> float:
    start = time.perf_counter()
    nbgrad.trace(model, ids, cell, no_grad=True)
    return time.perf_counter() - start


def compare(model, ids, canonical: str, real: str, runs: int) -> tuple:
    for cell in (canonical, real):          # compile both once: the cache is what a notebook sees on a rerun
        _timed(model, ids, cell)
    times = {canonical: [], real: []}
    for index in range(runs):
        order = (canonical, real) if index % 2 else (real, canonical)
        for cell in order:
            times[cell].append(_timed(model, ids, cell))
    ratio = statistics.median(times[canonical]) / statistics.median(times[real])
    difference = statistics.median(a - b for a, b in zip(times[canonical], times[real]))
    return ratio, difference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs
    torch.set_num_threads(1)
    model = nbgrad.load_model()
    ids = torch.tensor([[46, 412, 73, 282, 9, 114, 5, 28]])
    print(f"canonical read / the same read on the real path, median of {runs} runs each (embedded GPT-2)")
    for name, (canonical, real) in PAIRS.items():
        ratio, difference = compare(model, ids, canonical, real, runs)
        print(f"  {name:<32} {ratio:.3f}x   median per-pair difference {difference * 1e6:+.0f} us")
    print(f"the rewrite itself, cached (what a canonical cell adds): {alias_cost(model, PAIRS) * 1e6:.1f} us; "
          f"a one-read cell on the real path: {_one_read(model, ids, runs) * 1e6:.0f} us")


def _one_read(model, ids, runs: int) -> float:
    return statistics.median(_timed(model, ids, PAIRS["resid_post of the last block"][1]) for _ in range(runs))


def alias_cost(model, pairs, calls: int = 20000) -> float:
    """Seconds per call of the alias step on a cell already rewritten once (the cache a rerun hits)."""
    namespace = {"model": model}
    cells = [canonical for canonical, _ in pairs.values()]
    for cell in cells:
        rewrite_of(cell, model, namespace)
    start = time.perf_counter()
    for index in range(calls):
        rewrite_of(cells[index % len(cells)], model, namespace)
    return (time.perf_counter() - start) / calls


if __name__ == "__main__":
    main()
