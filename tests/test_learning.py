"""A tiny model must really learn: reverse random token strings, 100 % exact match (greedy)."""

import torch

from vanilla_transformer.toy import PAD, reverse_batch, train_reverse


def test_reverse_batches_are_what_they_claim():
    input_ids, mask, labels = reverse_batch(8, 16, 3, 7, torch.Generator().manual_seed(0))
    for row, row_mask, row_labels in zip(input_ids, mask, labels):
        n = int(row_mask.sum())
        assert torch.equal(row_labels[: n - 1], row[: n - 1].flip(0))
        assert (row[n:] == PAD).all() and (row_labels[n:] == -100).all()


def test_tiny_model_learns_to_reverse_strings_within_a_minute():
    model, summary = train_reverse()
    print(f"reverse task: {summary}")
    assert summary["exact_match"] == 1.0
