"""Tests of vanilla_transformer.prepared: a corpus tokenised once into memory-mapped token arrays, keyed by what
determines it, and the training command's use of it (the main process prepares, every process maps)."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_training import tiny_run

from vanilla_transformer import prepared as prepared_module
from vanilla_transformer import training
from vanilla_transformer.data import load_parallel_corpus, local_corpus_readers, tokenize_corpus
from vanilla_transformer.prepared import (
    RaggedArray,
    file_digest,
    is_prepared,
    load_prepared_split,
    mark_absent,
    prepare_split,
    prepared_split_folder,
)
from vanilla_transformer.training import train


@pytest.fixture(scope="module")
def corpus_split(corpus):
    return load_parallel_corpus(corpus, "en", "de")["train"]


@pytest.mark.parametrize("max_length, direct", [(256, True), (12, True), (12, False)])
def test_a_prepared_split_holds_what_tokenize_corpus_keeps(
    corpus_split, tokenizer, tmp_path, max_length, direct, monkeypatch
):
    """The same pairs kept (over-long and empty ones dropped), the same ids and texts, in the same order, written a
    chunk at a time (a small chunk here, so that several are joined) and read back through memory maps; whether
    the Rust tokenizer is called directly or, for any other tokenizer class, through transformers."""
    if not direct:
        monkeypatch.setattr(prepared_module, "TokenizersBackend", type("Other", (), {}))
    split = corpus_split.select(range(300))
    split = split.map(
        lambda row, i: {"target": "   " if i == 7 else row["target"]}, with_indices=True
    )  # one empty side
    monkeypatch.setattr(prepared_module, "_CHUNK", 64)
    dropped = prepare_split(zip(split["source"], split["target"]), tokenizer, max_length, tmp_path / "split")
    expected, expected_dropped = tokenize_corpus(split, tokenizer, max_length=max_length)
    loaded = load_prepared_split(tmp_path / "split")
    assert dropped == loaded.dropped == expected_dropped >= 1
    assert len(loaded.input_ids) == len(loaded.labels) == len(loaded.sources) == len(expected)
    assert [row.tolist() for row in loaded.input_ids] == expected["input_ids"]
    assert [row.tolist() for row in loaded.labels] == expected["labels"]
    assert list(loaded.sources) == expected["source"] and loaded.targets[:3] == expected["target"][:3]
    assert loaded.input_ids.lengths.tolist() == expected["src_len"]
    assert isinstance(loaded.input_ids.flat, np.memmap) and loaded.input_ids.flat.dtype == np.uint16  # 2 bytes a token
    assert not loaded.input_ids.flat.flags.writeable


def test_ragged_rows_are_views_with_python_indexing():
    rows = RaggedArray(np.arange(10), np.array([0, 3, 3, 7, 10]))
    assert [r.tolist() for r in rows] == [[0, 1, 2], [], [3, 4, 5, 6], [7, 8, 9]]
    assert rows[-1].tolist() == [7, 8, 9] and rows.lengths.tolist() == [3, 0, 4, 3]
    assert rows[1:3][1].tolist() == [3, 4, 5, 6]
    with pytest.raises(IndexError):
        rows[4]


def test_the_folder_is_named_by_the_corpus_bytes_the_tokenizer_and_max_length(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path / "tok")
    tokenizer_json = tmp_path / "tok" / "tokenizer.json"
    (tmp_path / "a.tsv").write_text("Hi.\tHallo.\n", encoding="utf-8")
    key = file_digest([tmp_path / "a.tsv"])
    folder = prepared_split_folder(key, tokenizer_json, 128, root=tmp_path)
    assert folder == prepared_split_folder(key, tokenizer_json, 128, root=tmp_path)
    assert folder != prepared_split_folder(key, tokenizer_json, 64, root=tmp_path)
    (tmp_path / "a.tsv").write_text("Hi.\tServus.\n", encoding="utf-8")
    assert folder != prepared_split_folder(file_digest([tmp_path / "a.tsv"]), tokenizer_json, 128, root=tmp_path)
    tokenizer_json.write_text(tokenizer_json.read_text().replace('"<unk>"', '"<UNK>"'))
    assert folder != prepared_split_folder(key, tokenizer_json, 128, root=tmp_path)


def test_a_half_written_or_foreign_folder_is_refused_with_the_fix(tmp_path):
    assert is_prepared(tmp_path / "missing") is None
    mark_absent(tmp_path / "absent")
    assert is_prepared(tmp_path / "absent") is False
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "meta.json").write_text(json.dumps({"format": 0}))
    with pytest.raises(ValueError, match="format 0.*delete the folder"):
        load_prepared_split(tmp_path / "old")
    with pytest.raises(ValueError, match="holds no prepared split"):
        load_prepared_split(tmp_path / "absent")


def test_a_second_run_on_the_same_corpus_reads_nothing_and_trains_the_same(corpus, tmp_path, monkeypatch):
    """The first run prepares each split once (the test split too); a second, fresh run with the first one's
    tokenizer finds them ready, reads no pair of the corpus and trains to the same weights; a changed max_length
    prepares anew."""
    monkeypatch.setenv("VANILLA_TRANSFORMER_CACHE", str(tmp_path / "cache"))  # not the splits other tests prepared
    first = tiny_run(corpus, tmp_path / "first", max_steps=4)
    prepared_calls = []
    real_prepare, real_read = training.prepare_split, training._Split.__call__

    def counted(*args, **kwargs):
        prepared_calls.append(args[3])
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(training, "prepare_split", counted)
    train(first)
    assert len(prepared_calls) == 3
    calls_before = len(prepared_calls)

    def untouched(*args, **kwargs):
        raise AssertionError("the second run read the corpus again")

    monkeypatch.setattr(training._Split, "__call__", untouched)
    second = dataclasses.replace(
        first, output_dir=str(tmp_path / "second"), tokenizer_name=str(tmp_path / "first" / "final")
    )
    train(second)
    weights = [load_file(tmp_path / run / "final" / "model.safetensors") for run in ("first", "second")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    monkeypatch.setattr(training._Split, "__call__", real_read)
    train(dataclasses.replace(second, output_dir=str(tmp_path / "third"), max_length=100))
    assert len(prepared_calls) == calls_before + 3


def test_a_corpus_is_streamed_from_its_files_not_loaded(tmp_path, tokenizer, monkeypatch):
    """Preparing a split of local files holds one chunk of pairs at a time: the pairs come from a reader of the
    files (datasets' in-memory table is never built), and a misaligned file found at the end leaves no folder."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.en").write_text("".join(f"Sentence {i}.\n" for i in range(130)), encoding="utf-8")
    (folder / "train.de").write_text("".join(f"Satz {i}.\n" for i in range(130)), encoding="utf-8")
    monkeypatch.setattr(prepared_module, "_CHUNK", 50)
    monkeypatch.setattr("vanilla_transformer.data._pairs_to_dataset", lambda pairs: pytest.fail("loaded in memory"))
    reader = local_corpus_readers(folder, "en", "de")["train"]
    assert reader.files == (folder / "train.en", folder / "train.de")
    assert prepare_split(reader(), tokenizer, 64, tmp_path / "ok") == 0
    assert load_prepared_split(tmp_path / "ok").sources[129] == "Sentence 129."
    with open(folder / "train.de", "a", encoding="utf-8") as f:
        f.write("Ein Satz zu viel.\n")
    with pytest.raises(ValueError, match="Misaligned parallel files.*130 lines.*131 lines"):
        prepare_split(reader(), tokenizer, 64, tmp_path / "misaligned")
    assert not (tmp_path / "misaligned").exists()
