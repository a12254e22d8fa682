"""The hook graph as a picture: statements on the right, the events they wait for on the left in the
order the run met them, forward and backward passes in lanes of their own. Data in, SVG out."""
from __future__ import annotations

from html import escape

EVENT_X, STATEMENT_X, WIDTH = 12, 330, 900
# (row pitch, box height): a run's picture gives each statement a second line, what ran when
ONE_LINE, TWO_LINES = (34, 24), (46, 38)
PHASE_COLOURS = {"forward": "#2b6cb0", "backward": "#c05621", "other": "#718096"}


def _colour(phase: str) -> str:
    return PHASE_COLOURS["backward" if phase.startswith("backward") else "forward" if phase == "forward" else "other"]


def _events(graph: dict) -> list:
    """Event names, forward ones first, each lane in the order the run woke statements with them
    (source order before a run)."""
    order = [run["woke_by"] for run in graph.get("runs", []) if run["woke_by"]]
    written = [f"{e['target']}.{e['kind']}" for node in graph["nodes"] for e in node["events"]]
    names = list(dict.fromkeys(order + written))
    return sorted(names, key=lambda name: name.endswith(".grad"))     # stable: the backward lane below


def _statement_runs(graph: dict) -> dict:
    """node index -> [(step, phase, woken by)] in run order; steps count from 1 over the whole run."""
    runs: dict = {}
    for step, run in enumerate(graph.get("runs", []), start=1):
        runs.setdefault(run["node"], []).append((step, run["phase"], run["woke_by"]))
    return runs


def _run_label(ran: list, failed: bool) -> str:
    """`ran #2, #7 · backward pass 0 · by hs.grad`: when the statement ran, and what woke it last."""
    _, phase, woke_by = ran[-1]
    steps = ", ".join(f"#{step}" for step, _, _ in ran)
    label = f"{'failed' if failed else 'ran'} {steps} · {phase}" + (f" · by {woke_by}" if woke_by else "")
    return label if len(label) <= 80 else label[:79] + "…"


def _text(x: int, y: int, content: str, size: int = 12, colour: str = "#1a202c", weight: str = "normal") -> str:
    return (f'<text x="{x}" y="{y}" font-family="monospace" font-size="{size}" fill="{colour}" '
            f'font-weight="{weight}">{escape(content)}</text>')


def _event_boxes(events: list, top: int, row: int, box: int) -> tuple:
    parts, where = [], {}
    for index, event in enumerate(events):
        y = top + index * row + (box - 24) // 2           # centred on its row's statement box
        colour = _colour("backward" if event.endswith(".grad") else "forward")
        parts.append(f'<rect x="{EVENT_X}" y="{y}" width="280" height="24" rx="4" fill="#fff" '
                     f'stroke="{colour}"/>')
        parts.append(_text(EVENT_X + 8, y + 16, event[:38], colour=colour))
        where[event] = y + 12
    return parts, where


def _statement_boxes(graph: dict, top: int, row: int, box: int) -> tuple:
    parts, where, runs = [], {}, _statement_runs(graph)
    for index, node in enumerate(graph["nodes"]):
        y = top + index * row
        failed = graph.get("failed") == node["index"]
        stroke = "#c53030" if failed else "#4a5568"
        parts.append(f'<rect x="{STATEMENT_X}" y="{y}" width="{WIDTH - STATEMENT_X - 12}" height="{box}" rx="4" '
                     f'fill="{"#fff5f5" if failed else "#f7fafc"}" stroke="{stroke}" stroke-width="{2 if failed else 1}"/>')
        lane = f"[invoke {node['invoke']}] " if node.get("invoke") is not None else ""
        label = f"{lane}line {node['line']}: {node['source'].splitlines()[0]}"
        label = label if len(label) <= 74 else label[:73] + "…"
        parts.append(_text(STATEMENT_X + 8, y + 16, label, weight="bold" if failed else "normal"))
        ran = runs.get(node["index"], [])
        if ran:
            parts.append(_text(STATEMENT_X + 8, y + 31, _run_label(ran, failed), 11, _colour(ran[-1][1])))
        where[node["index"]] = y + box // 2
    return parts, where


def hook_graph_svg(graph: dict, title: str = "") -> str:
    """An SVG picture of a hook graph's dict form (`HookGraph.to_dict()`)."""
    events = _events(graph)
    top, (row, box) = 48, TWO_LINES if graph.get("runs") else ONE_LINE
    event_parts, event_y = _event_boxes(events, top, row, box)
    statement_parts, node_y = _statement_boxes(graph, top, row, box)
    arrows = []
    for node in graph["nodes"]:
        for event in dict.fromkeys(f"{e['target']}.{e['kind']}" for e in node["events"]):
            colour = _colour("backward" if event.endswith(".grad") else "forward")
            arrows.append(f'<path d="M{EVENT_X + 280},{event_y[event]} C{EVENT_X + 305},{event_y[event]} '
                          f'{STATEMENT_X - 25},{node_y[node["index"]]} {STATEMENT_X},{node_y[node["index"]]}" '
                          f'fill="none" stroke="{colour}" marker-end="url(#arrow)"/>')
    height = top + max(len(events), len(graph["nodes"]), 1) * row + 24
    legend = (_text(EVENT_X, 36, "events (forward, then gradients)", 11, "#4a5568")
              + _text(STATEMENT_X, 36, "statements (colour: when they ran; #: steps of the run)" if graph.get("runs")
                      else "statements, in the cell's order (arrows: what each waits for)", 11, "#4a5568"))
    head = ('<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" markerHeight="6" '
            'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#4a5568"/></marker></defs>')
    body = "".join([head, _text(EVENT_X, 18, title or "hook graph", 13, weight="bold"), legend,
                    *arrows, *event_parts, *statement_parts])
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" style="background:#fff">{body}</svg>')


class HookGraphPicture:
    """What `%%trace --graph` shows: the picture, with the text form beside it."""

    def __init__(self, graph: dict, text: str, title: str = ""):
        self.svg = hook_graph_svg(graph, title)
        self.text = text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"image/svg+xml": self.svg, "text/plain": self.text}
