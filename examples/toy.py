"""A toy task that needs no data: reverse a random token string.

Used by ``examples/demo.py`` and by the test that proves a tiny model really learns.
"""

import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

PAD, BOS, EOS = 0, 1, 2
FIRST_TOKEN = 4  # ids 0..3 are <pad>, <s>, </s>, <unk>


def reverse_batch(batch_size: int, vocab_size: int, min_len: int, max_len: int, generator: torch.Generator):
    """Source: random tokens + eos, right-padded. Labels: the reversed tokens + eos, padded with -100.

    Returns ``(input_ids, attention_mask, labels)``, each ``[batch_size, max_len + 1]``.
    """
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)
    input_ids = torch.full((batch_size, max_len + 1), PAD)
    labels = torch.full((batch_size, max_len + 1), -100)
    for i, n in enumerate(lengths.tolist()):
        tokens = torch.randint(FIRST_TOKEN, vocab_size, (n,), generator=generator)
        input_ids[i, : n + 1] = torch.cat([tokens, torch.tensor([EOS])])
        labels[i, : n + 1] = torch.cat([tokens.flip(0), torch.tensor([EOS])])
    return input_ids, (input_ids != PAD).long(), labels


def exact_match(model, input_ids, attention_mask, labels) -> float:
    """Fraction of sequences that greedy decoding reproduces exactly (eos included)."""
    out = model.generate(input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=labels.shape[1])
    out = out[:, 1:]  # drop decoder_start_token_id
    expected = labels.masked_fill(labels == -100, PAD)
    width = max(out.shape[1], expected.shape[1])
    out, expected = (
        F.pad(out, (0, width - out.shape[1]), value=PAD),
        F.pad(expected, (0, width - expected.shape[1]), value=PAD),
    )
    return (out == expected).all(dim=1).float().mean().item()


def train_reverse(
    steps: int = 1200,
    vocab_size: int = 16,
    min_len: int = 3,
    max_len: int = 7,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = False,
) -> tuple[VanillaTransformerForConditionalGeneration, dict]:
    """Train a tiny Transformer on the reversal task with Adam(0.9, 0.98, 1e-9) and warm-up; stop early
    once the training loss is below 0.001. Returns the model (in eval mode) and a summary."""
    torch.manual_seed(seed)
    config = VanillaTransformerConfig(
        vocab_size=vocab_size,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        dropout=0.0,
        max_position_embeddings=64,
    )
    model = VanillaTransformerForConditionalGeneration(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-9)
    warmup = 100
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, (warmup / (s + 1)) ** 0.5))
    generator = torch.Generator().manual_seed(seed + 1)
    start = time.monotonic()
    bar = tqdm(range(steps), desc="reverse task", disable=not progress)
    for step in bar:
        input_ids, attention_mask, labels = reverse_batch(batch_size, vocab_size, min_len, max_len, generator)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if step % 100 == 99 and loss.item() < 0.001:
            break
    bar.close()
    model.eval()
    test = reverse_batch(200, vocab_size, min_len, max_len, torch.Generator().manual_seed(seed + 2))
    summary = {
        "steps": step + 1,
        "loss": loss.item(),
        "exact_match": exact_match(model, *test),
        "seconds": time.monotonic() - start,
    }
    return model, summary
