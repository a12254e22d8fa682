"""Attribution, measured in one run on the embedded model.

1. Attribution patching over every block × position against exact activation patching of the same
   (site, position) pairs written with raw forward hooks: time ratio (medians, alternating) and the
   Spearman rank correlation of the two score maps.
2. Integrated gradients, 64 steps, batch 16, on the input embeddings: `nbgrad.attribute` against
   Captum's IntegratedGradients over `inputs_embeds` on the same model, prompt and steps: time ratio
   and peak memory (growth of the resident set's high-water mark over one call, each in a fresh process).

Run: `python bench/attribution.py [--runs N] [--size embedded|gpt2]` (`gpt2`: a randomly initialised
GPT-2-small shape, for memory at a realistic width).
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

import torch

import nbgrad

CLEAN = "When Mary and Tom went to the store, Tom gave a drink to"
CORRUPT = "When Mary and Tom went to the store, Mary gave a drink to"      # same number of tokens
PROMPT = "The capital of France is Paris and the capital of Italy is Rome and the capital of Spain is"
TARGET = " Madrid"


def load(size: str):
    if size == "embedded":
        return nbgrad.load_model()
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    nbgrad.models.register_tokenizer(model, nbgrad.tokenizer_for(nbgrad.load_model()))
    return model


def token_ids(tokenizer, clean: str, corrupt: str) -> tuple:
    a, b = tokenizer(clean)["input_ids"], tokenizer(corrupt)["input_ids"]
    assert len(a) == len(b), "clean and corrupt prompts must have the same number of tokens"
    return torch.tensor([a]), torch.tensor([b])


def metric_for(tokenizer):
    """Logit difference of the two names' first tokens at the last position (the clean answer is Mary)."""
    mary, tom = (tokenizer(name, add_special_tokens=False)["input_ids"][0] for name in (" Mary", " Tom"))
    return lambda logits: logits[0, -1, mary] - logits[0, -1, tom]


def exact_patching_raw(model, clean, corrupt, metric) -> torch.Tensor:
    """Raw PyTorch: one hooked forward per (block, position), the clean activation patched in."""
    blocks = list(model.transformer.h)
    clean_outputs = []
    handles = [b.register_forward_hook(lambda m, a, o: clean_outputs.append(o.detach())) for b in blocks]
    with torch.no_grad():
        model(clean)
        for h in handles:
            h.remove()
        reference = float(metric(model(corrupt).logits))
        effects = torch.zeros(len(blocks), corrupt.shape[1])
        for i, block in enumerate(blocks):
            for position in range(corrupt.shape[1]):
                def patch(module, args, output, i=i, position=position):
                    output = output.clone()
                    output[:, position] = clean_outputs[i][:, position]
                    return output
                handle = block.register_forward_hook(patch)
                try:
                    effects[i, position] = float(metric(model(corrupt).logits)) - reference
                finally:
                    handle.remove()
    return effects


def ranks(values: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share the mean of their positions), as Spearman's rho needs."""
    flat = values.reshape(-1).double()
    order = torch.argsort(flat, stable=True)
    ranked = torch.empty_like(flat)
    ranked[order] = torch.arange(flat.numel(), dtype=torch.float64)
    for value in torch.unique(flat):
        tied = flat == value
        ranked[tied] = ranked[tied].mean()
    return ranked


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def timed(function, runs: int) -> list:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return times


def patching_bench(model, runs: int) -> dict:
    clean, corrupt = token_ids(nbgrad.tokenizer_for(model), CLEAN, CORRUPT)
    metric = metric_for(nbgrad.tokenizer_for(model))
    blocks = [f"transformer.h.{i}" for i in range(len(model.transformer.h))]
    estimate = nbgrad.attribution_patching(model, clean, corrupt, metric, sites=blocks)
    exact = exact_patching_raw(model, clean, corrupt, metric)
    ours, raw = [], []
    for _ in range(runs):       # alternate, so drifting machine load hits both alike
        ours += timed(lambda: nbgrad.attribution_patching(model, clean, corrupt, metric, sites=blocks), 1)
        raw += timed(lambda: exact_patching_raw(model, clean, corrupt, metric), 1)
    return {"pairs": exact.numel(), "positions": clean.shape[1], "estimate_s": statistics.median(ours),
            "exact_s": statistics.median(raw), "spearman": spearman(estimate.scores, exact),
            "spearman_changed": spearman(*_from_first_difference(estimate.scores, exact, clean, corrupt))}


