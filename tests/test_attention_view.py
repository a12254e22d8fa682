"""The attention panel: one heatmap per head, tokens as labels, bounded, with HTML, PNG and text."""
import pytest
import torch

import nbgrad


def test_one_heatmap_per_head_with_the_tokens():
    pattern = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    view = nbgrad.attention_pattern(pattern, tokens=["The", " cat", " sat", " on", "$x"], batch=1)
    assert torch.equal(view.grid, pattern[1])
    assert view.tokens == ["The", " cat", " sat", " on", "$x"] and not view.signed
    png = view._repr_png_()
    assert png.startswith(b"\x89PNG")
    assert view._repr_html_().startswith('<div class="nbgrad-attention"><img')
    assert "3 heads x 5 queries x 5 keys" in repr(view)


def test_signed_values_and_bounds():
    scores = torch.randn(1, 20, 50, 50)
    view = nbgrad.attention_pattern(scores)
    assert view.signed and view.grid.shape == (16, 40, 40) and view.heads == 20
    assert view.tokens == [str(i) for i in range(10, 50)]
    assert torch.equal(view.grid, scores[0, :16, -40:, -40:])
    with pytest.raises(ValueError, match=r"\[batch, heads, query, key\]"):
        nbgrad.attention_pattern(torch.ones(4, 4))
