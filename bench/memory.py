"""Memory of `%%trace` cells.

1. Resident memory over many consecutive cells with a backward pass (no gc.collect()): the growth after
   warm-up in MB.
2. Peak memory of one trace that saves one block's output and its gradient, against plain forward and
   tensor hooks doing the same, on a GPT-2-small-shaped model (random weights, from its config): the
   ratio of the peaks (tensor memory allocated above what the model already holds). On CUDA where there
   is a GPU (the caching allocator's peak), else on the CPU (the profiler's allocation events).

Run: `python bench/memory.py [--cells 1000] [--tokens 64] [--device cpu|cuda]`.
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


PEAK_CELL = """h = model.transformer.h[{block}].output.save()
logits = model.output.logits
with logits.sum().backward():
    g = h.grad.save()
"""


def gpt2_small(device):
    """GPT-2 small's shape (12 blocks, width 768, 50,257 tokens), random weights."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config()).eval().to(device)


def plain_hooks(model, ids, block: int, keep_output: bool = False) -> dict:
    """The oracle: a forward hook keeps the block's output, a tensor hook its gradient. The model's
    output object (with its KV cache) is dropped once `.logits` is read, unless `keep_output`."""
    kept = {}

    def on_output(module, args, output):
        kept["h"] = output
        output.register_hook(lambda grad: kept.__setitem__("g", grad))
    handle = model.transformer.h[block].register_forward_hook(on_output)
    try:
        output = model(ids)
        logits = output.logits
        if not keep_output:
            del output
        logits.sum().backward()
    finally:
        handle.remove()
    return kept


def plain_hooks_keeping_output(model, ids, block: int) -> dict:
    return plain_hooks(model, ids, block, keep_output=True)


def with_trace(model, ids, block: int) -> dict:
    import nbgrad
    return nbgrad.trace(model, ids, PEAK_CELL.format(block=block)).saved


def peak_of(fn, device_type: str) -> int:
    """Peak tensor memory that `fn()` allocates above what was allocated before it, in bytes: the CUDA
    caching allocator's peak on a GPU; on the CPU, the peak of the bytes held by storages that `fn`'s own
    operations made (LiveStorages)."""
    import torch
    if device_type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with _live_storages_mode()() as live:
        fn()
    return live.peak


def _live_storages_mode():
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveStorages(TorchDispatchMode):
        """Counts the bytes of every new storage an operation makes while it lives (a view or an in-place
        result shares an input's storage and is not new). Deterministic, unlike the CPU profiler's memory
        events, whose running sum also subtracts what was freed of memory allocated before the window."""

        def __init__(self):
            super().__init__()
            self.live = self.peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor)}
            for tensor in tree_leaves(out):
                if not isinstance(tensor, torch.Tensor) or tensor.untyped_storage().data_ptr() in inputs:
                    continue
                size = tensor.untyped_storage().nbytes()
                inputs.add(tensor.untyped_storage().data_ptr())
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(tensor, self._freed, size)
            return out

        def _freed(self, size):
            self.live -= size
    return LiveStorages


def peak_bytes(run, model, ids, block: int) -> int:
    """Peak tensor memory allocated by `run` above what was allocated before it (parameter grads unset)."""
    model.zero_grad(set_to_none=True)
    kept = {}
    peak = peak_of(lambda: kept.update(run(model, ids, block)), ids.device.type)
    assert kept["h"].shape == kept["g"].shape
    return peak


def peak_ratio(tokens: int = 64, device: str | None = None, block: int = 6) -> tuple:
    """Peaks in bytes on the GPT-2-small-shaped model, one run each after warm-up: (trace, plain hooks,
    plain hooks that keep the model's output object through the backward pass as the cell's graph does)."""
    import torch
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = gpt2_small(device)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    for run in (plain_hooks, with_trace):      # warm-up: lazy initialisation of kernels and caches
        run(model, ids, block)
    return tuple(peak_bytes(run, model, ids, block) for run in (with_trace, plain_hooks, plain_hooks_keeping_output))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    traced, plain, plain_kept = peak_ratio(args.tokens, args.device)
    print(f"peak memory, GPT-2-small shape, {args.tokens} tokens, saving block 6's output and its gradient: "
          f"trace {traced / 2 ** 20:.1f} MB, plain hooks {plain / 2 ** 20:.1f} MB: ratio {traced / plain:.3f}x "
          f"({traced / plain_kept:.3f}x against plain hooks that keep the model's output through backward, "
          f"as the cell's `model.output` does)")
    start, end, growth = measure(args.cells)
    print(f"{args.cells} %%trace cells with a backward pass: RSS {start:.1f} MB -> {end:.1f} MB "
          f"(growth {growth:+.1f} MB after warm-up, no gc.collect())")


if __name__ == "__main__":
    main()
