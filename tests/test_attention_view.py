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


def _drawn(view):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    figure = view.figure()
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return figure, canvas.get_renderer()


def test_axes_are_titled_query_and_key_and_token_labels_do_not_overlap():
    tokens = ["The", " Eiffel", " Tower", " is", " in", " the", " city", " of", " ", "  "]
    view = nbgrad.attention_pattern(torch.softmax(torch.randn(1, 4, 10, 10), -1), tokens)
    figure, renderer = _drawn(view)
    heads = [ax for ax in figure.axes if ax.get_title().startswith("head")]
    assert len(heads) == 4 and all(ax.get_xlabel() == "key" for ax in heads)
    assert heads[0].get_ylabel() == "query"
    for ax in heads:
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        assert [t.get_text() for t in labels][-2:] == ["␣", "␣␣"]
        assert all(t.get_fontsize() >= 8 for t in labels)
        boxes = [t.get_window_extent(renderer) for t in labels]
        assert all(a.x1 <= b.x0 + 0.5 for a, b in zip(boxes, boxes[1:]))          # side by side, none overlapping


def test_an_attribution_is_diverging_around_zero_clipped_at_a_high_percentile():
    from nbgrad.views.attention import CLIP_PERCENTILE
    torch.manual_seed(0)
    scores = torch.randn(1, 2, 8, 8) * 0.01
    scores[0, 0, 7, 0] = 1.72                 # one large cell: unclipped, every other cell would be white
    view = nbgrad.attention_pattern(scores)
    low, high, clipped = view.colour_range()
    magnitudes = scores.abs().flatten()
    expected = float(torch.quantile(magnitudes[magnitudes > 0].double(), CLIP_PERCENTILE / 100))
    assert low == -high and abs(high - expected) < 1e-9 and high < 0.1
    assert clipped == int((magnitudes > high).sum()) >= 1
    figure, _ = _drawn(view)
    image = figure.axes[0].images[0]
    assert image.get_clim() == (low, high)
    assert "98th percentile of |value|" in figure.get_supxlabel()
    pattern = nbgrad.attention_pattern(torch.softmax(torch.randn(1, 2, 4, 4), -1))
    assert pattern.colour_range()[0] == 0.0 and pattern.colour_range()[2] == 0
