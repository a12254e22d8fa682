"""The hook graph as a picture: the events statements wait for on the left, the statements on the right,
arrows for what each waits for (an event, or a name another statement binds), each backward pass as a
box around the statements that run inside it, and after a run the steps (#) coloured by phase.
Data in, SVG out; `hookgraph_layout` says where things go. Tall cells grow downwards (scroll, not shrink)."""
from __future__ import annotations

from html import escape

from .hookgraph_layout import (EVENT_H, EVENT_W, EVENT_X, LINE_H, STATEMENT_W, STATEMENT_X, TEXT_W, cache_boxes,
                               label_of, layout, run_lines, statement_lines, statement_runs)

# (row pitch, box height): a run's picture gives each statement a second line, what ran when
ONE_LINE, TWO_LINES = (34, 24), (46, 38)
FORWARD, BEFORE, NAME_ARROW = "#2b6cb0", "#718096", "#2f855a"
BACKWARD = ("#c05621", "#805ad5", "#b83280", "#975a16")      # pass 0, 1, 2, 3, then again
MAX_CHIPS = 6
NOTE_H = 18                                                   # a note's line under the title


def phase_colour(phase: str) -> str:
    if phase.startswith("backward pass "):
        return BACKWARD[int(phase.rsplit(" ", 1)[1]) % len(BACKWARD)]
    return FORWARD if phase == "forward" else BEFORE


def _text(x: int, y: int, content: str, size: int = 12, colour: str = "#1a202c", weight: str = "normal") -> str:
    return (f'<text x="{x}" y="{y}" font-family="monospace" font-size="{size}" fill="{colour}" '
            f'font-weight="{weight}">{escape(content)}</text>')


def _event_boxes(event_y: dict) -> list:
    parts = []
    for event, y in event_y.items():
        colour = phase_colour("backward pass 0" if event.endswith(".grad") else "forward")
        parts.append(f'<g class="nbg-event" data-event="{escape(event)}"><rect x="{EVENT_X}" y="{y}" '
                     f'width="{EVENT_W}" height="{EVENT_H}" rx="4" fill="#fff" stroke="{colour}"/>'
                     + _event_text(event, y + 16, colour) + "</g>")
    return parts


def _event_text(event: str, y: int, colour: str) -> str:
    """An event's name in its box, whole: a name longer than the box holds is drawn narrower to fit it
    (SVG's textLength), never cut."""
    room = EVENT_W - 16
    text = _text(EVENT_X + 8, y, event, colour=colour)
    if len(event) * TEXT_W <= room:
        return text
    return text.replace("<text ", f'<text textLength="{room}" lengthAdjust="spacingAndGlyphs" ', 1)


def _chips(ran: list, x: int, y: int) -> str:
    """The steps a statement ran at, as numbered chips in the colour of their phase."""
    parts = []
    for step, phase, _ in reversed(ran[-MAX_CHIPS:]):        # right to left: the last step rightmost
        width = 10 + 7 * len(str(step))
        x -= width + 4
        parts.append(f'<g class="nbg-step" data-step="{step}" data-phase="{escape(phase)}">'
                     f'<rect x="{x}" y="{y}" width="{width + 6}" height="16" rx="8" fill="{phase_colour(phase)}"/>'
                     + _text(x + 4, y + 12, f"#{step}", 11, "#fff", "bold") + "</g>")
    return "".join(parts)


