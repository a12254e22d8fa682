"""The data a hook graph picture carries: its parts by class, their data- attributes, their boxes."""
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"


def groups(svg: str, kind: str) -> list:
    """The <g class=kind> elements of the picture, in drawing order."""
    return [g for g in ET.fromstring(svg).iter(f"{SVG}g") if g.get("class") == kind]


def name_arrows(svg: str) -> dict:
    """(from node, to node) -> the names the arrow is labelled with."""
    return {(int(g.get("data-from")), int(g.get("data-to"))): g.get("data-names") for g in groups(svg, "nbg-name-arrow")}


def waits(svg: str) -> set:
    """(event, node index) of each arrow from an event's box (on the left) to a statement that waits for it."""
    return {(p.get("data-event"), int(p.get("data-node")))
            for p in ET.fromstring(svg).iter(f"{SVG}path") if p.get("class") == "nbg-wait"}


def steps(svg: str) -> dict:
    """step number -> (node index, phase), from the numbered chips inside each statement's box."""
    found = {}
    for statement in groups(svg, "nbg-statement"):
        for chip in statement.iter(f"{SVG}g"):
            if chip.get("class") == "nbg-step":
                found[int(chip.get("data-step"))] = (int(statement.get("data-node")), chip.get("data-phase"))
    return found


def box(group) -> tuple:
    """(left, top, right, bottom) of a part's first rectangle."""
    rect = group.find(f"{SVG}rect")
    x, y, w, h = (float(rect.get(k)) for k in ("x", "y", "width", "height"))
    return x, y, x + w, y + h


def overlap(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
