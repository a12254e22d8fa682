"""`M.source` sites as a ratio against the same read written by hand, in one run.

(a) the attention pattern of layer 0 (`attention_interface_1.source.nn_functional_softmax_0`, a site
inside the function a site calls) vs torch's softmax patched by hand to keep its first result;
(b) a call site of the attention module (`self_c_attn_1`) vs a forward hook on the submodule it calls;
(c) a cell that names no site, for comparison with bench/overhead.py's (a): no site, no extra cost.
Run: `python bench/source.py [--runs N]`. Ratio = median(nbgrad) / median(by hand), >= 30 runs each.
"""
from __future__ import annotations

import argparse

import torch

import nbgrad
from overhead import embedded_setup, ratio, raw_save_one

PATTERN = ("pattern = model.transformer.h[0].attn.source.attention_interface_1.source"
           ".nn_functional_softmax_0.output.save()")
CALL_SITE = "qkv = model.transformer.h[0].attn.source.self_c_attn_1.output.save()"
NO_SITE = "hs = model.transformer.h[-1].output.save()"


def patched_softmax_read(model, ids):
    """The oracle the tests use: softmax patched by hand, its first result kept (layer 0's pattern)."""
    original, kept = torch.nn.functional.softmax, []

    def patched(*args, **kwargs):
        out = original(*args, **kwargs)
        if not kept:
            kept.append(out)
        return out
    torch.nn.functional.softmax = patched
    try:
        model(ids)
    finally:
        torch.nn.functional.softmax = original
    return kept[0]


def hooked_call_site(model, ids):
    kept = {}
    handle = model.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, a, o: kept.setdefault("qkv", o))
    try:
        model(ids)
    finally:
        handle.remove()
    return kept["qkv"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args(argv)
    _, _, ids = embedded_setup()
    model = nbgrad.load_model(attn_implementation="eager")
    with torch.no_grad():
        assert torch.equal(nbgrad.trace(model, ids, PATTERN).saved["pattern"], patched_softmax_read(model, ids))
    rows = {
        "(a) attention pattern (a site in the callee)": ratio(lambda: nbgrad.trace(model, ids, PATTERN, no_grad=True),
                                                              lambda: _no_grad(patched_softmax_read, model, ids),
                                                              args.runs),
        "(b) a call site of the attention": ratio(lambda: nbgrad.trace(model, ids, CALL_SITE, no_grad=True),
                                                 lambda: _no_grad(hooked_call_site, model, ids), args.runs),
        "(c) no site named (one block output)": ratio(lambda: nbgrad.trace(model, ids, NO_SITE, no_grad=True),
                                                     lambda: _no_grad(raw_save_one, model, ids), args.runs),
    }
    print(f"\nembedded default model, eager attention (ids {tuple(ids.shape)}, {args.runs} runs each, median)")
    for label, (r, ours, raw) in rows.items():
        print(f"  {label:46s} {r:5.3f}x   nbgrad {ours * 1e3:7.3f} ms   by hand {raw * 1e3:7.3f} ms")


def _no_grad(fn, *args):
    with torch.no_grad():
        return fn(*args)


if __name__ == "__main__":
    main()