def _statement_box(node: dict, y: int, box: int, ran: list, failed: bool) -> str:
    """A statement's box: its label wrapped over as many lines as it needs (never cut), then what ran when (as
    many lines again)."""
    lines, ran_lines = statement_lines(node, len(ran)), run_lines(ran, failed)
    box += LINE_H * (len(lines) - 1 + max(len(ran_lines) - 1, 0))
    stroke = "#c53030" if failed else "#4a5568"
    parts = [f'<g class="nbg-statement" data-node="{node["index"]}" data-line="{node["line"]}">',
             f'<rect x="{STATEMENT_X}" y="{y}" width="{STATEMENT_W}" height="{box}" rx="4" '
             f'fill="{"#fff5f5" if failed else "#f7fafc"}" stroke="{stroke}" stroke-width="{2 if failed else 1}"/>']
    if node.get("after") is not None:        # a statement that reads a cache starts once it is whole
        parts.append(f"<title>{escape(node.get('after_why', ''))}</title>")
    for number, line in enumerate(lines):
        parts.append(_text(STATEMENT_X + 8, y + 16 + LINE_H * number, line, weight="bold" if failed else "normal"))
    if ran:
        below = y + 31 + LINE_H * (len(lines) - 1)
        parts.append(f'<rect x="{STATEMENT_X}" y="{y}" width="5" height="{box}" fill="{phase_colour(ran[-1][1])}"/>')
        parts.extend(_text(STATEMENT_X + 8, below + LINE_H * number, line, 11, phase_colour(ran[-1][1]))
                     for number, line in enumerate(ran_lines))
        parts.append(_chips(ran, STATEMENT_X + STATEMENT_W - 4, y + 4))
    return "".join(parts) + "</g>"


def _group_box(group: dict, passes: dict) -> str:
    bw = passes[group["pass"]]
    colour = phase_colour(f"backward pass {group['pass']}")
    title = f"backward pass {group['pass']} · started by line {bw['line']}"
    whole = f"{title}: {' '.join(bw['source'].split())}"
    title = whole if len(whole) * 7 <= group["w"] - 16 else title     # the statement itself sits just above
    body = "" if group["members"] else _text(group["x"] + 14, group["y"] + 38, "(no statement waits for it)",
                                             11, "#4a5568")
    return (f'<g class="nbg-pass" data-pass="{group["pass"]}" data-start-line="{bw["line"]}" '
            f'data-members="{" ".join(map(str, group["members"]))}">'
            f'<rect x="{group["x"]}" y="{group["y"]}" width="{group["w"]}" height="{group["h"]}" rx="6" '
            f'fill="{colour}" fill-opacity="0.06" stroke="{colour}" stroke-dasharray="5 3"/>'
            + _text(group["x"] + 8, group["y"] + 16, title, 11, colour, "bold") + body + "</g>")


def _waits(graph: dict):
    """(event, node index) for each arrow: the events a statement waits for, and the cache it reads."""
    for node in graph["nodes"]:
        for event in dict.fromkeys(f"{e['target']}.{e['kind']}" for e in node["events"]):
            yield event, node["index"]
    for box, waiting in cache_boxes(graph).items():
        for index in waiting:
            yield box, index


def _event_arrows(graph: dict, event_y: dict, node_y: dict, box: int) -> list:
    arrows = []
    for event, index in _waits(graph):
        colour = phase_colour("backward pass 0" if event.endswith(".grad") else "forward")
        y1, y2 = event_y[event] + EVENT_H // 2, node_y[index] + box // 2
        arrows.append(f'<path class="nbg-wait" data-event="{escape(event)}" data-node="{index}" '
                      f'd="M{EVENT_X + EVENT_W},{y1} C{EVENT_X + EVENT_W + 25},{y1} '
                      f'{STATEMENT_X - 35},{y2} {STATEMENT_X - 8},{y2} H{STATEMENT_X}" fill="none" '
                      f'stroke="{colour}" marker-end="url(#arrow)"/>')
    return arrows


def _name_arrow(arrow: dict, node_y: dict, box: int) -> str:
    """Out of the right side of the statement that binds the names, into the one that reads them; the
    first arrow of a bus carries the label, just beside its source."""
    right = STATEMENT_X + STATEMENT_W
    y1, y2 = node_y[arrow["from"]] + box // 2 - 4, node_y[arrow["to"]] + box // 2 + 4
    label, below = label_of(arrow), y1 + 4 if y2 > y1 else y1 - 18
    tag = (f'<rect x="{arrow["x"] + 3}" y="{below}" width="{7 * len(label) + 4}" height="14" fill="#fff"/>'
           + _text(arrow["x"] + 5, below + 11, label, 11, NAME_ARROW, "bold")) if arrow["labelled"] else ""
    return (f'<g class="nbg-name-arrow" data-from="{arrow["from"]}" data-to="{arrow["to"]}" '
            f'data-names="{escape(" ".join(arrow["names"]))}">'
            f'<path d="M{right},{y1} H{arrow["x"]} V{y2} H{right + 2}" fill="none" stroke="{NAME_ARROW}" '
            f'stroke-width="1.5" marker-end="url(#name-arrow)"/>{tag}</g>')


