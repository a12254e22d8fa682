"""Canonical names: one vocabulary (TransformerLens's) over every known decoder family, on the model as it is.

`FAMILIES` is the table (families.py), `register` adds a family, `canonical_source` rewrites a cell's canonical
names into the model's own paths before it is compiled (alias.py), `listing` is what `%names model` prints
(`part_listing`: `%names model.transformer.h[0]`)."""
from __future__ import annotations

from .detect import register
from .families import FAMILIES
from .rewrite import canonical_source, mentions_canonical, rewrite_of
from .listing import listing, part_listing

__all__ = ["FAMILIES", "register", "canonical_source", "mentions_canonical", "rewrite_of", "listing", "part_listing"]
