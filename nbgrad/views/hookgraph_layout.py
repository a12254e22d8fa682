"""Where the hook graph's picture puts things: events in a column on the left, statements on the right,
each backward pass as a box around the statements that run inside it (placed right after the line that
starts it), and the names statements pass to each other as arrows in lanes right of the statements.
Pure data (coordinates), so a test can check that nothing overlaps; `hookgraph` draws it."""
from __future__ import annotations

import textwrap

from .tokens import shorten

EVENT_X, EVENT_W, EVENT_H = 12, 280, 24
STATEMENT_X, STATEMENT_W = 330, 470
GROUP_HEAD, GROUP_PAD, GAP = 24, 8, 10
CHAR_W = 7                                  # monospace 11-12 px: width of one character, for lanes
TOP = 64                                    # below the title and the legend
TEXT_W = 7.3                                # monospace 12 px (a statement's text): width of one character
LINE_H = 14                                 # a statement's wrapped lines, one below the other
CHIP_W = 44                                 # room a step chip takes at the right of a statement's first line


WAITS_FOR_CACHE = {"forward": "[after the forward pass] ", "pass": "[after its pass] "}


def lane_of(node: dict) -> str:
    """What a statement's label starts with: its invoke, and the cache it waits to be whole."""
    lane = f"[invoke {node['invoke']}] " if node.get("invoke") is not None else ""
    return lane + (WAITS_FOR_CACHE[node["after"]] if node.get("after") is not None else "")


