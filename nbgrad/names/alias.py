"""Canonical names as a compile-time alias: the cell's text is rewritten, line for line, into the model's own
paths and events (`model.layers[3].resid_mid` -> `model.transformer.h[3].ln_2.input`) before it is compiled,
so the compiler and the run never know. Only the spans of canonical expressions change; every other character,
and every line number, stays where it was."""
from __future__ import annotations

import ast

from ..errors import ModulePathError, NbgradError
from .cachecell import display, grads_statements, is_canonical_cache
from .vocabulary import Canon, Vocabulary

_VIEW = "nbgrad_view"      # in an edit body, the copy of a view that a write into part of it goes through
_LOOP_WRAPPERS = {"reversed", "list", "tuple", "iter"}


class Rewrite:
    """One cell's rewrite for one model: `text` is the rewritten cell, `eager` whether it reads patterns."""

    def __init__(self, source: str, roots: tuple, vocabulary: Vocabulary, edit: bool = False):
        self.data = source.encode()
        starts, offset = [], 0
        for line in self.data.splitlines(keepends=True):
            starts.append(offset)
            offset += len(line)
        self.starts = starts + [offset]
        self.roots, self.vocabulary, self.blocks = set(roots), vocabulary, set()
        self.eager, self.sites = False, []       # sites: (line, name) of each value inside a forward (q, pattern)
        self.said: list = []          # (line, as the cell writes it, in the model's own paths), for errors
        tree = ast.parse(source)
        self._find_block_names(tree)
        skip: set = set()
        edits, self.caches = grads_statements(self, tree)
        edits += self._view_writes(tree, skip) if edit else []
        edits += self._statement_edits(tree, skip)
        edits += self._edits_in(tree, skip)
        self.text = self._spliced(0, len(self.data), edits).decode()

    # -- what an expression is -------------------------------------------------------------------------------
    def resolve(self, node: ast.AST) -> Canon | None:
        if isinstance(node, ast.Name):
            return Canon(node.id, "root") if node.id in self.roots else \
                Canon(node.id, "block") if node.id in self.blocks else None
        if isinstance(node, ast.Subscript):
            inner = self.resolve(node.value)
            if inner is None or inner.kind != "layers":
                return None
            self._check_index(node, inner)
            return Canon(f"{inner.text}[{self.text_of(node.slice)}]", "block")
        if isinstance(node, ast.Attribute):
            inner = self.resolve(node.value)
            found = inner and self.vocabulary.step(inner, node.attr, node.lineno, self.written(node))
            if inner and inner.lacks and not found:
                raise self.vocabulary.lacking_module(inner.lacks, node.lineno)
            if found:
                self.eager |= found.eager
                if found.site and (node.lineno, node.attr) not in self.sites:
                    self.sites.append((node.lineno, f"attn.{node.attr}"))
            return found or None
        return None

    def written(self, node: ast.AST) -> str:
        """An expression as the cell writes it."""
        return self.data[slice(*self._span(node))].decode()

    def _check_index(self, node: ast.Subscript, layers: Canon) -> None:
        """`model.layers[N]` past the last layer, said in the cell's words before its real path."""
        index = node.slice
        negative = isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub)
        number = getattr(index.operand if negative else index, "value", None)
        number = -number if negative and type(number) is int else number
        count = self.vocabulary.facts.n_layers
        if type(number) is int and not -count <= number < count:
            raise ModulePathError(f"{self.written(node)} is not in the model: {self.written(node.value)} has {count} "
                                  f"layers, indices 0–{count - 1} (or -{count}–-1) ({layers.text}[{number}] in the "
                                  f"model's own paths)", node.lineno)

    def _find_block_names(self, tree: ast.AST) -> None:
        """Loop variables over `model.layers` (also through `reversed`, `enumerate`) and names bound to one
        `model.layers[i]` stand for blocks."""
        for node in ast.walk(tree):
            pairs = [(node.target, node.iter)] if isinstance(node, (ast.For, ast.comprehension)) else []
            for target, iterable in pairs:
                self._bind_loop(target, iterable)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and isinstance(node.value, ast.Subscript) \
                    and getattr(self.resolve(node.value), "kind", "") == "block":
                self.blocks.add(node.targets[0].id)            # `block = model.layers[3]`

    def _bind_loop(self, target: ast.expr, iterable: ast.expr) -> None:
        numbered = False
        while isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and len(iterable.args) == 1 \
                and iterable.func.id in _LOOP_WRAPPERS | {"enumerate"}:
            numbered |= iterable.func.id == "enumerate"
            iterable = iterable.args[0]
        canon = self.resolve(iterable)
        if canon is None or canon.kind != "layers":
            return
        if numbered and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            target = target.elts[1]
        if isinstance(target, ast.Name):
            self.blocks.add(target.id)

    # -- the text ---------------------------------------------------------------------------------------------
    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def _span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text_of(self, node: ast.AST) -> str:
        start, end = self._span(node)
        return self._spliced(start, end, self._edits_in(node, skip=set())).decode()

    def _spliced(self, start: int, end: int, edits: list) -> bytes:
        pieces, at = [], start
        for edit_start, edit_end, text in sorted(edits):
            if start <= edit_start and edit_end <= end and edit_start >= at:
                pieces += [self.data[at:edit_start], text.encode()]
                at = edit_end
        return b"".join(pieces + [self.data[at:end]])

    def _edits_in(self, root: ast.AST, skip: set) -> list:
        """(start, end, text) for each outermost canonical expression under `root` (itself included)."""
        edits, pending = [], [root]
        while pending:
            node = pending.pop()
            if id(node) in skip:
                continue
            if is_canonical_cache(node):
                edits.append((*self._span(node), display(self, node)))
                continue
            canon = self.resolve(node) if isinstance(node, (ast.Attribute, ast.Subscript)) else None
            if canon is not None and canon.lacks:
                raise self.vocabulary.lacking_module(canon.lacks, node.lineno)
            if canon is not None and canon.kind not in ("root",):
                edits.append((*self._span(node), canon.text))
                self.said.append((node.lineno, self.written(node), canon.text))
                continue
            pending.extend(ast.iter_child_nodes(node))
        return edits

    # -- statements whose target is a view of an event ----------------------------------------------------------
    def _copy_before_edit(self, node: ast.stmt) -> list:
        """An in-place edit of a pattern edits a copy put in its place: softmax keeps its output for the
        backward pass, which an edit of the output itself would break."""
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AugAssign) else None
        while isinstance(target, ast.Subscript):
            target = target.value
        canon = self.resolve(target) if isinstance(target, ast.Attribute) else None
        if canon is None or not canon.eager or target is (node.targets[0] if isinstance(node, ast.Assign) else None):
            return []
        start = self.offset(node.lineno, node.col_offset)
        return [(start, start, f"{canon.text} = {canon.text}.clone(); ")]

    def _view_writes(self, tree: ast.AST, skip: set) -> list:
        """In an edit body: a write into part of a view (`attn.z[:, :, 0] = 0`, `attn.z *= 2`) becomes a write of
        its event, which an edit can hold (a read that feeds no write is refused there): the view is copied,
        written, put back."""
        edits = []
        for node in ast.walk(tree):
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AugAssign) else None
            inner = target
            while isinstance(inner, ast.Subscript):
                inner = inner.value
            whole = inner is target and not isinstance(node, ast.AugAssign)     # `attn.z = v`: _statement_edits
            canon = self.resolve(inner) if not whole and isinstance(inner, ast.Attribute) else None
            if canon is None or not canon.view:
                continue
            skip.add(id(node))
            index = self.data[self._span(inner)[1]:self._span(target)[1]].decode()
            operator = self.data[self._span(target)[1]:self._span(node.value)[0]].decode().strip()
            edits.append((*self._span(node), f"{_VIEW} = {canon.text}.clone(); {_VIEW}{index} {operator} "
                                             f"{self.text_of(node.value)}; {canon.base} = {_VIEW}{canon.inverse}"))
        return edits

    def _statement_edits(self, tree: ast.AST, skip: set) -> list:
        """Assignments to a view (`attn.z = v` writes `o_proj.input = v.flatten(-2)`) and in-place writes; the
        nodes they rewrite whole go into `skip`."""
        edits = []
        for node in ast.walk(tree):
            if id(node) in skip:        # rewritten whole already (_view_writes)
                continue
            edits += self._copy_before_edit(node) if isinstance(node, (ast.Assign, ast.AugAssign)) else []
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AugAssign) else None
            canon = self.resolve(target) if isinstance(target, ast.Attribute) else None
            if canon is None or canon.kind != "value" or not (canon.view or canon.in_place or not canon.writable):
                continue
            if not canon.writable:
                raise NbgradError(f"canonical names: {ast.unparse(target)} is computed from attn.z and the output "
                                  "weight; write attn.z instead", node.lineno)
            start, end = self._span(target)
            skip.add(id(target))
            if isinstance(node, ast.AugAssign) or canon.in_place:
                edits.append((start, end, f"{canon.text}[...]"))
            else:
                skip.add(id(node.value))
                written = f"{canon.base} = ({self.text_of(node.value)}){canon.inverse}"
                edits.append((start, self._span(node.value)[1], written))
        return edits

