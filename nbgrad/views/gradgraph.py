"""`%gradgraph`: the autograd graph behind a tensor, as a picture (grad_fn nodes, named leaves)."""
from __future__ import annotations

import base64
import io

import torch


MAX_NODES = 60


def walk(tensor: torch.Tensor, names: dict) -> tuple:
    """Nodes (id -> label, depth) and edges (child -> parent) of the graph, breadth first from the root."""
    nodes, edges, order = {}, [], []
    if tensor.grad_fn is None:
        label = names.get(id(tensor), "tensor")
        return {id(tensor): (f"{label}\nleaf {tuple(tensor.shape)}", 0)}, [], 0
    queue, depth_of = [(tensor.grad_fn, 0)], {}
    hidden = 0
    while queue:
        fn, depth = queue.pop(0)
        if fn in depth_of:
            continue
        if len(depth_of) >= MAX_NODES:
            hidden += 1
            continue
        depth_of[fn] = depth
        variable = getattr(fn, "variable", None)
        if variable is not None:
            label = f"{names.get(id(variable), 'leaf')}\n{tuple(variable.shape)}"
        else:
            label = type(fn).__name__
        nodes[id(fn)] = (label, depth)
        order.append(fn)
        for child, _ in fn.next_functions:
            if child is not None:
                edges.append((id(child), id(fn)))
                queue.append((child, depth + 1))
    edges = [(a, b) for a, b in edges if a in nodes and b in nodes]
    return nodes, edges, hidden


def figure_png(nodes: dict, edges: list, title: str) -> bytes:
    import matplotlib
    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    levels = {}
    for node_id, (_, depth) in nodes.items():
        levels.setdefault(depth, []).append(node_id)
    width = max(len(v) for v in levels.values())
    fig = Figure(figsize=(max(4, 2.2 * width), max(2.5, 1.1 * len(levels) + 0.5)), dpi=90)
    ax = fig.add_subplot()
    ax.set_axis_off()
    place = {}
    for depth, ids in levels.items():
        for index, node_id in enumerate(ids):
            place[node_id] = ((index + 0.5) / len(ids), -depth)
    for child, parent in edges:
        (x1, y1), (x2, y2) = place[child], place[parent]
        ax.annotate("", xy=(x2, y2 - 0.22), xytext=(x1, y1 + 0.22),
                    arrowprops=dict(arrowstyle="->", color="#888"))
    for node_id, (label, _) in nodes.items():
        x, y = place[node_id]
        leaf = "\n" in label
        ax.text(x, y, label, ha="center", va="center", fontsize=8, family="monospace",
                bbox=dict(boxstyle="round", facecolor="#e8f3e8" if leaf else "#e8eef8", edgecolor="#888"))
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-max(levels) - 0.6, 0.6)
    ax.set_title(title, fontsize=9)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


class GradGraph:
    """The autograd graph behind `tensor`; `names` maps id(leaf tensor) -> the name to show."""

    def __init__(self, tensor: torch.Tensor, names: dict, title: str):
        self.nodes, self.edges, self.hidden = walk(tensor, names)
        self.title = title

    def text(self) -> str:
        lines = [f"autograd graph of {self.title}: {len(self.nodes)} nodes"]
        for label, depth in sorted(self.nodes.values(), key=lambda pair: pair[1]):
            lines.append("  " * depth + label.replace("\n", " "))
        if self.hidden:
            lines.append(f"  … {self.hidden} more nodes not shown")
        return "\n".join(lines)

    def _repr_mimebundle_(self, include=None, exclude=None):
        png = figure_png(self.nodes, self.edges, f"autograd graph of {self.title}"
                         + (f" ({self.hidden} more nodes not shown)" if self.hidden else ""))
        return {"text/plain": self.text(), "image/png": base64.b64encode(png).decode()}
