"""Canonical names placed on a model's module tree, as the sidebar shows it: which real module each canonical
module name is (`model.transformer.h[3].attn` is `model.layers[3].attn`), and which canonical values each module
holds (`resid_pre`, `resid_mid`, `resid_post` on a block, `q`... `head_out` on its attention, `post` on its MLP).
Found with the same vocabulary that rewrites cells, so the tree offers exactly the names a cell may write."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch import nn

from ..errors import NbgradError
from .detect import ModelFacts, family_name, family_of
from .vocabulary import ATTN_NAMES, MLP_NAMES, Canon, Vocabulary

ROOT_MODULES = ("embed", "pos_embed", "layers", "ln_final", "unembed")
BLOCK_MODULES = ("ln1", "attn", "ln2", "mlp")
BLOCK_VALUES = ("resid_pre", "resid_mid", "resid_post")
INNER_VALUES = {"attn": ATTN_NAMES, "mlp": MLP_NAMES}
_INDEX = re.compile(r"\.(\d+)(?=\.|$)")


@dataclass
class CanonicalTree:
    """`names`: a module's path as the tree writes it -> its canonical path; `values`: a module's path -> the
    canonical values read there, each relative to that module's canonical path (`mlp.post` on a block whose
    family has no MLP module of its own)."""
    family: str
    names: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)


def canonical_tree(model: nn.Module, name: str) -> CanonicalTree | None:
    """The canonical names of `model`, bound to `name` in the notebook; None for a model of no known family."""
    entry = family_of(model)
    if entry is None:
        return None
    vocabulary = Vocabulary(ModelFacts(model, entry))
    tree = CanonicalTree(family_name(model))
    root = Canon(name, "root")
    for attr in ROOT_MODULES:
        found = _step(vocabulary, root, attr)
        if found is not None and not found.lacks:
            tree.names[_tree_path(found.text)] = f"{name}.{attr}"
    if f"{name}.unembed" in tree.names.values():       # a base model (no head) has no logits
        tree.values[name] = ["logits"]
    layers = _step(vocabulary, root, "layers")
    for index in range(vocabulary.facts.n_layers if layers is not None else 0):
        block = Canon(f"{_tree_path(layers.text)}[{index}]", "block")
        _add_block(tree, vocabulary, block, f"{name}.layers[{index}]")
    return tree


def _add_block(tree: CanonicalTree, vocabulary: Vocabulary, block: Canon, canonical: str) -> None:
    tree.names[block.text] = canonical
    values = tree.values[block.text] = [value for value in BLOCK_VALUES if _step(vocabulary, block, value)]
    for attr in BLOCK_MODULES:
        found = _step(vocabulary, block, attr)
        if found is None:
            continue
        inner = [value for value in INNER_VALUES.get(attr, ()) if _step(vocabulary, found, value)]
        if found.lacks:             # no module of its own (OPT's MLP): its values are the block's
            values.extend(f"{attr}.{value}" for value in inner)
            continue
        path = _tree_path(found.text)
        tree.names[path] = f"{canonical}.{attr}"
        if inner:
            tree.values[path] = inner


def _step(vocabulary: Vocabulary, canon: Canon, attr: str) -> Canon | None:
    """The canonical name `attr` after `canon`, or None where the family lacks it (or its entry lacks a path the
    name needs: a family registered with fewer keys)."""
    try:
        return vocabulary.step(canon, attr, 0)
    except (NbgradError, KeyError, AttributeError):
        return None


def _tree_path(text: str) -> str:
    """`model.transformer.h.0` -> `model.transformer.h[0]`, as the tree writes a path."""
    return _INDEX.sub(r"[\1]", text)
