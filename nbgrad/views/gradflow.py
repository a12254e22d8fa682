"""`%gradflow`: per-layer gradient norms after a backward pass, vanishing / exploding layers flagged."""
from __future__ import annotations

import io

from torch import nn

VANISHING, EXPLODING = 1e-7, 1e3


def layer_stats(model: nn.Module) -> list:
    """(parameter group, mean |grad|, max |grad|) in model order, for parameters that have a .grad."""
    rows = []
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        grad = param.grad.detach().abs().double()
        rows.append((name, float(grad.mean()), float(grad.max())))
    return rows


def flags(rows: list) -> dict:
    """name -> 'vanishing' / 'exploding' (absolute thresholds, and far from the median of the model)."""
    if not rows:
        return {}
    means = sorted(mean for _, mean, _ in rows)
    median = means[len(means) // 2] or 1e-30
    flagged = {}
    for name, mean, _peak in rows:
        if mean < VANISHING or mean < median * 1e-4:
            flagged[name] = "vanishing"
        elif mean > EXPLODING or mean > median * 1e3:
            flagged[name] = "exploding"
    return flagged


def figure_png(rows: list, flagged: dict, title: str) -> bytes:
    import matplotlib
    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    height = max(2.5, 0.18 * len(rows) + 1.2)
    fig = Figure(figsize=(8, height), dpi=90)
    ax = fig.add_subplot()
    positions = list(range(len(rows)))
    means = [max(mean, 1e-30) for _, mean, _ in rows]
    peaks = [max(peak, 1e-30) for _, _, peak in rows]
    colours = ["#b00020" if name in flagged else "#466eb4" for name, _, _ in rows]
    ax.barh(positions, peaks, color="#cfd8e8", label="max |grad|")
    ax.barh(positions, means, color=colours, label="mean |grad|")
    ax.set_xscale("log")
    ax.set_yticks(positions, [f"{name}{'  ← ' + flagged[name] if name in flagged else ''}" for name, _, _ in rows],
                  fontsize=7)
    ax.invert_yaxis()
    ax.axvline(VANISHING, color="#999", linestyle=":", linewidth=1,      # the dotted lines, named in the legend
               label=f"thresholds: vanishing < {VANISHING:g}, exploding > {EXPLODING:g}")
    ax.axvline(EXPLODING, color="#999", linestyle=":", linewidth=1)
    ax.set_xlabel("|grad| (log scale)")
    ax.set_ylabel("parameter", fontsize=8)
    ax.set_title(title, fontsize=9, pad=18)
    # above the bars, under the title: inside the axes it would cover the last rows' bars
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False, borderaxespad=0.2)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


class GradFlow:
    def __init__(self, model: nn.Module, name: str = "model"):
        self.rows = layer_stats(model)
        self.flagged = flags(self.rows)
        self.name = name

    def text(self) -> str:
        if not self.rows:
            return f"{self.name} has no .grad: run a backward pass first (%%backward, or loss.backward() in a trace)"
        lines = [f"gradient flow of {self.name}: {len(self.rows)} parameter groups"]
        for name, mean, peak in self.rows:
            mark = f"  <- {self.flagged[name]}" if name in self.flagged else ""
            lines.append(f"  {name:50s} mean {mean:.3e}  max {peak:.3e}{mark}")
        return "\n".join(lines)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": self.text()}
        if self.rows:
            import base64
            png = figure_png(self.rows, self.flagged, f"gradient flow: {self.name}")
            bundle["image/png"] = base64.b64encode(png).decode()
        return bundle
