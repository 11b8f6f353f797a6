"""Shared helpers for the test suite: tiny configurations and random batches."""

import pytest
import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

PAD, BOS, EOS = 0, 1, 2


def tiny_config(**overrides) -> VanillaTransformerConfig:
    values = dict(
        vocab_size=61, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0,
        max_position_embeddings=64,
    )  # fmt: skip
    return VanillaTransformerConfig(**{**values, **overrides})


def tiny_model(seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


def random_ids(batch: int, length: int, vocab: int = 61, seed: int = 0) -> torch.Tensor:
    """Token ids that avoid the special tokens 0..3."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (batch, length), generator=generator)


@pytest.fixture
def model():
    return tiny_model()
