"""Resident memory over many consecutive `%%trace` cells with a backward pass (no gc.collect()).

Run: `python bench/memory.py [--cells 1000]`. Prints the growth after warm-up in MB.
"""
from __future__ import annotations

import argparse
import os

CELL = """%%trace model "The capital of France is Paris." -q
hs = model.transformer.h[1].output
logits = model.output.logits
with logits.sum().backward():
    g = hs.grad.save()
model.zero_grad(set_to_none=True)
"""


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def measure(cells: int, warmup: int = 50) -> tuple:
    """(RSS after warm-up, RSS at the end, growth) in MB, running `cells` cells in an IPython shell."""
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext nbgrad\nimport nbgrad\nmodel = nbgrad.load_model()", store_history=False)
    for _ in range(warmup):
        result = shell.run_cell(CELL, store_history=False)
        result.raise_error()
    start = rss_mb()
    for _ in range(cells):
        shell.run_cell(CELL, store_history=False).raise_error()
    end = rss_mb()
    return start, end, end - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=1000)
    args = parser.parse_args(argv)
    start, end, growth = measure(args.cells)
    print(f"{args.cells} %%trace cells with a backward pass: RSS {start:.1f} MB -> {end:.1f} MB "
          f"(growth {growth:+.1f} MB after warm-up, no gc.collect())")


if __name__ == "__main__":
    main()
