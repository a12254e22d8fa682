"""`cache(...)` against raw PyTorch hooks, and what `stop()` saves.

1. Time: caching every block output of a GPT-2-small-shaped model (12 blocks, width 768, random weights
   from its config) with `cache(...)` vs plain forward hooks keeping the same outputs; also every module,
   and detached float16 copies on the CPU. Ratio = median(nbgrad) / median(raw hooks), alternating runs.
2. Peak memory of `cache(device="cpu")` on a long input against the same run without any cache (and
   against `cache()` keeping the live tensors), under no_grad: on CUDA where there is a GPU (the caching
   allocator's peak), else on the CPU (the profiler's allocation events, where the copies are CPU memory too).
3. `stop()`: a cell that reads block 0's output, with and without `stop()` after it.

Run: `python bench/cache.py [--runs N] [--tokens N] [--device cpu|cuda]`.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import nbgrad

BLOCKS = [f"transformer.h.{i}" for i in range(12)]


def gpt2_small(device):
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768)).eval().to(device)


def raw_cache(model, ids, names, copy=False):
    """The oracle: a forward hook per module keeps its output (a detached float16 CPU copy with `copy`)."""
    modules, kept, handles = dict(model.named_modules()), {}, []
    for name in names:
        def keep(module, args, output, name=name):
            kept[name] = output.detach().to("cpu", torch.float16) if copy and torch.is_tensor(output) else output
        handles.append(modules[name].register_forward_hook(keep))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return kept


def traced_cache(model, ids, modules, **options):
    namespace = {"model": model, "modules": modules, "options": options}
    return nbgrad.trace(model, ids, "c = cache(modules, **options)", namespace, no_grad=True).saved["c"]


def ratio(ours, raw, runs: int) -> tuple:
    for _ in range(3):
        ours(), raw()
    mine, theirs = [], []
    for _ in range(runs):
        for fn, times in ((ours, mine), (raw, theirs)):
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return statistics.median(mine) / statistics.median(theirs), statistics.median(mine), statistics.median(theirs)


def timings(model, ids, runs: int) -> None:
    every = [name for name in dict(model.named_modules()) if name and name != "transformer.h"]
    copy = {"device": "cpu", "dtype": torch.float16}
    scenarios = {
        "every block output": (lambda: traced_cache(model, ids, BLOCKS), lambda: raw_cache(model, ids, BLOCKS)),
        "every module (cache())": (lambda: traced_cache(model, ids, "*"), lambda: raw_cache(model, ids, every)),
        "every block, float16 CPU copies": (lambda: traced_cache(model, ids, BLOCKS, **copy),
                                            lambda: raw_cache(model, ids, BLOCKS, copy=True)),
    }
    print(f"time, ids {tuple(ids.shape)} on {ids.device}, {runs} runs each, median, under no_grad:")
    for label, (ours, raw) in scenarios.items():
        r, mine, theirs = ratio(ours, raw, runs)
        print(f"  {label:34s} {r:5.3f}x   nbgrad {mine * 1e3:8.2f} ms   raw hooks {theirs * 1e3:8.2f} ms")


def peak_bytes(run) -> int:
    """Peak memory allocated by `run()` above what was allocated before it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        kept = run()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            kept = run()
        events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns())
        peak = max(itertools.accumulate(e.nbytes() for e in events), default=0)
    del kept
    return peak


def peaks(model, ids) -> None:
    def plain():
        with torch.no_grad():
            return model(ids).logits[:, -1].clone()
    runs = {"no cache": plain,
            'cache("*", device="cpu")': lambda: traced_cache(model, ids, "*", device="cpu"),
            'cache("*") (live tensors)': lambda: traced_cache(model, ids, "*")}
    for run in runs.values():
        run()                                 # warm-up
    measured = {label: peak_bytes(run) for label, run in runs.items()}
    base = measured["no cache"]
    where = "GPU" if torch.cuda.is_available() else "CPU (the copies count here too)"
    print(f"peak memory on the {where}, every module cached, ids {tuple(ids.shape)}:")
    for label, peak in measured.items():
        print(f"  {label:28s} {peak / 2 ** 20:9.1f} MB   {peak / base:6.3f}x the run without a cache")


def stopping(model, ids, runs: int) -> None:
    read = "h0 = model.transformer.h[0].output.save()"
    full = lambda: nbgrad.trace(model, ids, read, no_grad=True)                  # noqa: E731
    early = lambda: nbgrad.trace(model, ids, read + "\nstop()", no_grad=True)    # noqa: E731
    r, stopped, whole = ratio(early, full, runs)
    print(f"stop() after block 0 of 12: {stopped * 1e3:.2f} ms against {whole * 1e3:.2f} ms for the whole run "
          f"({r:.3f}x)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=64, help="tokens of the timed input")
    parser.add_argument("--long", type=int, default=1024, help="tokens of the long input for peak memory")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    model = gpt2_small(device)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50257, (1, args.tokens), generator=generator).to(device)
    timings(model, ids, args.runs)
    stopping(model, ids, args.runs)
    long_ids = torch.randint(0, 50257, (1, args.long), generator=generator).to(device)
    peaks(model, long_ids)


if __name__ == "__main__":
    main()