def statement_lines(node: dict, ran: int) -> list:
    """A statement's label (`line N: source`) wrapped to its box, never cut: the first line leaves room for
    the step chips of a run (`ran`: how many), the others take the whole width."""
    source = node["source"].splitlines()[0] if node["source"] else ""
    label = f"{lane_of(node)}line {node['line']}: {source.strip()}"
    room = int((STATEMENT_W - 16) // TEXT_W)
    first = room - int(CHIP_W * min(ran, 6) // TEXT_W)
    lines = textwrap.wrap(label, first, break_long_words=True, break_on_hyphens=False) or [label]
    rest = " ".join(lines[1:])
    return lines[:1] + textwrap.wrap(rest, room, break_long_words=True, break_on_hyphens=False)


def statement_runs(graph: dict) -> dict:
    """node index -> [(step, phase, woken by)] in run order; steps count from 1 over the whole run."""
    runs: dict = {}
    for step, run in enumerate(graph.get("runs", []), start=1):
        runs.setdefault(run["node"], []).append((step, run["phase"], run["woke_by"]))
    return runs


def run_lines(ran: list, failed: bool) -> list:
    """`ran #2, #7 · backward pass 0 · by hs.grad` (when the statement ran, and what woke it last), wrapped to
    the statement's box (11 px text), never cut; none for a statement that did not run."""
    if not ran:
        return []
    _, phase, woke_by = ran[-1]
    steps = ", ".join(f"#{step}" for step, _, _ in ran)
    label = f"{'failed' if failed else 'ran'} {steps} · {phase}" + (f" · by {woke_by}" if woke_by else "")
    return textwrap.wrap(label, int((STATEMENT_W - 16) // CHAR_W), break_long_words=True, break_on_hyphens=False)


def extra_heights(graph: dict) -> dict:
    """node index -> the pixels its wrapped label and its wrapped run line add below one line of each."""
    runs, extra = statement_runs(graph), {}
    for node in graph["nodes"]:
        ran = runs.get(node["index"], [])
        ran_lines = run_lines(ran, graph.get("failed") == node["index"])
        extra[node["index"]] = LINE_H * (len(statement_lines(node, len(ran))) - 1 + max(len(ran_lines) - 1, 0))
    return extra


def pass_members(graph: dict) -> dict:
    """pass index -> node indices that run inside it: a `with` block's body, and the statements a pass
    wakes (from the run when there was one, else a `.grad` read outside every block joins the first pass
    whose line follows it)."""
    members: dict = {p["index"]: [] for p in graph.get("passes", [])}
    ran_in = {}
    for run in graph.get("runs", []):
        if run["phase"].startswith("backward pass "):
            ran_in.setdefault(run["node"], int(run["phase"].rsplit(" ", 1)[1]))
    passes = sorted(graph.get("passes", []), key=lambda p: p["line"])
    for node in graph["nodes"]:
        index = node["index"]
        if node.get("block") is not None:
            where = node["block"]
        elif graph.get("runs"):
            where = ran_in.get(index)
        elif any(e["kind"] == "grad" for e in node["events"]) and passes:
            later = [p for p in passes if p["line"] > node["line"]]
            where = later[0]["index"] if later else None
        else:
            where = None
        if where in members:
            members[where].append(index)
    return members


def pass_starters(graph: dict) -> dict:
    """pass index -> the node whose line starts it (the `with` line or the `.backward()` statement)."""
    by_line = {node["line"]: node["index"] for node in graph["nodes"]}
    return {p["index"]: by_line.get(p["line"]) for p in graph.get("passes", [])}


def row_order(graph: dict) -> list:
    """[("node", index) | ("pass", index)] top to bottom: the cell's order, with each pass's statements
    moved into its group right after the statement that starts it."""
    members, starters = pass_members(graph), pass_starters(graph)
    inside = {index for group in members.values() for index in group}
    order, placed = [], set()
    for node in graph["nodes"]:
        if node["index"] in inside:
            continue
        order.append(("node", node["index"]))
        for k, starter in starters.items():
            if starter == node["index"]:
                order.append(("pass", k))
                placed.add(k)
    order.extend(("pass", k) for k in members if k not in placed)       # a pass no statement starts
    return order


def place_rows(graph: dict, row: int, box: int) -> tuple:
    """(node index -> y of its box's top, [pass group boxes], bottom): statements one row each, a pass's
    group a titled box around its statements (an empty one says so)."""
    members, extra = pass_members(graph), extra_heights(graph)
    node_y, groups, y = {}, [], TOP
    for kind, index in row_order(graph):
        if kind == "node":
            node_y[index] = y
            y += row + extra[index]
            continue
        top = y
        y += GROUP_HEAD
        for member in members[index] or [None]:
            if member is not None:
                node_y[member] = y
            y += row + extra[member] if member is not None else 20
        groups.append({"pass": index, "members": members[index], "x": STATEMENT_X - GROUP_PAD, "y": top,
                       "w": STATEMENT_W + 2 * GROUP_PAD, "h": y - top - (row - box) + GROUP_PAD})
        y += GROUP_PAD + GAP
    return node_y, groups, y


def name_arrows(graph: dict) -> list:
    """[{from, to, names}]: one per dependency, labelled with the names the earlier statement binds and
    the later one reads (`order` where it waits for no name of it, e.g. an edit in place)."""
    nodes = {node["index"]: node for node in graph["nodes"]}
    arrows = []
    for node in graph["nodes"]:
        for dep in node.get("deps", []):
            shared = sorted(set(nodes[dep].get("binds", [])) & set(node.get("reads", [])))
            arrows.append({"from": dep, "to": node["index"], "names": shared or ["order"]})
    return arrows


def assign_lanes(arrows: list, node_y: dict) -> int:
    """Give each arrow a lane (a column right of the statements). The arrows that carry the same names
    out of one statement share a lane (a bus, labelled once, near its source); no other bus's span may
    cross it. Short buses get the inner lanes. Returns how many lanes."""
    buses: dict = {}
    for arrow in arrows:
        buses.setdefault((arrow["from"], tuple(arrow["names"])), []).append(arrow)
    lanes: list = []                               # per lane: the spans (top, bottom) it holds
    spans = {key: (min(node_y[key[0]], *(node_y[a["to"]] for a in bus)),
                   max(node_y[key[0]], *(node_y[a["to"]] for a in bus))) for key, bus in buses.items()}
    for key in sorted(buses, key=lambda k: spans[k][1] - spans[k][0]):
        top, bottom = spans[key]
        for lane, held in enumerate(lanes):
            if all(bottom < t or top > b for t, b in held):
                break
        else:
            lane, held = len(lanes), []
            lanes.append(held)
        held.append((top, bottom))
        for number, arrow in enumerate(buses[key]):
            arrow["lane"], arrow["labelled"] = lane, number == 0
    return len(lanes)


def lane_widths(arrows: list, count: int) -> list:
    """Each lane as wide as its longest label, so labels of neighbouring lanes never overlap."""
    widths = [24] * count
    for arrow in arrows:
        widths[arrow["lane"]] = max(widths[arrow["lane"]], 14 + CHAR_W * len(label_of(arrow)))
    return widths


def label_of(arrow: dict) -> str:
    label = ", ".join(arrow["names"])
    return shorten(label, 18)


def layout(graph: dict, row: int, box: int) -> dict:
    """Everything's place: statement boxes, pass groups, name arrows with their lane x, the size."""
    node_y, groups, bottom = place_rows(graph, row, box)
    arrows = name_arrows(graph)
    widths = lane_widths(arrows, assign_lanes(arrows, node_y))
    right = STATEMENT_X + STATEMENT_W + GROUP_PAD + 6
    starts = [right + sum(widths[:lane]) for lane in range(len(widths))]
    for arrow in arrows:
        arrow["x"] = starts[arrow["lane"]] + 8
    width = max(900, right + sum(widths) + 12)
    event_y = {event: TOP + index * (EVENT_H + GAP) for index, event in enumerate(events(graph))}
    event_bottom = TOP + len(event_y) * (EVENT_H + GAP)
    return {"node_y": node_y, "event_y": event_y, "groups": groups, "arrows": arrows, "width": width,
            "height": max(bottom, event_bottom) + 16}


def cache_boxes(graph: dict) -> dict:
    """label -> the statements that wait for it, for each `cache(...)` of the cell: its hooks on every module
    it matches fill it, and a statement that reads the name it is bound to starts once it is whole."""
    boxes = {}
    for line in dict.fromkeys(graph.get("caches", [])):
        names = sorted({name for node in graph["nodes"] if node["line"] == line for name in node["binds"]})
        waiting = [node["index"] for node in graph["nodes"]
                   if node.get("after") is not None and set(names) & set(node.get("reads", []))]
        boxes[shorten(f"cache {', '.join(names)} (line {line}): every module", 38)] = waiting
    return boxes


def events(graph: dict) -> list:
    """Event names, forward ones first (a cache's hooks before all), each lane in the order the run woke
    statements with them (source order before a run)."""
    order = [run["woke_by"] for run in graph.get("runs", []) if run["woke_by"]]
    written = [f"{e['target']}.{e['kind']}" for node in graph["nodes"] for e in node["events"]]
    names = list(dict.fromkeys([*cache_boxes(graph), *order, *written]))
    return sorted(names, key=lambda name: name.endswith(".grad"))     # stable: the backward lane below
