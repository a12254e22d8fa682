"""The canonical vocabulary, one step at a time: given what an expression already is (the model, the list of
layers, a block, its attention or MLP) and the next attribute, what it becomes in the real model's terms."""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..errors import NbgradError
from .detect import ModelFacts

ROOT_NAMES = ("embed", "pos_embed", "layers", "n_layers", "ln_final", "unembed", "logits")
BLOCK_NAMES = ("ln1", "attn", "ln2", "mlp", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
ATTN_NAMES = ("q", "k", "v", "pattern", "z", "head_out")
MLP_NAMES = ("post",)
EVENT_WORDS = {"output", "input", "inputs", "grad", "source", "skip", "save"}


@dataclass
class Canon:
    """What a canonical expression is: `text` in real paths, and its kind: root, layers, block, attn, mlp (a
    module the cell may go on naming from), module, value or const. A value may be a `view` of an event
    (`base` + `view`; written back through `inverse`); `block` is the text of the block it belongs to."""
    text: str
    kind: str
    block: str = ""
    base: str = ""
    view: str = ""
    inverse: str = ""
    writable: bool = True
    in_place: bool = False        # assignment is a copy into the live value (q, k, v)
    eager: bool = False           # needs the eager attention function (pattern)
    site: bool = False            # a value inside a module's forward (q, k, v, pattern)
    lacks: str = ""               # a module the family has not got (OPT's MLP): an error if used as a module


def value(base: str, **more) -> Canon:
    return Canon(base + more.get("view", ""), "value", base=base, **more)


class Vocabulary:
    def __init__(self, facts: ModelFacts):
        self.facts, self.entry = facts, facts.entry
        self.written = ""

    def step(self, canon: Canon, attr: str, line: int, written: str = "") -> Canon | None:
        """The next canonical step, None where `attr` is the model's own (the expression goes on as written);
        `written`: the expression as the cell writes it, for an error."""
        rule = {"root": self._root, "block": self._block, "attn": self._attn, "mlp": self._mlp}.get(canon.kind)
        if canon.kind == "value" and attr == "grad" and canon.view:
            return value(canon.base + ".grad", view=canon.view, inverse=canon.inverse)
        self.written = written
        return rule(canon, attr, line) if rule else None

    def lacking(self, what: str, why: str, line: int) -> NbgradError:
        written = f"{self.written}: " if self.written else ""
        return NbgradError(f"canonical names: {written}the {self.facts.family} family has no {what} ({why})", line)

    def lacking_module(self, what: str, line: int) -> NbgradError:
        """A module the family has not got (`Canon.lacks`, which says why), named as a module."""
        written = f"{self.written}: " if self.written else ""
        return NbgradError(f"canonical names: {written}the {self.facts.family} family has no {what}, so name them "
                           f"by the model's own paths", line)

    def _root(self, canon: Canon, attr: str, line: int) -> Canon | None:
        if attr not in ROOT_NAMES:
            if not hasattr(self.facts.model, attr) and attr not in EVENT_WORDS:
                self._typo(f"{canon.text}.{attr}", attr, ROOT_NAMES, line)
            return None
        if attr == "n_layers":
            return Canon(str(self.facts.n_layers), "const")
        if attr == "logits":
            return value(f"{canon.text}.output.logits")
        path = self.facts.root_path(attr)
        if path is None:
            why = "no learned positions" if attr == "pos_embed" else "not in its entry of nbgrad.names.FAMILIES"
            raise self.lacking(attr, why, line)
        return Canon(f"{canon.text}.{path}", "layers" if attr == "layers" else "module")

    def _block(self, canon: Canon, attr: str, line: int) -> Canon | None:
        text, entry = canon.text, self.entry
        if attr not in BLOCK_NAMES:
            if not self.facts.has_block_attribute(attr) and attr not in EVENT_WORDS:
                self._typo(f"layers[i].{attr}", attr, BLOCK_NAMES, line)
            return None
        if attr == "resid_pre":
            return value(f"{text}.input")
        if attr == "resid_post":
            return value(f"{text}.{self.entry.get('resid_post', 'output')}")
        if attr in ("resid_mid", "ln2") and (self.facts.parallel or not entry.get("resid_mid")):
            raise self.lacking(attr, "attention and MLP run in parallel from the same input, so the stream has "
                                     "no point between them", line)
        if attr == "resid_mid":
            return value(f"{text}.{entry['resid_mid']}.input")
        if attr in ("attn_out", "mlp_out"):         # what attention / the MLP adds to the stream
            module = entry.get(attr.replace("out", "add"))
            if module is None:
                raise self.lacking(attr, "its block adds no separate output to the stream", line)
            returns_pair = attr == "attn_out" and module == entry.get("attn")
            return value(f"{text}.{module}.output" + ("[0]" if returns_pair else ""))
        path = entry.get(attr)
        kind = attr if attr in ("attn", "mlp") else "module"
        if path is None and attr == "mlp":
            return Canon(text, "mlp", block=text, lacks="MLP module of its own; its MLP layers sit in the block itself")
        if path is None:
            raise self.lacking(attr, "not in its entry of nbgrad.names.FAMILIES", line)
        return Canon(f"{text}.{path}", kind, block=text)

    def _attn(self, canon: Canon, attr: str, line: int) -> Canon | None:
        if attr not in ATTN_NAMES:
            attn = self.facts.block.get_submodule(self.entry["attn"]) if self.facts.block is not None else None
            if not hasattr(attn, attr) and attr not in EVENT_WORDS:
                self._typo(f"layers[i].attn.{attr}", attr, ATTN_NAMES, line)
            return None
        heads, dim, block = self.facts.heads, self.facts.head_dim, canon.block
        z = f"{block}.{self.entry['attn_out']}.input"
        split = f".unflatten(-1, ({heads}, {dim}))"
        if attr == "z":
            return value(z, view=split, inverse=".flatten(-2)")
        if attr == "head_out":
            weight = f"{block}.{self.entry['attn_out']}.weight" + ("" if self.facts.out_is_conv1d else ".T")
            return Canon(f"({z}{split}.unsqueeze(-2) @ {weight}.reshape({heads}, {dim}, -1)).squeeze(-2)", "value",
                         writable=False)
        event = self.facts.attention_event(attr)
        if event is None:
            raise self.lacking(f"attn.{attr}", "its attention is computed its own way, without an attention "
                                               "function nbgrad can open", line)
        return value(f"{canon.text}.{event}", eager=attr == "pattern", in_place=attr != "pattern", site=True)

    def _mlp(self, canon: Canon, attr: str, line: int) -> Canon | None:
        if attr != "post":
            mlp = self.facts.block.get_submodule(self.entry["mlp"]) if self.facts.block is not None and \
                self.entry.get("mlp") else self.facts.block
            if not hasattr(mlp, attr) and attr not in EVENT_WORDS:
                self._typo(f"layers[i].mlp.{attr}", attr, MLP_NAMES, line)
            return None
        return value(f"{canon.block}.{self.entry['mlp_out']}.input")

    def _typo(self, written: str, attr: str, names, line: int) -> None:
        near = difflib.get_close_matches(attr, names, n=3, cutoff=0.6)
        if near:
            raise NbgradError(f"canonical names: {self.written or written} is not a canonical name; nearest: "
                              f"{', '.join(near)}", line)
