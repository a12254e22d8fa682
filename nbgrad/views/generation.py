"""The panel of a generation: the prompt and its continuation, the top next tokens at every step, and
each saved name's values behind a step slider. Takes what the caller passes (token ids, per-step top
tokens, per-step values, a tokenizer); nothing of the engine."""
from __future__ import annotations

from .panel import MAX_ITEMS, Panel, items_for, static_html, text_summary
from .static import topk_table

MAX_STEPS = 64        # per saved name; a longer generation shows its first steps (and says so)
MAX_ROWS = 8          # prompts of a batch whose text is shown


class GenerationPanel(Panel):
    """A Panel whose static forms show the generated text and the top next tokens, and then each saved
    name at its first and last step."""

    def static_html(self) -> str:
        return _static_page(self.payload)

    def __repr__(self):
        return text_summary(dict(self.payload, items=_static_items(self.items))) + _topk_text(self.items[0])


def generation_panel(prompt_ids, output_ids, top_next: list, saved: dict, tokenizer=None,
                     title: str = "") -> GenerationPanel:
    """`prompt_ids` / `output_ids`: [rows, length] token ids (the output with the prompt); `top_next`: per
    step (ids, probs) of the most likely next tokens, or None; `saved`: name -> list of values by step."""
    decode = _decoder(tokenizer)
    items = [_text_item(prompt_ids, output_ids, top_next, decode, _pad_id(tokenizer))]
    notes = []
    for name, by_step in list(saved.items())[:MAX_ITEMS]:
        shown = by_step[:MAX_STEPS]
        steps = [[] if value is None else items_for(name, value, tokenizer=tokenizer) for value in shown]
        items.append({"name": name, "kind": "steps", "steps": steps, "note": None})
        if len(by_step) > len(shown):
            notes.append(f"{name}: showing steps 0–{len(shown) - 1} of {len(by_step)}")
    if len(saved) > MAX_ITEMS:
        notes.append(f"showing {MAX_ITEMS} of {len(saved)} saved names")
    return GenerationPanel(items, title=title, notes=notes)


def _decoder(tokenizer):
    if tokenizer is None:
        return lambda ids: " ".join(f"<{int(i)}>" for i in ids)
    return lambda ids: tokenizer.decode([int(i) for i in ids])


def _pad_id(tokenizer):
    """The id prompts of a batch are padded with (the end-of-text token where the tokenizer has no pad)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else getattr(tokenizer, "eos_token_id", None)


def _unpadded(prompt, pad) -> list:
    """A batch row's prompt without the padding on its left."""
    ids = [int(i) for i in prompt]
    start = 0
    while pad is not None and start < len(ids) and ids[start] == pad:
        start += 1
    return ids[start:]


def _text_item(prompt_ids, output_ids, top_next: list, decode, pad=None) -> dict:
    """The prompt and continuation of each row, and the table of top next tokens (row 0) by step."""
    lines = []
    start = 0 if prompt_ids is None else prompt_ids.shape[-1]
    rows = [] if output_ids is None else output_ids.reshape(-1, output_ids.shape[-1])
    for index, row in enumerate(rows[:MAX_ROWS]):
        prefix = f"row {index} " if len(rows) > 1 else ""
        prompt = _unpadded(row[:start], pad) if len(rows) > 1 else row[:start]
        lines.append(f"{prefix}prompt:       {decode(prompt)!r}")
        lines.append(f"{prefix}continuation: {decode(row[start:])!r}")
    if len(rows) > MAX_ROWS:
        lines.append(f"(showing {MAX_ROWS} of {len(rows)} rows)")
    chosen = rows[0][start:] if len(rows) else []
    positions, tokens, probs = [], [], []
    for step, top in enumerate(top_next):
        if top is None:
            continue
        ids, values = top
        picked = f" → {decode([chosen[step]])!r}" if step < len(chosen) else ""
        positions.append(f"step {step}{picked}")
        tokens.append([decode([i]) for i in ids[0]])
        probs.append([round(float(p), 4) for p in values[0]])
    topk = {"positions": positions, "tokens": tokens, "probs": probs} if positions else None
    note = "top next tokens of row 0" if len(rows) > 1 and topk else None
    return {"name": "generation", "kind": "value", "value": "\n".join(lines), "topk": topk, "note": note}


def _static_items(items: list) -> list:
    """Plain items for the static forms: each saved name at its first and last step."""
    flat = [dict(items[0], topk=None)]
    for item in items[1:]:
        filled = [index for index, step in enumerate(item["steps"]) if step]
        for index in dict.fromkeys(filled[:1] + filled[-1:]):
            for sub in item["steps"][index]:
                flat.append(dict(sub, name=f"{sub['name']} · step {index} of {len(item['steps'])}"))
    return flat


def _static_page(payload: dict) -> str:
    """Static HTML: the generated text and the top-token table, then the plain items."""
    flat = _static_items(payload["items"])
    head = static_html(dict(payload, items=flat[:1]))
    rest = static_html(dict(payload, title="", notes=[], items=flat[1:])) if len(flat) > 1 else ""
    topk = payload["items"][0].get("topk")
    if not topk:
        return head + rest
    return f'{head}{topk_table(topk, "step", "nbgrad-generation-topk")}{rest}'


def _topk_text(item: dict) -> str:
    topk = item.get("topk")
    if not topk:
        return ""
    return "".join(f"\n  {position}: " + ", ".join(f"{token!r} {p * 100:.1f}%" for token, p in zip(tokens, probs))
                   for position, tokens, probs in zip(topk["positions"], topk["tokens"], topk["probs"]))
