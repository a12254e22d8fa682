"""`%names model`: each canonical name beside its real path for one model; `%names model.transformer.h[0]`: those
of the model that lie in that part of it."""
from __future__ import annotations

import re

from torch import nn

from .detect import ModelFacts, family_name, family_of, unknown_family
from .tree import _tree_path
from .vocabulary import NbgradError, Vocabulary

_SHOWN = ("embed", "pos_embed", "layers", "n_layers", "ln_final", "unembed", "logits",
          "layers[i].ln1", "layers[i].attn", "layers[i].ln2", "layers[i].mlp",
          "layers[i].resid_pre", "layers[i].resid_mid", "layers[i].resid_post",
          "layers[i].attn.q", "layers[i].attn.k", "layers[i].attn.v", "layers[i].attn.pattern",
          "layers[i].attn.z", "layers[i].attn.head_out", "layers[i].mlp.post")


def listing(model: nn.Module, name: str = "model") -> str:
    """One line per canonical name: `model.layers[i].resid_mid  ->  model.transformer.h[i].ln_2.input`, or
    what the family lacks and why."""
    facts, rows = _rows(model, name)
    return "\n".join([f"{name}: {type(model).__name__}, family {family_name(model)!r}, {facts.n_layers} layers"] +
                     [f"  {written:<32} {real}" for written, real in rows])


def part_listing(module: nn.Module, expression: str, namespace: dict) -> str:
    """The canonical names of the model that holds `module` (the notebook's name `expression` gives) that lie in
    that module's part of the tree, with the layer index the part has; or a line saying that none apply."""
    owner = _owner(module, expression, namespace)
    if owner is None:
        if family_of(module) is None:
            raise unknown_family(module)
        bound = [key for key, value in namespace.items() if value is module and key.isidentifier()]
        return listing(module, bound[0] if bound else "model")
    name, root, path = owner
    facts, rows = _rows(root, name)
    prefix = _tree_path(f"{name}.{path}")
    layers = _tree_path(f"{name}.{facts.root_path('layers')}") if facts.root_path("layers") else None
    index = re.match(re.escape(layers) + r"\[(\d+)\]", prefix) if layers else None
    if index:
        rows = [(written.replace("[i]", f"[{index[1]}]"), real.replace("[i]", f"[{index[1]}]"))
                for written, real in rows]
    inside = [(written, real) for written, real in rows if _within(real.lstrip("("), prefix)]
    head = f"{expression}: {type(module).__name__} in {name} ({type(root).__name__}, family {family_name(root)!r})"
    if not inside:
        return f"{head}: no canonical name of {name} lies in it (%names {name} lists them all)"
    return "\n".join([head] + [f"  {written:<32} {real}" for written, real in inside])


def _rows(model: nn.Module, name: str) -> tuple:
    from .alias import Rewrite
    entry = family_of(model)
    if entry is None:
        raise unknown_family(model)
    vocabulary = Vocabulary(ModelFacts(model, entry))
    rows = []
    for canonical in _SHOWN:
        written = f"{name}.{canonical}"
        try:
            real = Rewrite(written, (name,), vocabulary).text
        except NbgradError as error:
            real = f"(none: {error.detail.split('(', 1)[-1].rstrip(')')})"
        rows.append((written, real))
    return vocabulary.facts, rows


def _owner(module: nn.Module, expression: str, namespace: dict):
    """(name, model, path of `module` in it) for the model of a known family, bound to a name in the notebook,
    that holds `module` below itself (the expression's own first name first); None if there is none. A model held
    elsewhere stands in `namespace` as its skeleton."""
    first = re.match(r"\s*([^\W\d]\w*)", expression)
    names = ([first[1]] if first else []) + [key for key in namespace if key.isidentifier()]
    for name in dict.fromkeys(names):
        root = namespace.get(name)
        if not isinstance(root, nn.Module) or root is module or family_of(root) is None:
            continue
        path = next((path for path, inner in root.named_modules() if inner is module), None)
        if path:
            return name, root, path
    return None


def _within(real: str, prefix: str) -> bool:
    return real == prefix or real.startswith((prefix + ".", prefix + "["))
