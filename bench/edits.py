"""A persistent edit's cost: a plain `model(ids)` with an active edit vs the same edit as a raw forward hook.

(a) a steering edit of one block's output (`model.transformer.h[3].output[:, -1] += v`) vs a forward hook doing
    the same;
(b) a site edit (`...attn.source.self_c_attn_1.output[:] *= 0.5`) vs a forward hook on the module the site calls;
(c) a gradient edit (`model.transformer.h[3].output.grad[:, -1] = 0`), a forward and backward pass, vs a forward
    hook that registers the same tensor hook.
Run: `python bench/edits.py [--runs N]`. Ratio = median(with the edit) / median(by hand), --runs each.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import nbgrad
from overhead import embedded_setup

STEER = "model.transformer.h[3].output[:, -1] += direction"
SITE = "model.transformer.h[3].attn.source.self_c_attn_1.output[:] *= 0.5"
GRAD = "model.transformer.h[3].output.grad[:, -1] = 0"


def _cut_last(grad):
    grad = grad.clone()
    grad[:, -1] = 0
    return grad


def _steer_hook(direction):
    def steer(module, args, output):
        output[:, -1] += direction
    return steer


def _grad_hook(module, args, output):
    output.register_hook(_cut_last)


def _forward(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _backward(model, ids):
    model(ids).logits[0, -1].max().backward()
    return model.transformer.wte.weight.grad


def _timed(model, ids, body, namespace, module, hook, call, runs):
    """(ratio, with the edit, by hand) for one edit, after checking that the two give the same values. The edit
    is installed once and the hook registered once: what is timed is a call, not the installing."""
    model.zero_grad()
    with nbgrad.edit(model, body, namespace):
        ours = call(model, ids).clone()
    handle = module.register_forward_hook(hook)
    model.zero_grad()
    try:
        assert torch.allclose(call(model, ids), ours)
    finally:
        handle.remove()
    edited, raw = [], []
    for _ in range(runs + 3):          # interleaved, so that a busy machine slows both alike; 3 warm-ups
        with nbgrad.edit(model, body, namespace):
            edited.append(_time(call, model, ids))
        handle = module.register_forward_hook(hook)
        try:
            raw.append(_time(call, model, ids))
        finally:
            handle.remove()
    edited, raw = statistics.median(edited[3:]), statistics.median(raw[3:])
    return edited / raw, edited, raw


def _time(call, model, ids) -> float:
    """Seconds of one call (the edit installed, or the hook registered, before the clock starts)."""
    start = time.perf_counter()
    call(model, ids)
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--tiny", action="store_true", help="a 4-block GPT-2 of width 32, where a call's fixed cost "
                                                              "shows more than on the embedded model")
    args = parser.parse_args(argv)
    model, _, ids = embedded_setup()
    if args.tiny:
        torch.manual_seed(0)
        config = GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=97, n_positions=32, bos_token_id=0,
                            eos_token_id=0)
        model = GPT2LMHeadModel(config).eval()
        ids = ids % 97
    direction = torch.randn(model.config.n_embd) / 8
    namespace = {"model": model, "direction": direction}
    block = model.transformer.h[3]
    rows = {
        "(a) steer one block's output": _timed(model, ids, STEER, namespace, block, _steer_hook(direction),
                                               _forward, args.runs),
        "(b) a site inside attention": _timed(model, ids, SITE, namespace, block.attn.c_attn,
                                              lambda m, a, o: o * 0.5, _forward, args.runs),
        "(c) a gradient edit, forward + backward": _timed(model, ids, GRAD, namespace, block, _grad_hook,
                                                          _backward, args.runs),
    }
    which = "tiny GPT-2" if args.tiny else "embedded default model"
    print(f"\n{which}, plain model(ids) (ids {tuple(ids.shape)}, {args.runs} runs each, median)")
    for label, (r, ours, raw) in rows.items():
        print(f"  {label:42s} {r:5.3f}x   edit {ours * 1e3:7.3f} ms   raw hook {raw * 1e3:7.3f} ms   "
              f"(+{(ours - raw) * 1e3:.3f} ms a call)")


if __name__ == "__main__":
    main()
