"""`cache(names="canonical")`: every canonical value of a run, keyed `"layers.3.resid_post"`, with the residual
stream's views that TransformerLens users know (`accumulated_resid`, `decompose_resid`, `head_outputs`).

In the cell the call becomes a dict of `.save()`d canonical reads (alias.py); after the run, that dict is
wrapped in a `CanonicalCache`."""
from __future__ import annotations

import fnmatch

import torch

from ..errors import NbgradError

PER_LAYER = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "attn.q", "attn.k", "attn.v",
             "attn.pattern", "attn.z", "attn.head_out", "mlp.post")


def cached_names(facts, pattern: str = "*") -> list:
    """(key, canonical expression from the model) for every canonical value the family has, in forward order."""
    entry, names = facts.entry, [("embed", "embed.output")]
    for layer in range(facts.n_layers):
        for name in PER_LAYER:
            if name == "resid_mid" and (facts.parallel or not entry.get("resid_mid")):
                continue
            if name.split(".")[-1] in ("q", "k", "v", "pattern") and not facts.attention_event(name.split(".")[-1]):
                continue
            if name in ("attn_out", "mlp_out") and not entry.get(name.replace("out", "add")):
                continue
            names.append((f"layers.{layer}.{name}", f"layers[{layer}].{name}"))
    names.append(("ln_final", "ln_final.output"))
    return [(key, expression) for key, expression in names if fnmatch.fnmatchcase(key, pattern)]


class CanonicalCache(dict):
    """A run's canonical values: `cache["layers.3.resid_post"]`; with `grads=True`, `cache.grads[key]` is the
    gradient that flowed into that value in the cell's backward pass (every key but `attn.head_out`)."""

    def __init__(self, values: dict, n_layers: int, ln_final=None, grads: dict | None = None,
                 copy: dict | None = None):
        """`copy`: the `device` / `dtype` each value and gradient is moved / cast to, as a detached copy."""
        moved = (lambda value: value.detach().to(**copy)) if copy else (lambda value: value)
        super().__init__({key: moved(value) for key, value in values.items()})
        self.n_layers, self.ln_final = n_layers, ln_final
        self.grads = {key: moved(value) for key, value in (grads or {}).items()}

    def _need(self, key: str):
        if key not in self:
            raise NbgradError(f"this cache holds no {key!r}: the family has none (nbgrad.names.FAMILIES), or the "
                              f"cache's pattern left it out")
        return self[key]

    def accumulated_resid(self, apply_ln: bool = False) -> torch.Tensor:
        """The residual stream before each layer and after the last: `[n_layers + 1, batch, pos, d_model]`,
        embeddings first; with `apply_ln=True` each passed through the final layer norm."""
        stream = [self._need(f"layers.{i}.resid_pre") for i in range(self.n_layers)]
        stream.append(self._need(f"layers.{self.n_layers - 1}.resid_post"))
        stacked = torch.stack(stream)
        return self.ln_final(stacked) if apply_ln else stacked

    def decompose_resid(self, return_labels: bool = False):
        """What each part wrote into the final residual stream: the embeddings (the stream before layer 0),
        then each layer's attention and MLP output; they sum to the last layer's resid_post."""
        labels = ["embed"] + [f"layers.{i}.{part}" for i in range(self.n_layers) for part in ("attn_out", "mlp_out")]
        embed = self._need("layers.0.resid_pre")
        # some families (OPT) run the MLP on [batch * pos, d_model]: every part is laid out as the stream is
        stacked = torch.stack([embed] + [self._need(label).reshape(embed.shape) for label in labels[1:]])
        return (stacked, labels) if return_labels else stacked

    def head_outputs(self) -> torch.Tensor:
        """Every head's contribution to the residual stream: `[n_layers, batch, pos, heads, d_model]`."""
        return torch.stack([self._need(f"layers.{i}.attn.head_out") for i in range(self.n_layers)])
