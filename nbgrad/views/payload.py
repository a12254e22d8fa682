"""What a panel shows, computed in the kernel and bounded: stats over the whole tensor, pictures from
a sample. Everything here is plain JSON; labels are data, rendered as text by every front end."""
from __future__ import annotations

import base64
import itertools
import math

import numpy as np
import torch

from .palette import palette

MAX_BYTES = 256 * 1024          # per tensor, whatever its size
MAX_ROWS, MAX_COLS = 64, 256    # a heatmap slice is sampled down to this
MAX_SLICES = 32
HIST_BINS = 40
HIST_SAMPLE = 1_000_000
TOP_K, MAX_POSITIONS = 5, 64


def _float(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def summary(tensor: torch.Tensor) -> dict:
    data = tensor.detach()
    info = {"shape": list(data.shape), "dtype": str(data.dtype).replace("torch.", ""), "device": str(data.device),
            "requires_grad": bool(tensor.requires_grad),
            "grad_fn": type(tensor.grad_fn).__name__ if tensor.grad_fn is not None else None,
            "numel": data.numel()}
    if data.numel() == 0 or data.is_complex() or data.dtype == torch.bool or data.is_meta:
        return info
    values = data.double() if data.is_floating_point() else data.to(torch.float64)
    finite = torch.isfinite(values)
    info["nan"] = int(torch.isnan(values).sum())
    info["inf"] = int(torch.isinf(values).sum())
    clean = values[finite] if info["nan"] or info["inf"] else values.reshape(-1)
    if clean.numel():
        info.update(min=_float(clean.min()), max=_float(clean.max()), mean=_float(clean.mean()),
                    std=_float(clean.std()) if clean.numel() > 1 else 0.0, norm=_float(clean.norm()))
    return info


def _sample_indices(size: int, limit: int) -> list:
    if size <= limit:
        return list(range(size))
    return sorted(set(np.linspace(0, size - 1, limit).round().astype(int).tolist()))


def _colour_range(whole: torch.Tensor, signed: bool) -> tuple:
    """(low, high) of the colours: over the whole 2-D slice, not only its sampled cells, so the colour bar's
    ends are the slice's true extremes (±max |value| when signed)."""
    values = torch.nan_to_num(whole.double(), nan=0.0, posinf=0.0, neginf=0.0)
    if signed:
        bound = float(values.abs().max()) or 1.0
        return -bound, bound
    low, high = float(values.min()), float(values.max())
    return (low, low + 1.0) if high == low else (low, high)


def _quantize(block: torch.Tensor, low: float, high: float) -> tuple:
    values = torch.nan_to_num(block.double(), nan=0.0, posinf=0.0, neginf=0.0)
    levels = ((values - low) / (high - low) * 255).round().clamp(0, 255).to(torch.uint8).numpy()
    return levels, low, high


def heatmap(tensor: torch.Tensor, token_axis: int | None, tokens: list | None, signed: bool) -> dict | None:
    """Sampled 2-D slices of the last two axes, one per slider position; `signed` picks the diverging map."""
    data = tensor.detach()
    if data.dim() == 0 or data.numel() == 0 or data.is_complex() or data.dtype == torch.bool:
        return None
    if data.dim() == 1:
        data = data.unsqueeze(0)
        token_axis = None if token_axis is None else 1
    data = data.cpu()
    row_axis, col_axis = data.dim() - 2, data.dim() - 1
    rows = _sample_indices(data.shape[row_axis], MAX_ROWS)
    cols = _sample_indices(data.shape[col_axis], MAX_COLS)
    slice_bytes = math.ceil(len(rows) * len(cols) / 3) * 4 + 64
    slice_budget = max(1, min(MAX_SLICES, (MAX_BYTES - 48 * 1024) // slice_bytes))
    slider_axes = [axis for axis in range(data.dim() - 2)]
    per_axis = max(1, int(slice_budget ** (1 / len(slider_axes)))) if slider_axes else 1
    sliders = [{"axis": axis, "size": data.shape[axis], "indices": _sample_indices(data.shape[axis], per_axis)}
               for axis in slider_axes]
    row_index, col_index = torch.tensor(rows), torch.tensor(cols)
    slices = []
    for key in itertools.product(*[s["indices"] for s in sliders]):
        whole = data[key] if key else data
        low, high = _colour_range(whole, signed)
        levels, low, high = _quantize(whole.index_select(0, row_index).index_select(1, col_index), low, high)
        slices.append({"key": list(key), "lo": low, "hi": high,
                       "data": base64.b64encode(levels.tobytes()).decode("ascii")})
    shown_rows = [tokens[i] if tokens and token_axis == row_axis and i < len(tokens) else str(i) for i in rows]
    notes = []
    if len(rows) < data.shape[row_axis] or len(cols) < data.shape[col_axis]:
        notes.append(f"sampled: {len(rows)} of {data.shape[row_axis]} rows, {len(cols)} of {data.shape[col_axis]} "
                     f"columns (evenly spaced)")
    for slider in sliders:
        if len(slider["indices"]) < slider["size"]:
            notes.append(f"axis {slider['axis']}: {len(slider['indices'])} of {slider['size']} slices")
    token_rows = bool(tokens and token_axis == row_axis)
    return {"row_axis": row_axis, "col_axis": col_axis, "rows": rows, "cols": cols, "row_labels": shown_rows,
            "token_rows": token_rows, "sliders": sliders, "slices": slices, "signed": signed, "notes": notes,
            "axes": axes_caption(tuple(tensor.shape), token_rows)}


def axes_caption(shape: tuple, token_rows: bool) -> str:
    """What a heatmap's rows and columns are, under the picture: `rows ↓ axis 1: tokens 0–16 · columns → axis 2:
    0–127` (the last two axes of `shape`; a 1-D tensor is one row)."""
    last = len(shape) - 1
    columns = f"columns → axis {last}: {_span(shape[last])}"
    if len(shape) == 1:
        return f"one row · {columns}"
    return f"rows ↓ axis {last - 1}: {'tokens ' if token_rows else ''}{_span(shape[last - 1])} · {columns}"


def _span(size: int) -> str:
    return "0" if size == 1 else f"0–{size - 1}"


def histogram(tensor: torch.Tensor) -> dict | None:
    data = tensor.detach().reshape(-1)
    if data.numel() == 0 or data.is_complex() or data.dtype == torch.bool:
        return None
    sampled = None
    if data.numel() > HIST_SAMPLE:
        step = math.ceil(data.numel() / HIST_SAMPLE)
        data, sampled = data[::step], math.ceil(tensor.numel() / step)
    data = data.double()
    data = data[torch.isfinite(data)]
    if data.numel() == 0:
        return None
    low, high = float(data.min()), float(data.max())
    if high == low:
        high = low + 1e-12
    counts = torch.histc(data, bins=HIST_BINS, min=low, max=high)
    return {"lo": low, "hi": high, "counts": counts.int().tolist(), "sampled": sampled}


def top_tokens(tensor: torch.Tensor, tokenizer, tokens: list | None) -> dict | None:
    """For [..., vocab] logits: the top-k next tokens with probabilities at each position."""
    vocab = len(tokenizer) if tokenizer is not None else None
    if vocab is None or tensor.dim() < 2 or tensor.shape[-1] < vocab or not tensor.is_floating_point():
        return None
    rows = tensor.detach().reshape(-1, tensor.shape[-2], tensor.shape[-1])[0]
    positions = list(range(rows.shape[0]))[-MAX_POSITIONS:]
    probs = torch.softmax(rows[positions].double(), dim=-1)
    values, indices = probs.topk(TOP_K, dim=-1)
    return {"positions": [tokens[p] if tokens and p < len(tokens) else str(p) for p in positions],
            "tokens": [[tokenizer.decode([int(i)]) for i in row] for row in indices],
            "probs": [[_probability(v) for v in row] for row in values]}


def _probability(value) -> float | None:
    """Rounded for the payload; NaN logits give NaN probabilities, written as null (JSON has no NaN)."""
    value = _float(value)
    return None if value is None else round(value, 4)


def tensor_item(name: str, tensor: torch.Tensor, *, kind: str = "activation", partner: str | None = None,
                tokens: list | None = None, tokenizer=None, note: str | None = None) -> dict:
    token_axis = None
    if tokens:
        token_axis = next((axis for axis in range(1, tensor.dim()) if tensor.shape[axis] == len(tokens)), None)
        if token_axis is None and tensor.dim() >= 1 and tensor.shape[0] == len(tokens):
            token_axis = 0
    stats = summary(tensor)
    if tensor.is_meta:          # a shape and a dtype, no values: nothing to draw
        meta = "on the meta device: a shape without values (a model made without its weights)"
        return {"name": name, "kind": kind, "partner": partner, "note": f"{note}; {meta}" if note else meta,
                "summary": stats, "heatmap": None, "histogram": None, "topk": None}
    signed = stats.get("min") is not None and stats["min"] < 0 < stats["max"]   # finite values, whole tensor
    item = {"name": name, "kind": kind, "partner": partner, "note": note, "summary": stats,
            "heatmap": heatmap(tensor, token_axis, tokens, signed), "histogram": histogram(tensor),
            "topk": top_tokens(tensor, tokenizer, tokens)}
    return item


def value_item(name: str, value) -> dict:
    text = repr(value)
    return {"name": name, "kind": "value", "value": text if len(text) < 2000 else text[:2000] + " …"}


def palettes() -> dict:
    return {"diverging": palette(True).tolist(), "sequential": palette(False).tolist()}
