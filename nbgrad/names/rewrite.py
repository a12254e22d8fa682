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

from ..errors import NbgradError
from .alias import Rewrite
from .cache import CanonicalCache
from .cachecell import COPY_OF, GRADS_OF, VIEW_GRADS_OF, is_canonical_cache
from .detect import ModelFacts, family_of, registered, unknown_family
from .vocabulary import ROOT_NAMES, Vocabulary

# `NAME.embed`, `NAME.layers`, ...: every canonical expression starts with a name bound to the model (not
# `model.output.logits`, `model.model.layers`: an attribute of an attribute is the model's own path)
_ROOT_ATTRIBUTE = re.compile(r"(?<![\w.])[A-Za-z_]\w*\s*\.\s*(?:%s)\b|names\s*=\s*[\"']canonical"
                             % "|".join(ROOT_NAMES))
mentions_canonical = _ROOT_ATTRIBUTE.search


class _Mentions(dict):
    """source -> whether it names a canonical expression, searched once per text: a text seen before costs a dict
    lookup and no Python call (`trace` asks before every cell; the search takes microseconds)."""

    def __missing__(self, source: str) -> bool:
        if len(self) >= 512:
            self.clear()
        found = self[source] = _ROOT_ATTRIBUTE.search(source) is not None
        return found


mentions = _Mentions()


def canonical_source(source: str, model, namespace: dict | None) -> str:
    """`source` with its canonical names rewritten into `model`'s own paths (the same text if it has none)."""
    return rewrite_of(source, model, namespace).text


def rewrite_of(source: str, model, namespace: dict | None, edit: bool = False):
    """The cell's rewrite for `model`: `.text` (the cell in the model's own paths) and `.eager` (whether it reads
    attention patterns, which need the eager attention function); `edit`: the body of an edit (`%%edit`)."""
    if not isinstance(model, nn.Module) or not mentions_canonical(source):
        return _Unchanged(source)
    roots = tuple(sorted(name for name, value in (namespace or {"model": model}).items() if value is model))
    return _rewritten(source, roots, model, edit) if roots else _Unchanged(source)


def _rewritten(source: str, roots: tuple, model: nn.Module, edit: bool):
    cells = _CACHE.setdefault(model, {})
    key = (source, roots, registered[0], edit)
    if key not in cells:
        if len(cells) > 256:
            cells.clear()
        entry = family_of(model)
        cells[key] = _unknown(source, roots, model) if entry is None else \
            Rewrite(source, roots, Vocabulary(ModelFacts(model, entry)), edit)
    return cells[key]


# model -> {(cell text, names of the model, registrations): its Rewrite}; gone with the model
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _unknown(source: str, roots: tuple, model: nn.Module):
    """A model of no known family: a canonical name that is not the model's own attribute, or a canonical
    cache, is an error."""
    for node in ast.walk(ast.parse(source)):
        if is_canonical_cache(node):
            raise unknown_family(model, node.lineno)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in roots \
                and node.attr in ROOT_NAMES and not hasattr(model, node.attr):
            raise unknown_family(model, node.lineno)
    return _Unchanged(source)


class _Unchanged:
    def __init__(self, source: str):
        self.text, self.eager, self.caches, self.sites = source, False, {}, []


def wrap_caches(rewrite, namespace: dict, result=None) -> None:
    """After the run: each name bound to `cache(names="canonical")` holds a CanonicalCache (with `--over`, one
    per example), its gradients (`grads=True`) in `.grads`."""
    if not rewrite.caches:
        return
    facts = rewrite.vocabulary.facts
    ln_final = facts.module(facts.root_path("ln_final"))
    for name, has_grads in rewrite.caches.items():
        values, grads = namespace.get(name), namespace.pop(GRADS_OF + name, None) if has_grads else None
        view_grads = namespace.pop(VIEW_GRADS_OF + name, None) or {}
        if isinstance(grads, list):         # --over: one per example
            views = view_grads if isinstance(view_grads, list) else [view_grads] * len(grads)
            grads = [{**grad, **view} for grad, view in zip(grads, views, strict=True)]
        elif isinstance(grads, dict):
            grads = {**grads, **view_grads}
        copy = namespace.pop(COPY_OF + name, None)
        if isinstance(values, dict):
            namespace[name] = CanonicalCache(values, facts.n_layers, ln_final, grads, copy)
        elif isinstance(values, list) and all(isinstance(value, dict) for value in values):
            grads = grads if isinstance(grads, list) else [None] * len(values)
            namespace[name] = [CanonicalCache(value, facts.n_layers, ln_final, grad, copy)
                               for value, grad in zip(values, grads, strict=True)]
        saved = getattr(result, "saved", None)
        if isinstance(saved, dict):        # the panel shows the cache's values, not the parts' of ours
            for key in [key for key in saved if key.startswith((f"{GRADS_OF}{name}[", f"{VIEW_GRADS_OF}{name}["))]:
                del saved[key]


@contextlib.contextmanager
def eager_attention(model: nn.Module):
    """Run `model` with the eager attention function for the block (patterns exist only there), then give
    the model's own implementation back, whatever happens."""
    before = implementation_of(model)
    if before not in (None, "eager"):
        print(f"nbgrad: attention patterns need eager attention; this cell runs {type(model).__name__} with "
              f"attn_implementation='eager' instead of {before!r}", file=sys.stderr)
    with attention_as(model, "eager"):
        yield


def implementation_of(model: nn.Module) -> str | None:
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


@contextlib.contextmanager
def attention_as(model: nn.Module, name: str | None):
    """Run `model` with the attention implementation `name` (None: as it is), then give its own back, whatever
    happens: a `--engine ray` worker runs each batch as the notebook's model runs the cell."""
    before = implementation_of(model)
    if name is None or before in (None, name):
        yield
        return
    _set_implementation(model, name)
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


@contextlib.contextmanager
def in_cell_words(rewrite):
    """An error of the run about a line with canonical names says them as the cell wrote them, the model's own
    paths after (`model.layers[i].resid_post: ...` rather than `model.model.layers[i].output: ...`)."""
    try:
        yield
    except NbgradError as error:
        said = [(written, real) for line, written, real in getattr(rewrite, "said", ()) if line == error.line
                and real in error.detail]
        if not said:
            raise
        detail = error.detail
        for written, real in sorted(said, key=lambda pair: -len(pair[1])):
            detail = detail.replace(real, written)
        own = "; ".join(dict.fromkeys(real for _, real in said))
        try:
            plain = type(error)(f"{detail} ({own} in the model's own paths)", error.line)
        except TypeError:
            raise error from None
        plain.__suppress_context__ = True
        raise plain from error.__cause__
