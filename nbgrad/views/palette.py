"""Colour maps and a minimal PNG writer: pictures without a plotting library in the hot path."""
from __future__ import annotations

import struct
import zlib

import numpy as np

# Diverging (signed data, centred on zero) and sequential anchors, interpolated to 256 entries.
_DIVERGING = [(33, 102, 172), (103, 169, 207), (209, 229, 240), (247, 247, 247),
              (253, 219, 199), (239, 138, 98), (178, 24, 43)]
_SEQUENTIAL = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]


def _interpolate(anchors) -> np.ndarray:
    anchors = np.array(anchors, dtype=np.float64)
    positions = np.linspace(0, 1, len(anchors))
    steps = np.linspace(0, 1, 256)
    return np.stack([np.interp(steps, positions, anchors[:, c]) for c in range(3)], axis=1).round().astype(np.uint8)


DIVERGING = _interpolate(_DIVERGING)
SEQUENTIAL = _interpolate(_SEQUENTIAL)


def palette(signed: bool) -> np.ndarray:
    return DIVERGING if signed else SEQUENTIAL


def png(rgb: np.ndarray) -> bytes:
    """Encode an H x W x 3 uint8 array as PNG."""
    height, width, _ = rgb.shape
    raw = b"".join(b"\x00" + row.tobytes() for row in np.ascontiguousarray(rgb, dtype=np.uint8))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def heatmap_png(levels: np.ndarray, signed: bool, width: int = 4, height: int | None = None) -> bytes:
    """uint8 levels (rows x cols) -> PNG, each cell `width` pixels wide and `height` (default: as wide) high."""
    rgb = palette(signed)[levels]
    return png(np.repeat(np.repeat(rgb, width if height is None else height, axis=0), width, axis=1))


def colour_bar_png(signed: bool, width: int = 120, height: int = 10) -> bytes:
    """The colour map from its low end (left) to its high end (right)."""
    levels = np.round(np.linspace(0, 255, width)).astype(np.uint8)
    return png(np.repeat(palette(signed)[levels][None], height, axis=0))


def histogram_png(counts, width: int = 240, height: int = 60) -> bytes:
    counts = np.asarray(counts, dtype=np.float64)
    image = np.full((height, width, 3), 255, dtype=np.uint8)
    if counts.size and counts.max() > 0:
        bar = width / counts.size
        for index, count in enumerate(counts):
            top = int(round(height * (1 - count / counts.max())))
            image[top:, int(index * bar):max(int(index * bar) + 1, int((index + 1) * bar) - 1)] = (70, 110, 180)
    return png(image)


# The HTML panels' text and edge colours: JupyterLab's theme variables, so they read in its dark theme as in its light
# one, each with the light value for a page that has none (another front end). A cell coloured by its data takes
# `ink` for its text: black or white, whichever stands out more from the cell's own colour.
TEXT, TEXT2 = "var(--jp-ui-font-color1, #333)", "var(--jp-ui-font-color2, #666)"
EDGE, BAD = "var(--jp-border-color2, #ddd)", "var(--jp-error-color1, #b00020)"


def ink(rgb) -> str:
    """#000 on a light colour, #fff on a dark one (the WCAG contrast of the two, compared)."""
    lum = sum(w * ((c / 255) / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4)
              for w, c in zip((0.2126, 0.7152, 0.0722), rgb))
    return "#000" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#fff"


def diverging_rgb(values, bound: float | None = None) -> list:
    """(r, g, b) per value on the diverging map, centred on zero: ±bound are the ends (default max |value|)."""
    values = np.nan_to_num(np.asarray(values, dtype=np.float64).reshape(-1), nan=0.0)
    bound = bound or float(np.abs(values).max(initial=0.0)) or 1.0
    levels = np.clip(np.round((values / bound + 1) / 2 * 255), 0, 255).astype(int)
    return [tuple(int(c) for c in DIVERGING[level]) for level in levels]
