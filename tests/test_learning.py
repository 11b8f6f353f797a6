"""A tiny model must really learn: reverse random token strings, 100 % exact match (greedy).

The toy task and the demo that runs it are examples (examples/toy.py, examples/demo.py).
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import demo  # noqa: E402
from toy import PAD, reverse_batch, train_reverse  # noqa: E402


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


def test_the_demo_saves_reloads_and_generates(tmp_path, capsys):
    summary = demo.main(["--output-dir", str(tmp_path / "demo"), "--steps", "30", "--json"])
    printed = capsys.readouterr().out
    assert "saved to" in printed and printed.count(" -> ") == 3 and f'"steps": {summary["steps"]}' in printed
    assert (tmp_path / "demo" / "modeling_vanilla_transformer.py").is_file()
