"""nbgrad's fixed cost per cell counted in machine instructions, not time: the same from run to run and on a
busy machine as on a quiet one, so a change of a few microseconds shows up here when overhead.py's timings
cannot tell it from the machine's drift.

Each scenario of overhead.py runs `--runs` times in a process of its own under valgrind's callgrind, which
counts only the instructions of that loop (a fixed hash seed and one thread make the count repeatable);
nbgrad and raw hooks each get a process. Printed per scenario: instructions per cell, nbgrad over raw,
and the difference. The ratio is far smaller than the time ratio: most of a cell's time over raw hooks is
its code and data coming back into the caches that the model's forward filled. Needs valgrind
(`apt-get install valgrind`). Each side runs in minutes under valgrind, so the rows come as they finish, and
`--only` picks scenarios. With `--caches` (slower), also the misses per cell, nbgrad minus raw, of this machine's
caches simulated: the first level's (I1, D1) and the L2's (LL). Those, not the instructions, are most of the time:
on (f) about 10,000 first-level and 3,000 L2 misses a cell against 230,000 instructions. With `--within
MODULE:NAME` (a function, or a class's method: `nbgrad.engine.run.runtime:Runtime._result`), only what runs inside
that callable is counted, per cell, to tell which part of a cell the instructions and misses are in (a callable that
calls itself, directly or not, is counted wrongly: each call's entry and exit turn the counting on and off).
Run: `python bench/instructions.py [--runs 20] [--only "(a)" "(c)"] [--caches] [--within MODULE:NAME]`.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = ("(a) save one block output", "(b) save every block output", "(c) scale every block in place",
             "(b') (b) looping over the blocks", "(e) one block's gradient", "(f) two invokes with a patch",
             "(g) an MLP of one's own, floats")


def scenario_runs(label: str) -> tuple:
    """(nbgrad's run, raw hooks' run) of one scenario of overhead.py, on the embedded model."""
    import nbgrad
    import overhead as o
    model = nbgrad.load_model()
    ids = nbgrad.tokenizer_for(model)("The capital of France is Paris. The cat sat on the mat.",
                                      return_tensors="pt")["input_ids"]
    zero = functools.partial(model.zero_grad, set_to_none=True)
    if label.startswith("(f)"):            # the prompts tokenized and padded in every nbgrad run, as in overhead.py
        return o.invoke_pair(model, nbgrad.tokenizer_for(model))
    if label.startswith("(g)"):
        return o.own_model_pair("cpu")[:2]
    cell, raw = {"(a)": (o.SAVE_ONE, o.raw_save_one), "(b)": (o.SAVE_ALL, o.raw_save_all),
                 "(c)": (o.SCALE_ALL, o.raw_scale_all), "(b')": (o.SAVE_ALL_LOOP, o.raw_save_all),
                 "(e)": (o.GRAD_ONE, o.raw_grad_one)}[label.split()[0]]
    return (lambda: (nbgrad.trace(model, ids, cell), zero())), (lambda: (raw(model, ids), zero()))


def child(label: str, who: str, runs: int, within: str | None = None) -> None:
    """Inside valgrind: warm up, then the counted loop (callgrind counts inside functools.reduce only; with `within`,
    inside itertools.starmap's step, through which that callable is then called)."""
    import torch
    torch.set_num_threads(1)
    ours, raw = scenario_runs(label)
    run = ours if who == "nbgrad" else raw
    for _ in range(5):
        run()
    if within:
        _count_within(within)
    functools.reduce(lambda _, __: run(), range(runs), None)


def _count_within(within: str) -> None:
    """Replace MODULE:NAME (NAME a dotted path from the module) with a function that calls it inside starmap."""
    module, _, name = within.partition(":")
    *path, last = name.split(".")
    owner = importlib.import_module(module)
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, last)

    def counted_call(*args, **kwargs):
        return next(itertools.starmap(lambda: original(*args, **kwargs), [()]))
    setattr(owner, last, counted_call)


# With --caches: this machine's caches per core (lscpu: 64 KiB L1i, 48 KiB L1d, 2 MiB L2) simulated as well
CACHES = ["--cache-sim=yes", "--I1=65536,8,64", "--D1=49152,12,64", "--LL=2097152,16,64"]


def counted(label: str, who: str, runs: int, caches: bool = False, within: str | None = None) -> dict:
    """Instructions per cell of one side of one scenario ("I"); with `caches`, also its misses per cell in the first
    level caches ("I1", "D1") and in the second ("LL", what the first two missed and the L2 missed too)."""
    toggle = "starmap_next" if within else "functools_reduce"
    with tempfile.TemporaryDirectory() as folder:
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--toggle-collect={toggle}",
                   *(CACHES if caches else []), f"--callgrind-out-file={os.path.join(folder, 'out')}",
                   sys.executable, __file__, "--child", label, who, str(runs), *([within] if within else [])]
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    found = dict(re.findall(r"\b(I(?=\s+refs)|(?:I1|D1|LL)(?=\s+misses))\s+\w+:\s+([\d,]+)", done.stderr))
    return {"I": 0, **{kind: int(count.replace(",", "")) // runs for kind, count in found.items()}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--only", nargs="+", metavar="SCENARIO", help="only these, e.g. --only (a) (c)")
    parser.add_argument("--caches", action="store_true", help="also the cache misses per cell (slower)")
    parser.add_argument("--within", metavar="MODULE:NAME", help="count only inside this callable, e.g. "
                        "nbgrad.engine.run.runtime:Runtime._result (on both sides: what raw hooks never call counts 0)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]), *args.child[3:])
    if shutil.which("valgrind") is None:
        print("bench/instructions.py needs valgrind (apt-get install valgrind): skipped")
        return None
    labels = [label for label in SCENARIOS if not args.only or label.split()[0] in args.only]
    if not labels:
        parser.error(f"--only names none of {', '.join(label.split()[0] for label in SCENARIOS)}")
    print(f"instructions per cell (callgrind, {args.runs} cells each, embedded model): nbgrad / raw hooks; each "
          f"side a process under valgrind (minutes each), each row printed as its two finish", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, min(2 * len(labels), os.cpu_count() or 1))) as pool:
        sides = {label: [pool.submit(counted, label, who, args.runs, args.caches, args.within)
                        for who in ("nbgrad", "raw")]
                 for label in labels}
        for label in labels:
            ours, raw = (side.result() for side in sides[label])
            misses = "".join(f"   {kind} misses {ours[kind] - raw[kind]:+7,d}" for kind in ("I1", "D1", "LL")
                             if kind in ours)
            ratio = f"{ours['I'] / raw['I']:6.4f}x" if raw.get("I") else "      - "    # (--within: raw may call none)
            print(f"  {label:34s} {ratio}   {ours['I'] - raw['I']:+9,d} instructions   "
                  f"nbgrad {ours['I']:12,d}   raw hooks {raw['I']:12,d}{misses}", flush=True)
    return None


if __name__ == "__main__":
    main()
