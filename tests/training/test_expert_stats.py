"""Expert balance scalars against hand computation, and the heatmap figure."""

import math

import pytest
import torch

from lumina.training.expert_stats import draw_heatmap, load_stats


def test_load_stats_hand_values():
    load = torch.tensor([[1, 1, 2, 0], [3, 3, 3, 3], [0, 0, 0, 0]])
    stats = load_stats(load)
    # layer 0: mean 1, max 2, population std sqrt((0 + 0 + 1 + 1) / 4); one dead expert
    assert stats["max_over_mean"].tolist() == pytest.approx([2.0, 1.0, 0.0])
    assert stats["cv"].tolist() == pytest.approx([math.sqrt(0.5), 0.0, 0.0])
    assert stats["dead"].tolist() == [1.0, 0.0, 4.0]


def test_load_stats_rejects_a_vector():
    with pytest.raises(ValueError, match=r"\[L, E\]"):
        load_stats(torch.ones(4))


def test_heatmap_rows_are_layers_labelled_from_the_first_moe_layer():
    fig = draw_heatmap(torch.tensor([[4, 0, 0, 0], [1, 1, 1, 1]]), first_layer=1)
    ax = fig.axes[0]
    shown = ax.images[0].get_array()
    assert shown.shape == (2, 4)
    assert shown[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert shown[1].tolist() == [0.25] * 4
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2"]
