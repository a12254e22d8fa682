"""`%names model`: each canonical name beside its real path for one model."""
from __future__ import annotations

from torch import nn

from .detect import ModelFacts, family_name, family_of, unknown_family
from .vocabulary import NbgradError, Vocabulary

_SHOWN = ("embed", "pos_embed", "layers", "n_layers", "ln_final", "unembed", "logits",
          "layers[i].ln1", "layers[i].attn", "layers[i].ln2", "layers[i].mlp",
          "layers[i].resid_pre", "layers[i].resid_mid", "layers[i].resid_post",
          "layers[i].attn.q", "layers[i].attn.k", "layers[i].attn.v", "layers[i].attn.pattern",
          "layers[i].attn.z", "layers[i].attn.head_out", "layers[i].mlp.post")


def listing(model: nn.Module, name: str = "model") -> str:
    """One line per canonical name: `model.layers[i].resid_mid  ->  model.transformer.h[i].ln_2.input`, or
    what the family lacks and why."""
    from .alias import Rewrite
    entry = family_of(model)
    if entry is None:
        raise unknown_family(model)
    vocabulary = Vocabulary(ModelFacts(model, entry))
    lines = [f"{name}: {type(model).__name__}, family {family_name(model)!r}, "
             f"{vocabulary.facts.n_layers} layers"]
    for canonical in _SHOWN:
        written = f"{name}.{canonical}"
        try:
            real = Rewrite(written, (name,), vocabulary).text
        except NbgradError as error:
            real = f"(none: {error.detail.split('(', 1)[-1].rstrip(')')})"
        lines.append(f"  {written:<32} {real}")
    return "\n".join(lines)
