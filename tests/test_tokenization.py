"""Tests of vanilla_transformer.tokenization: joint BPE, round trip, eos, save/reload, checks."""

import gzip
import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from vanilla_transformer.tokenization import (
    SPECIAL_TOKEN_IDS,
    SPECIAL_TOKENS,
    check_tokenizer_matches_model,
    save_tokenizer,
    train_joint_bpe,
)

# The Tatoeba split bundled with the repository, so these tests run wherever the repository is cloned.
BUNDLED = Path(__file__).resolve().parents[1] / "data" / "tatoeba_en_de"

SENTENCES = [
    "Hello, world! It's 5 o'clock.",
    "Über den Wolken muß die Freiheit wohl grenzenlos sein.",
    "Two young, White males are outside near many bushes.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "She said: \"Don't go (yet) - it's 3.50 €/kg; 100% sure?\"",
]


def _head(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in itertools.islice(f, n)]


@pytest.fixture(scope="module")
def tok():
    # every 25th line of the first 75,000 training pairs: a varied sample of 3,000 sentences per language
    texts = _head(BUNDLED / "train.en.gz", 75000)[::25] + _head(BUNDLED / "train.de.gz", 75000)[::25]
    return train_joint_bpe(texts, vocab_size=2000)


def test_special_token_ids(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    for name, token in SPECIAL_TOKENS.items():
        assert tok.convert_tokens_to_ids(token) == SPECIAL_TOKEN_IDS[name]
    assert len(tok) == 2000
    assert tok.model_max_length == int(1e30)  # transformers' "no limit": sinusoidal positions have none


@pytest.mark.parametrize("sentence", SENTENCES)
def test_round_trip(tok, sentence):
    ids = tok(sentence)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == sentence


def test_learned_real_subwords(tok):
    # A joint vocabulary learned from both languages: their frequent words are single tokens.
    assert len(tok("I have a house")["input_ids"]) == 5  # 4 words + </s>
    assert len(tok("Ich habe ein Haus")["input_ids"]) == 5


def test_unknown_characters_do_not_crash_and_survive(tok):
    text = "Emoji 😀, CJK 漢字, a\ttab"
    ids = tok(text)["input_ids"]
    assert tok.unk_token_id not in ids  # byte-level: every byte is in the vocabulary
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_nfc_normalisation(tok):
    composed, decomposed = "Über", "U\u0308ber"
    assert tok(composed)["input_ids"] == tok(decomposed)["input_ids"]


def test_eos_appended_no_bos(tok):
    for ids in tok(["A dog runs.", "Ein Hund läuft."])["input_ids"]:
        assert ids[-1] == tok.eos_token_id
        assert ids.count(tok.eos_token_id) == 1
        assert tok.bos_token_id not in ids


def test_text_target_gives_labels(tok):
    enc = tok(["A dog runs."], text_target=["Ein Hund läuft."])
    assert enc["labels"][0] == tok("Ein Hund läuft.")["input_ids"]
    assert enc["labels"][0][-1] == tok.eos_token_id
    assert enc["input_ids"][0] == tok("A dog runs.")["input_ids"]


def test_save_and_autotokenizer_reload(tok, tmp_path):
    save_tokenizer(tok, tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    loaded = AutoTokenizer.from_pretrained(tmp_path)  # no trust_remote_code
    assert type(loaded).__module__.startswith("transformers.")
    enc_a = tok(SENTENCES, text_target=SENTENCES[::-1])
    enc_b = loaded(SENTENCES, text_target=SENTENCES[::-1])
    assert enc_a["input_ids"] == enc_b["input_ids"]
    assert enc_a["labels"] == enc_b["labels"]
    assert [loaded.decode(i, skip_special_tokens=True) for i in enc_b["input_ids"]] == SENTENCES
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 2, 3)
    assert len(loaded) == len(tok)
    # Saved again, the loaded tokenizer writes the same tokenizer_config.json: nothing about how it was loaded
    # (transformers adds is_local and local_files_only to its init kwargs) goes into a file meant for the Hub.
    save_tokenizer(loaded, tmp_path / "again")
    assert (tmp_path / "again" / "tokenizer_config.json").read_text() == (
        tmp_path / "tokenizer_config.json"
    ).read_text()
    assert loaded.model_max_length == tok.model_max_length


def test_vocab_size_too_small_for_bytes():
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_joint_bpe(["a b c"], vocab_size=100)


def _config(**overrides):
    values = dict(vocab_size=2000, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    values.update(overrides)
    return SimpleNamespace(**values)


def test_check_matches(tok):
    check_tokenizer_matches_model(tok, _config())
    check_tokenizer_matches_model(tok, _config(vocab_size=2048))  # a larger embedding is fine


def test_check_vocab_size_mismatch(tok):
    with pytest.raises(ValueError) as err:
        check_tokenizer_matches_model(tok, _config(vocab_size=1000))
    msg = str(err.value)
    assert "2000 tokens" in msg and "vocab_size=1000" in msg and "vocab_size=2000" in msg


def test_check_special_id_mismatch(tok):
    with pytest.raises(ValueError) as err:
        check_tokenizer_matches_model(tok, _config(pad_token_id=1, eos_token_id=7))
    msg = str(err.value)
    assert "pad_token_id differs: tokenizer 0" in msg and "config 1" in msg
    assert "eos_token_id differs: tokenizer 2" in msg and "config 7" in msg
    assert "bos_token_id" not in msg


def test_check_with_model_config(tok):
    from vanilla_transformer import VanillaTransformerConfig

    check_tokenizer_matches_model(tok, VanillaTransformerConfig(vocab_size=len(tok)))
    with pytest.raises(ValueError, match="vocab_size"):
        check_tokenizer_matches_model(tok, VanillaTransformerConfig(vocab_size=len(tok) - 1))


def test_model_max_length_is_what_the_model_can_read(tok, tmp_path):
    """No limit (and no false "indexing errors" warning) for the paper's sinusoids, which compute any position;
    max_position_embeddings for learned positions, and it survives save/reload."""
    import copy

    from transformers.testing_utils import CaptureLogger
    from transformers.tokenization_utils_base import logger

    from vanilla_transformer import VanillaTransformerConfig
    from vanilla_transformer.tokenization import match_model_max_length

    long_text = " ".join(SENTENCES * 60)
    with CaptureLogger(logger) as captured:
        n = len(tok(long_text)["input_ids"])
    assert n > 1024 and "longer than the specified maximum" not in captured.out
    learned = copy.deepcopy(tok)
    config = VanillaTransformerConfig(
        vocab_size=len(tok), position_embedding_type="learned", max_position_embeddings=512
    )
    match_model_max_length(learned, config)
    learned.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).model_max_length == 512
    with CaptureLogger(logger) as captured:
        learned(long_text)
    assert f"({n} > 512)" in captured.out  # transformers' warning, now true
    match_model_max_length(learned, VanillaTransformerConfig(vocab_size=len(tok)))
    assert learned.model_max_length == tok.model_max_length > 10**20
