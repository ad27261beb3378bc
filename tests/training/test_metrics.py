"""Token accuracies: micro-averaged over tokens, one per codebook."""

import pytest
import torch

from lumina.training.metrics import TokenAccuracies


def test_accuracies_count_tokens_across_updates():
    acc = TokenAccuracies(vocab_size=10, codebook_size=5, num_codebooks=2)
    acc.update(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 0]),
               torch.tensor([[0, 1], [2, 2]]), torch.tensor([[0, 0], [2, 2]]))
    acc.update(torch.tensor([4]), torch.tensor([5]), torch.zeros(0, 2, dtype=torch.long),
               torch.zeros(0, 2, dtype=torch.long))
    out = acc.compute()
    # text: 2 right of 4 tokens (micro), not a mean over classes
    assert out["text_acc"].item() == pytest.approx(0.5)
    assert out["image_acc/cb0"].item() == pytest.approx(1.0)
    assert out["image_acc/cb1"].item() == pytest.approx(0.5)
    acc.reset()
    acc.update(torch.tensor([7]), torch.tensor([7]), torch.tensor([[1, 1]]), torch.tensor([[0, 1]]))
    out = acc.compute()
    assert out["text_acc"].item() == 1.0 and out["image_acc/cb0"].item() == 0.0