LEGEND_ARROWS = ("arrows: event → the statement that waits for it · green: a name one statement binds and another "
                 "reads")
LEGEND_STEPS = "#n: the run's nth step · \"ran #1, #4\": the statement ran at steps 1 and 4"


def legend_right(graph: dict) -> int:
    """Where the legend's longest line ends (11 px monospace, 7 px a character): the picture is at least this wide,
    so no line of it is cut at the picture's edge."""
    steps = EVENT_X + sum(30 + 7 * len(phase) for phase in dict.fromkeys(run["phase"] for run in graph.get("runs", [])))
    return max(EVENT_X + 7 * len(LEGEND_ARROWS), steps + 7 * len(LEGEND_STEPS) if graph.get("runs") else 0) + 12


def _legend(graph: dict) -> str:
    """What the arrows and colours mean; after a run, one swatch per phase the run went through."""
    parts = [_text(EVENT_X, 36, LEGEND_ARROWS, 11, "#4a5568")]
    if not graph.get("runs"):
        parts.append(_text(EVENT_X, 54, "dashed box: a backward pass, around the statements that run inside it",
                           11, "#4a5568"))
    x = EVENT_X
    for phase in dict.fromkeys(run["phase"] for run in graph.get("runs", [])):
        parts.append(f'<g class="nbg-legend" data-phase="{escape(phase)}"><rect x="{x}" y="44" width="12" '
                     f'height="12" rx="3" fill="{phase_colour(phase)}"/>' + _text(x + 16, 54, phase, 11) + "</g>")
        x += 30 + 7 * len(phase)
    if graph.get("runs"):
        parts.append(_text(x, 54, LEGEND_STEPS, 11, "#4a5568"))
    return "".join(parts)


HEAD = ('<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" markerHeight="6" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#4a5568"/></marker>'
        '<marker id="name-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" markerHeight="6" '
        f'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="{NAME_ARROW}"/></marker></defs>')


def hook_graph_svg(graph: dict, title: str = "", note: str = "") -> str:
    """An SVG picture of a hook graph's dict form (`HookGraph.to_dict()`); a `note` (the cell was not run) on its
    own line under the title, where a long title cannot push it out of sight."""
    row, box = TWO_LINES if graph.get("runs") else ONE_LINE
    where = layout(graph, row, box)
    node_y, runs = where["node_y"], statement_runs(graph)
    passes = {p["index"]: p for p in graph.get("passes", [])}
    groups = [_group_box(group, passes) for group in where["groups"]]
    statements = [_statement_box(node, node_y[node["index"]], box, runs.get(node["index"], []),
                                 graph.get("failed") == node["index"]) for node in graph["nodes"]]
    below = NOTE_H if note else 0              # everything under the title moves down by the note's line
    body = "".join([HEAD, _text(EVENT_X, 18, title or "hook graph", 13, weight="bold"),
                    _text(EVENT_X, 34, note, 12, BACKWARD[0], "bold") if note else "",
                    f'<g transform="translate(0,{below})">', _legend(graph), *groups,
                    *_event_arrows(graph, where["event_y"], node_y, box), *_event_boxes(where["event_y"]),
                    *statements, *(_name_arrow(arrow, node_y, box) for arrow in where["arrows"]), "</g>"])
    # as wide as the title (13 px bold monospace, about 8 px a character), the note and the legend: none is cut off
    width = max(where["width"], EVENT_X + 8 * len(title or "hook graph") + 12, EVENT_X + 8 * len(note) + 12,
                legend_right(graph))
    height = where["height"] + below
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" style="background:#fff">{body}</svg>')


class HookGraphPicture:
    """What `%%trace --graph` shows: the picture, with the text form beside it."""

    def __init__(self, graph: dict, text: str, title: str = "", note: str = ""):
        self.svg = hook_graph_svg(graph, title, note)
        self.text = f"{note}\n{text}" if note else text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"image/svg+xml": self.svg, "text/plain": self.text}
