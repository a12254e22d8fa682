"""`%%generate`'s overhead: 20 new tokens with one read per step, as a ratio against the same reads done
with raw hooks around `model.generate`, in one run (alternating, medians; see overhead.py).
Run: `python bench/generate.py [--runs N] [--small]`.
"""
from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import nbgrad
from overhead import embedded_setup, ratio

NEW_TOKENS = 20
READ_ONE = "hs = model.transformer.h[-1].output.save()"


def raw_read_one(model, kwargs):
    kept = []
    handle = model.transformer.h[-1].register_forward_hook(lambda m, a, o: kept.append(o))
    try:
        model.generate(**kwargs)
    finally:
        handle.remove()
    return kept


def magic_scenario(model, kwargs, runs: int) -> tuple:
    """`%%generate -q` in an IPython shell vs a cell doing the same with raw hooks."""
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("nbgrad")
    shell.user_ns.update(model=model, ids=kwargs["input_ids"], raw_read_one=raw_read_one, kwargs=kwargs)
    magic_cell = f"%%generate model ids --max-new-tokens {NEW_TOKENS} -q\n{READ_ONE}"
    raw_cell = "hs = raw_read_one(model, kwargs)"
    return ratio(lambda: shell.run_cell(magic_cell, store_history=False),
                 lambda: shell.run_cell(raw_cell, store_history=False), runs)


def run_all(name, model, ids, runs):
    kwargs = {"input_ids": ids, "max_new_tokens": NEW_TOKENS, "do_sample": False}
    nbgrad_result = nbgrad.generate(model, ids, READ_ONE, max_new_tokens=NEW_TOKENS)
    assert torch.equal(nbgrad_result.output, model.generate(**kwargs)), "nbgrad.generate must give the same tokens"
    rows = {
        "(a) nbgrad.generate, one read per step": ratio(
            lambda: nbgrad.generate(model, ids, READ_ONE, max_new_tokens=NEW_TOKENS),
            lambda: raw_read_one(model, kwargs), runs),
        "(b) (a) through %%generate -q": magic_scenario(model, kwargs, runs),
    }
    print(f"\n{name}  (prompt {tuple(ids.shape)}, {NEW_TOKENS} new tokens, {runs} runs each, median)")
    for label, (r, ours, raw) in rows.items():
        print(f"  {label:40s} {r:5.3f}x   nbgrad {ours * 1e3:8.2f} ms   raw hooks {raw * 1e3:8.2f} ms")
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--small", action="store_true", help="also a GPT-2-small-shaped model (slow on CPU)")
    args = parser.parse_args(argv)
    embedded, _, ids = embedded_setup()
    run_all("embedded default model", embedded, ids, args.runs)
    if args.small:
        config = GPT2Config(pad_token_id=0, eos_token_id=None, bos_token_id=None)
        gpt2_small = GPT2LMHeadModel(config).eval()
        gpt2_small.generation_config.eos_token_id = None      # random weights: always 20 new tokens
        run_all("GPT-2-small-shaped model (random weights)", gpt2_small, torch.randint(0, 50257, (1, 16)),
                max(10, args.runs // 3))


if __name__ == "__main__":
    main()
