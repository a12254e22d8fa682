"""`--graph` of every cell magic: the hook graph shown instead of running the cell."""
from __future__ import annotations


NOT_RUN = "--graph: the cell was not run (no model call, nothing saved); run it without --graph to run it"


def show_graph(graph, title: str) -> None:
    """`--graph`: the hook graph as a picture, its text form beside it (what a terminal prints); both say that
    the cell was not run."""
    from IPython.display import display
    from ..views.hookgraph import HookGraphPicture
    display(HookGraphPicture(graph.to_dict(), graph.to_text(), title, note=NOT_RUN))
