"""nbgrad's overhead as a ratio against the same work done with raw PyTorch hooks, in one run.

Each scenario runs nbgrad and raw hooks in pairs on the same model and ids, each first in every other pair;
the ratio is median(nbgrad) / median(raw) over 2000 runs each by default, "per pair" the median of each pair's
nbgrad / raw (both runs of a pair see the same drift of the machine's speed), and the fixed cost the median of the
per-pair differences, with half the width of its 95% interval (what this run cannot tell apart). With
`--device cuda` the models and ids live on the GPU, each timed run ends with `torch.cuda.synchronize()` (both
sides alike), and memory is the CUDA caching allocator's peak. Run:
`python bench/overhead.py [--runs N] [--small-runs N] [--device cpu|cuda] [--quiet-below LOAD]`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import nbgrad
from memory import peak_of


def raw_save_one(model, ids):
    kept = {}
    handle = model.transformer.h[-1].register_forward_hook(lambda m, a, o: kept.setdefault("hs", o))
    try:
        model(ids)
    finally:
        handle.remove()
    return kept


def raw_save_all(model, ids):
    kept, handles = [], []
    for block in model.transformer.h:
        handles.append(block.register_forward_hook(lambda m, a, o: kept.append(o)))
    try:
        model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return kept


def _scale_in_place(module, args, output):
    output[:] *= 0.5          # the very statement the nbgrad cell runs


def raw_scale_all(model, ids):
    handles = [block.register_forward_hook(_scale_in_place) for block in model.transformer.h]
    try:
        return model(ids).logits
    finally:
        for handle in handles:
            handle.remove()


def raw_grad_one(model, ids):
    kept = {}

    def forward_hook(module, args, output):
        output.register_hook(lambda grad: kept.setdefault("grad", grad))
    handle = model.transformer.h[1].register_forward_hook(forward_hook)
    try:
        model(ids).logits.sum().backward()
    finally:
        handle.remove()
    return kept


SAVE_ONE = "hs = model.transformer.h[-1].output.save()"
SAVE_ALL = "outs = [model.transformer.h[i].output.save() for i in range(len(model.transformer.h))]"
SCALE_ALL = "for i in range(len(model.transformer.h)):\n    model.transformer.h[i].output[:] *= 0.5\n" \
            "logits = model.output.logits.save()"
# (b) and (c) as a loop over the blocks themselves, as the raw hooks are written: the cells above evaluate
# `model.transformer.h[i]` once per block inside the forward, which is torch's `Module.__getattr__` and
# `ModuleList.__getitem__` (Python) run cold; these rows show what of the fixed cost is that, the cell's own code
SAVE_ALL_LOOP = "outs = [block.output.save() for block in model.transformer.h]"
SCALE_ALL_LOOP = "for block in model.transformer.h:\n    block.output[:] *= 0.5\nlogits = model.output.logits.save()"
GRAD_ONE = "hs = model.transformer.h[1].output\nwith model.output.logits.sum().backward():\n    g = hs.grad.save()"


PATCH_INVOKES = """
with invoke(CLEAN):
    clean = model.transformer.h[3].output[:, -1].save()
with invoke(CORRUPT):
    model.transformer.h[3].output[:, -1] = clean
    patched = model.lm_head.output[:, -1].save()
