"""Shared helpers for the test suite: tiny configurations, random batches, and the fixtures several test files
use (the bundled corpus, a BPE tokenizer trained on it, a saved model folder)."""

import gzip
import itertools
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.modeling_vanilla_transformer import PAPER_DECODING

PAD, BOS, EOS = 0, 1, 2
BUNDLED = Path(__file__).resolve().parents[1] / "data" / "tatoeba_en_de"
#: Three German–English pairs; the tokenizer of the ``saved`` folder is trained on them.
SOURCE, TARGET = "Ein Mann fährt Fahrrad auf der Straße.", "A man rides a bike on the street."
SENTENCES = [
    SOURCE,
    TARGET,
    "Zwei Hunde spielen im Schnee.",
    "Two dogs play in the snow.",
    "Eine Frau liest ein Buch.",
    "A woman reads a book.",
]


def tiny_config(**overrides) -> VanillaTransformerConfig:
    values = dict(
        vocab_size=61,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        dropout=0.0,
        max_position_embeddings=64,
    )
    return VanillaTransformerConfig(**{**values, **overrides})


def tiny_model(seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    """A model of :func:`tiny_config`, in eval mode, decoding as the package's checkpoints do (PAPER_DECODING:
    beam 4, α 0.6, source length + 50)."""
    torch.manual_seed(seed)
    model = VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()
    model.generation_config.update(**PAPER_DECODING)
    return model


def random_ids(batch: int, length: int, vocab: int = 61, seed: int = 0) -> torch.Tensor:
    """Token ids that avoid the special tokens 0..3."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (batch, length), generator=generator)


@pytest.fixture
def model():
    return tiny_model()


@pytest.fixture(autouse=True, scope="session")
def prepared_corpus_cache(tmp_path_factory):
    """Prepared corpora go to a folder of the test session (and of the processes the tests start), not the user's
    cache; tests that prepare the same corpus with the same tokenizer share it, as runs do."""
    import os

    folder = tmp_path_factory.mktemp("prepared-cache")
    old = os.environ.get("VANILLA_TRANSFORMER_CACHE")
    os.environ["VANILLA_TRANSFORMER_CACHE"] = str(folder)
    yield folder
    if old is None:
        del os.environ["VANILLA_TRANSFORMER_CACHE"]
    else:
        os.environ["VANILLA_TRANSFORMER_CACHE"] = old


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
    bundled = BUNDLED
    for split, n in {"train": 2000, "valid": 100, "test": 40}.items():
        for lang in ("en", "de"):
            with gzip.open(bundled / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (folder / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return folder


def bundled_lines(name: str, n: int, skip: int = 0) -> list[str]:
    """Lines ``skip`` to ``skip + n`` of a file of the bundled corpus (e.g. ``"valid.en.gz"``), without line ends."""
    with gzip.open(BUNDLED / name, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, skip, skip + n)]


@pytest.fixture(scope="session")
def valid_sentences() -> dict[str, list[str]]:
    """The first 200 validation pairs of the bundled corpus, as {"en": [...], "de": [...]}."""
    return {"en": bundled_lines("valid.en.gz", 200), "de": bundled_lines("valid.de.gz", 200)}


@pytest.fixture(scope="session")
def tokenizer(valid_sentences):
    """A joint BPE of 400 tokens trained on ``valid_sentences`` (both languages). Not to be changed by a test."""
    from vanilla_transformer.tokenization import train_joint_bpe

    return train_joint_bpe(valid_sentences["en"] + valid_sentences["de"], vocab_size=400)


@pytest.fixture(scope="session")
def sentence_tokenizer():
    """A joint BPE trained on the three pairs of ``SENTENCES`` (every word is a token)."""
    from vanilla_transformer.tokenization import train_joint_bpe

    return train_joint_bpe(SENTENCES * 3, vocab_size=400, min_frequency=1)


@pytest.fixture(scope="session")
def saved(tmp_path_factory, sentence_tokenizer) -> Path:
    """A folder holding a tiny (untrained) model, 2+2 layers of 4 heads, and its tokenizer, as ``save_pretrained``
    writes them. Outputs are short (source length + 6 tokens): an untrained model rarely stops by itself."""
    folder = tmp_path_factory.mktemp("saved")
    model = tiny_model(vocab_size=len(sentence_tokenizer))
    model.generation_config.source_length_offset = 6
    model.save_pretrained(folder)
    sentence_tokenizer.save_pretrained(folder)
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
