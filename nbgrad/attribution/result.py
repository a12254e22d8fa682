"""`Attribution`: the scores of one attribution, their labels, its checks, and its picture."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class Attribution:
    """Scores of one attribution.

    - `scores`: per token `[positions]` (`nbgrad.attribute`), or per site and position
      `[sites, positions]` (`nbgrad.attribution_patching`; `[sites]` with `positions=False`).
    - `labels`: the labels of the scores' axis for 1-D scores (tokens, or site names); for 2-D
      scores the pair `(site names, position labels)`.
    - `delta`: for integrated gradients, sum of attributions − (F(input) − F(baseline)): the
      completeness gap (Captum's convergence delta). None for other methods.
    - `exact`: for attribution patching with `check_top=k`, the exact patching effects, shaped like
      `scores`, NaN where not checked. None otherwise.
    - `pairs`: for attribution patching on a batch of clean / corrupt pairs, each pair's scores
      `[pairs, sites, positions]` (equal to one call per pair); `scores` is their mean. None for one pair.
    """
    scores: torch.Tensor
    labels: list | tuple
    method: str
    delta: float | None = None
    exact: torch.Tensor | None = None
    tokens: list = field(default_factory=list)
    sites: list = field(default_factory=list)
    change: float | None = None     # F(input) − F(baseline) for integrated gradients
    title: str = ""
    notes: list = field(default_factory=list)
    pairs: torch.Tensor | None = None

    def checked(self) -> list:
        """[(label, estimate, exact)] of every pair patched exactly, largest |estimate| first."""
        if self.exact is None:
            return []
        rows = []
        for index in torch.nonzero(~torch.isnan(self.exact)).tolist():
            rows.append((self._label(index), float(self.scores[tuple(index)]), float(self.exact[tuple(index)])))
        return sorted(rows, key=lambda row: -abs(row[1]))

    def _label(self, index: list):
        if self.scores.dim() == 2:
            return self.labels[0][index[0]], self.labels[1][index[1]]
        return self.labels[index[0]]

    def view(self):
        from ..views.attribution import AttributionView
        rows, cols = (self.labels[0], self.labels[1]) if self.scores.dim() == 2 else (None, self.labels)
        return AttributionView(self.scores, cols, rows=rows, title=self.title, notes=self.summary_lines(),
                               exact=self.exact)

    def summary_lines(self) -> list:
        lines = list(self.notes)
        if self.delta is not None and self.change is not None:
            ratio = abs(self.delta) / abs(self.change) if self.change else float("inf")
            lines.insert(0, f"completeness: sum of attributions {float(self.scores.double().sum()):.6g}, "
                            f"F(input) − F(baseline) {self.change:.6g}, delta {self.delta:.3g} "
                            f"(|delta| / |F(input) − F(baseline)| = {ratio:.2g})")
        return lines

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.view()._repr_mimebundle_(include, exclude)

    def __repr__(self) -> str:
        return self.view().text()