"""


def raw_patch_batch(model, batch):
    """The same patch on a batch of the two prompts (left-padded once, outside the timing), raw hooks."""
    kept = {}

    def patch(module, args, output):
        output[1, -1] = output[0, -1]
    handles = [model.transformer.h[3].register_forward_hook(patch),
               model.lm_head.register_forward_hook(lambda m, a, o: kept.setdefault("patched", o[1:, -1]))]
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return kept


def invoke_scenario(model, runs: int, tokenizer) -> tuple:
    """(f): two invokes with a patch vs the same patch with raw hooks on a batch. nbgrad tokenizes and
    pads the two prompts in every run; the raw hooks get the batch made once, outside the timing."""
    return paired(*invoke_pair(model, tokenizer), runs)


def invoke_pair(model, tokenizer) -> tuple:
    """(nbgrad's run, raw hooks' run) of (f) (bench/instructions.py counts them too)."""
    from nbgrad.models.batching import batch_invokes
    from nbgrad.engine.compile.compiler import compile_cell
    namespace = {"model": model, "CLEAN": "The Eiffel Tower is in the city of", "CORRUPT": "The Colosseum is in"}
    program = compile_cell(PATCH_INVOKES)
    _, batch, _ = batch_invokes([namespace["CLEAN"], namespace["CORRUPT"]], program.invokes, model, tokenizer)
    return (lambda: nbgrad.trace(model, None, PATCH_INVOKES, namespace, no_grad=True, tokenizer=tokenizer),
            lambda: raw_patch_batch(model, batch))


_SYNC = []          # [torch.cuda.synchronize] with --device cuda: a run's time includes the kernels it queued


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    for synchronize in _SYNC:
        synchronize()
    return time.perf_counter() - start


def paired(nbgrad_fn, raw_fn, runs: int) -> tuple:
    """(ratio of the medians, nbgrad's median, raw's median, median of the per-pair differences, half the width
    of that median's 95% interval, median of the per-pair ratios). The two run in pairs, each first in every other
    pair; the per-pair difference is the steadier measure of the fixed cost on a machine whose speed drifts (both
    runs of a pair see the same drift). The per-pair ratio is printed beside the ratio of the medians, which moves
    with how each side's samples fall, to learn over runs which of the two ratios is the steadier."""
    for _ in range(5):          # warm-up: allocator growth, lazy inits
        nbgrad_fn(), raw_fn()
    ours, theirs = [], []
    for index in range(runs):
        if index % 2:
            ours.append(timed(nbgrad_fn))
            theirs.append(timed(raw_fn))
        else:
            theirs.append(timed(raw_fn))
            ours.append(timed(nbgrad_fn))
    ours_median, raw_median = statistics.median(ours), statistics.median(theirs)
    differences = [mine - other for mine, other in zip(ours, theirs)]
    return (ours_median / raw_median, ours_median, raw_median, statistics.median(differences),
            median_interval(differences), statistics.median([mine / other for mine, other in zip(ours, theirs)]))


def median_interval(values: list) -> float:
    """Half the width of a 95% interval for the median of `values`, from their order statistics (no assumption
    about their distribution): how far this run's fixed cost may be from the machine's, in the same units."""
    ordered, n = sorted(values), len(values)
    low = max(0, int(n / 2 - 0.98 * n ** 0.5) - 1)      # the ranks n/2 -+ 1.96 sqrt(n)/2, from 0
    return (ordered[n - 1 - low] - ordered[low]) / 2


def ratio(nbgrad_fn, raw_fn, runs: int) -> tuple:
    """(ratio of the medians, nbgrad's median, raw's median): see `paired`."""
    return paired(nbgrad_fn, raw_fn, runs)[:3]


def memory_ratio(nbgrad_fn, raw_fn, device_type: str = "cpu") -> float:
    """Peak tensor memory of one nbgrad run over one raw-hook run (after the timing's warm-up)."""
    ours, raw = peak_of(nbgrad_fn, device_type), peak_of(raw_fn, device_type)
    return ours / raw if raw else float("nan")


def magic_scenario(model, ids, runs: int) -> tuple:
    """(d): `%%trace -q` in an IPython shell vs a cell doing the same with raw hooks."""
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    if "nbgrad" not in shell.extension_manager.loaded:      # the second model's run reuses the shell
        shell.run_cell("%load_ext nbgrad")
    shell.user_ns.update(model=model, ids=ids, raw_save_one=raw_save_one)
    magic_cell = f"%%trace model ids -q\n{SAVE_ONE}"
    raw_cell = ("kept = {}\nhandle = model.transformer.h[-1].register_forward_hook("
                "lambda m, a, o: kept.setdefault('hs', o))\ntry:\n    model(ids)\nfinally:\n    handle.remove()\n"
                "hs = kept['hs']")
    return paired(lambda: shell.run_cell(magic_cell, store_history=False),
                  lambda: shell.run_cell(raw_cell, store_history=False), runs)


def run_all(name, model, ids, runs, with_grad=True, tokenizer=None, own_model=False):
    def zero():
        model.zero_grad(set_to_none=True)
    scenarios = {
        "(a) save one block output": (lambda: nbgrad.trace(model, ids, SAVE_ONE), lambda: raw_save_one(model, ids)),
        "(b) save every block output": (lambda: nbgrad.trace(model, ids, SAVE_ALL), lambda: raw_save_all(model, ids)),
        "(c) scale every block in place": (lambda: nbgrad.trace(model, ids, SCALE_ALL),
                                           lambda: raw_scale_all(model, ids)),
        "(b') (b) looping over the blocks": (lambda: nbgrad.trace(model, ids, SAVE_ALL_LOOP),
                                             lambda: raw_save_all(model, ids)),
        "(c') (c) looping over the blocks": (lambda: nbgrad.trace(model, ids, SCALE_ALL_LOOP),
                                             lambda: raw_scale_all(model, ids)),
    }
    if with_grad:
        scenarios["(e) one block's gradient"] = (lambda: (nbgrad.trace(model, ids, GRAD_ONE), zero()),
                                                 lambda: (raw_grad_one(model, ids), zero()))
    print(f"\n{name}  (ids {tuple(ids.shape)}, {runs} runs each in alternating pairs, ratio of the medians, and the "
          f"median of the per-pair ratios; "
          f"fixed cost = median of nbgrad - raw over the pairs, ± half its 95% interval; memory = peak tensor memory "
          f"of one run, nbgrad / raw)\n  [before: {machine_load()}]")
    rows, memory = {}, {}
    for label, (ours, raw) in scenarios.items():
        rows[label] = paired(ours, raw, runs)
        memory[label] = memory_ratio(ours, raw, ids.device.type)
    rows["(d) (a) through %%trace -q"] = magic_scenario(model, ids, runs)
    tokenizer = tokenizer or nbgrad.tokenizer_for(model)
    if tokenizer is not None:
        rows["(f) two invokes with a patch"] = invoke_scenario(model, runs, tokenizer)
    if own_model:
        own_rows, own_memory = own_model_rows(runs, ids.device)
        rows.update(own_rows)
        memory.update(own_memory)
    for label, (r, ours, raw, fixed, interval, per_pair) in rows.items():
        peak = f"   memory {memory[label]:5.3f}x" if label in memory else ""
        print(f"  {label:34s} {r:5.3f}x   per pair {per_pair:5.3f}x   fixed {fixed * 1e6:+7.0f} "
              f"±{interval * 1e6:5.0f} us   nbgrad {ours * 1e3:7.3f} ms   raw hooks {raw * 1e3:7.3f} ms{peak}")
    print(f"  [after: {machine_load()}]")
    return rows


OWN_MODEL_CELL = "h = model[1].output.save()\ny = model.output.save()"


def own_model_rows(runs: int, device) -> dict:
    """(g): a model of one's own, as a course's notebook has it: a small MLP on a batch of floats (no tokenizer,
    no input embeddings), one layer's output and the model's saved, against the same with a raw hook. Its forward
    takes tens of microseconds, so the ratio is mostly the fixed cost: the row says what a traced step of a loop
    over such a model costs."""
    ours, raw, x = own_model_pair(device)
    label = "(g) an MLP of one's own, floats"
    return {label: paired(ours, raw, runs)}, {label: memory_ratio(ours, raw, x.device.type)}


def own_model_pair(device) -> tuple:
    """(nbgrad's run, raw hooks' run, the input) of (g) (bench/instructions.py counts them too)."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 4)).to(device)
    x = torch.randn(32, 16, device=device)

    def raw():
        kept = {}
        handle = mlp[1].register_forward_hook(lambda m, a, o: kept.setdefault("h", o))
        try:
            kept["y"] = mlp(x)
        finally:
            handle.remove()
        return kept
    return (lambda: nbgrad.trace(mlp, x, OWN_MODEL_CELL)), raw, x


def machine_load() -> str:
    """The machine's load average, said beside each model's rows: the fixed cost grows on a busy machine (more so
    than the forward), so a run is judged with how quiet the machine was."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} over 1 / 5 / 15 min ({os.cpu_count()} cores)"


def wait_until_quiet(below: float, most: float = 600.0) -> None:
    """Wait (at most `most` seconds) until the machine's one-minute load average is under `below`: a run judged
    "on a quiet machine" starts on one, not in the wake of a test run or a build (the load average decays over
    minutes). Said, with how long it took, beside the load the rows print."""
    if below <= 0 or not hasattr(os, "getloadavg"):
        return
    start = time.monotonic()
    while os.getloadavg()[0] >= below and time.monotonic() - start < most:
        time.sleep(5)       # polling a state (the load average), not waiting a fixed time
    print(f"  [waited {time.monotonic() - start:.0f} s for a load average under {below}: "
          f"{'reached' if os.getloadavg()[0] < below else 'not reached'}]")


def embedded_setup() -> tuple:
    """Every bench's start: a fixed seed, the versions printed, and the embedded model, its tokenizer and
    the ids of one sentence."""
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, python {sys.version.split()[0]}")
    embedded = nbgrad.load_model()
    tokenizer = nbgrad.tokenizer_for(embedded)
    ids = tokenizer("The capital of France is Paris. The cat sat on the mat.", return_tensors="pt")["input_ids"]
    return embedded, tokenizer, ids


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    # 2000 pairs: at 100 the fixed cost's 95% interval was +-50 to 120 us (1.5 to 3.5% of a 3.4 ms forward); at 400,
    # +-25 to 40 us, still as wide as the margins of (c) and (f) to their bars: (f) read 1.037 to 1.065 from one run to
    # the next. At 2000, +-11 to 19 us, and (f) 1.043 to 1.049 in six runs; the embedded rows take about two minutes
    parser.add_argument("--runs", type=int, default=2000)
    # A GPT-2-small forward varies by milliseconds from run to run, against a fixed cost of a tenth of one: its
    # ratios need as many pairs as the embedded model's to tell 2% apart from noise (see the ± column)
    parser.add_argument("--small-runs", type=int, default=100, help="pairs on the GPT-2-small shape")
    parser.add_argument("--skip-small", action="store_true", help="only the embedded model")
    parser.add_argument("--device", default="cpu", help="where the models run (cpu, cuda)")
    parser.add_argument("--quiet-below", type=float, default=0.0, metavar="LOAD",
                        help="before each model's rows, wait (up to 10 min) for a 1-minute load average under LOAD")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        _SYNC.append(torch.cuda.synchronize)
        print(f"device: {torch.cuda.get_device_name(device)}")
    embedded, tokenizer, ids = embedded_setup()
    embedded, ids = embedded.to(device), ids.to(device)
    wait_until_quiet(args.quiet_below)
    run_all("embedded default model", embedded, ids, args.runs, own_model=True)
    if not args.skip_small:
        gpt2_small = GPT2LMHeadModel(GPT2Config()).eval().to(device)
        ids_small = torch.randint(0, 50257, (1, 16)).to(device)
        wait_until_quiet(args.quiet_below)
        run_all("GPT-2-small-shaped model (random weights)", gpt2_small, ids_small, args.small_runs,
                tokenizer=tokenizer)         # the embedded tokenizer's ids are within GPT-2's vocabulary


if __name__ == "__main__":
    main()
