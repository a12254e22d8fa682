"""The one entry the engine's callers use: `canonical_source(source, model, namespace)` gives back the cell in
the model's own paths. A cell that names nothing canonical is returned as it is after one regular-expression
search; a rewritten cell is cached per (text, model shape), like compiled cells."""
from __future__ import annotations

import ast
import contextlib
import re
import sys
import weakref

from torch import nn

from .alias import Rewrite
from .cache import CanonicalCache
from .detect import ModelFacts, family_of, registered, unknown_family
from .vocabulary import ROOT_NAMES, Vocabulary

# `NAME.embed`, `NAME.layers`, ...: every canonical expression starts with a name bound to the model (not
# `model.output.logits`, `model.model.layers`: an attribute of an attribute is the model's own path)
_ROOT_ATTRIBUTE = re.compile(r"(?<![\w.])[A-Za-z_]\w*\s*\.\s*(?:%s)\b|names\s*=\s*[\"']canonical"
                             % "|".join(ROOT_NAMES))
mentions_canonical = _ROOT_ATTRIBUTE.search


def canonical_source(source: str, model, namespace: dict | None) -> str:
    """`source` with its canonical names rewritten into `model`'s own paths (the same text if it has none)."""
    return rewrite_of(source, model, namespace).text


def rewrite_of(source: str, model, namespace: dict | None):
    """The cell's rewrite for `model`: `.text` (the cell in the model's own paths) and `.eager` (whether it reads
    attention patterns, which need the eager attention function)."""
    if not isinstance(model, nn.Module) or not mentions_canonical(source):
        return _Unchanged(source)
    roots = tuple(sorted(name for name, value in (namespace or {"model": model}).items() if value is model))
    return _rewritten(source, roots, model) if roots else _Unchanged(source)


def _rewritten(source: str, roots: tuple, model: nn.Module):
    cells = _CACHE.setdefault(model, {})
    key = (source, roots, registered[0])
    if key not in cells:
        if len(cells) > 256:
            cells.clear()
        entry = family_of(model)
        cells[key] = _unknown(source, roots, model) if entry is None else \
            Rewrite(source, roots, Vocabulary(ModelFacts(model, entry)))
    return cells[key]


# model -> {(cell text, names of the model, registrations): its Rewrite}; gone with the model
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _unknown(source: str, roots: tuple, model: nn.Module):
    """A model of no known family: a canonical name that is not the model's own attribute is an error."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in roots \
                and node.attr in ROOT_NAMES and not hasattr(model, node.attr):
            raise unknown_family(model, node.lineno)
    return _Unchanged(source)


class _Unchanged:
    def __init__(self, source: str):
        self.text, self.eager, self.caches = source, False, set()


def wrap_caches(rewrite, model, namespace: dict) -> None:
    """After the run: each name bound to `cache(names="canonical")` holds a CanonicalCache."""
    if not rewrite.caches:
        return
    facts = rewrite.vocabulary.facts
    ln_final = facts.module(facts.root_path("ln_final"))
    for name in rewrite.caches:
        if isinstance(namespace.get(name), dict):
            namespace[name] = CanonicalCache(namespace[name], facts.n_layers, ln_final)


@contextlib.contextmanager
def eager_attention(model: nn.Module):
    """Run `model` with the eager attention function for the block (patterns exist only there), then give
    the model's own implementation back, whatever happens."""
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if before in (None, "eager"):
        yield
        return
    print(f"nbgrad: attention patterns need eager attention; this cell runs {type(model).__name__} with "
         f"attn_implementation='eager' instead of {before!r}", file=sys.stderr)
    _set_implementation(model, "eager")
    try:
        yield
    finally:
        _set_implementation(model, before)


def _set_implementation(model: nn.Module, name: str) -> None:
    """transformers' own switch; a family it will not switch (Falcon: its forward reads the config's flag at
    each call) has the flag set on its config."""
    if getattr(model, "_can_set_attn_implementation", lambda: True)():
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
