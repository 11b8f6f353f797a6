"""Shared helpers for the test suite: tiny configurations and random batches."""

import gzip
import signal
import subprocess
from pathlib import Path

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


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps process-wide state; reset it so each training run in a test starts clean."""
    yield
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """2,000 / 100 / 40 pairs of the bundled Tatoeba split, as a folder of {split}.{lang} files."""
    folder = tmp_path_factory.mktemp("corpus")
    bundled = Path(__file__).resolve().parents[1] / "data" / "tatoeba_en_de"
    for split, n in {"train": 2000, "valid": 100, "test": 40}.items():
        for lang in ("en", "de"):
            with gzip.open(bundled / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (folder / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return folder


def run_processes(command: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run(command)`` with its output captured; past ``timeout`` seconds the command and every
    process under it are killed (torchrun starts its workers in sessions of their own, and a plain
    ``subprocess.run(timeout=)`` would then wait on their open pipes) and the test fails with their output."""
    import psutil

    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        parent = psutil.Process(process.pid)
        for child in [*parent.children(recursive=True), parent]:
            try:
                child.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        out, err = process.communicate()
        pytest.fail(f"{' '.join(command[:6])} ... did not finish in {timeout:g} s:\n{err[-4000:]}")
    return subprocess.CompletedProcess(command, process.returncode, out, err)