def _from_first_difference(estimate, exact, clean, corrupt) -> tuple:
    """Only the positions where the prompts can differ in activation (causal model: from the first
    differing token on); earlier positions are exactly zero in both maps."""
    first = int((clean[0] != corrupt[0]).nonzero()[0])
    return estimate[:, first:], exact[:, first:]


def ig_runner(model, which: str):
    tokenizer = nbgrad.tokenizer_for(model)
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    target = tokenizer(TARGET, add_special_tokens=False)["input_ids"][0]
    if which.startswith("nbgrad"):
        batch = int(which.split(":")[1])
        return lambda: nbgrad.attribute(model, PROMPT, TARGET, steps=64, batch_size=batch)
    from captum.attr import IntegratedGradients
    embeds = model.get_input_embeddings()(ids).detach()
    ig = IntegratedGradients(lambda e: model(inputs_embeds=e).logits[:, -1, target])
    return lambda: ig.attribute(embeds, baselines=torch.zeros_like(embeds), n_steps=64, internal_batch_size=16,
                                return_convergence_delta=True)


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as status:
        return int(re.search(key + r":\s+(\d+) kB", status.read()).group(1)) / 1024


def ig_peak_mb(which: str, size: str) -> float:
    """Peak resident-set growth during one IG call in a fresh process (Linux: the high-water mark is
    reset just before the call), after the model ran once and Captum was imported."""
    import captum.attr  # noqa: F401
    model = load(size)
    run = ig_runner(model, which)
    with torch.no_grad():
        model(**nbgrad.tokenizer_for(model)(PROMPT, return_tensors="pt"))
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = _status_mb("VmRSS")
    run()
    return _status_mb("VmHWM") - before


def ig_bench(model, size: str, runs: int) -> dict:
    variants = ("nbgrad:16", "captum", "nbgrad:64")
    runners = {which: ig_runner(model, which) for which in variants}
    times = {which: [] for which in variants}
    for which in variants:
        runners[which]()                         # warm-up
    for _ in range(runs):                        # alternate, so drifting machine load hits all alike
        for which in variants:
            times[which] += timed(runners[which], 1)
    peaks = {}
    for which in variants:
        out = subprocess.run([sys.executable, __file__, "--child", which, "--size", size],
                             check=True, capture_output=True, text=True).stdout
        peaks[which] = float(out.strip().splitlines()[-1])
    return {which: (statistics.median(times[which]), peaks[which]) for which in variants}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--size", choices=["embedded", "gpt2"], default="embedded")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(ig_peak_mb(args.child, args.size))
        return
    model = load(args.size)
    p = patching_bench(model, args.runs)
    print(f"attribution patching, {len(model.transformer.h)} blocks × {p['positions']} positions "
          f"({p['pairs']} pairs): {p['estimate_s'] * 1e3:.1f} ms vs exact activation patching (raw hooks) "
          f"{p['exact_s'] * 1e3:.1f} ms: {p['exact_s'] / p['estimate_s']:.1f}x faster; Spearman rank "
          f"correlation {p['spearman']:.3f} (positions from the first differing token on: {p['spearman_changed']:.3f})")
    ig = ig_bench(model, args.size, args.runs)
    (ours_s, ours_mb), (captum_s, captum_mb), (whole_s, whole_mb) = ig["nbgrad:16"], ig["captum"], ig["nbgrad:64"]
    print(f"integrated gradients, 64 steps, batch 16 ({args.size} model): nbgrad {ours_s * 1e3:.1f} ms, Captum "
          f"{captum_s * 1e3:.1f} ms: ratio {ours_s / captum_s:.2f}; peak memory growth nbgrad {ours_mb:.1f} MB, "
          f"Captum {captum_mb:.1f} MB; nbgrad with batch 64 (all points at once) {whole_mb:.1f} MB, "
          f"{whole_s * 1e3:.1f} ms")

if __name__ == "__main__":
    main()
