"""Tests of vanilla_transformer.data: corpus loading, tokenisation, token-bucket batching, collation."""

import gzip
import json
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from vanilla_transformer import data as data_module
from vanilla_transformer.data import TokenBucketBatchSampler, collate_batch, load_parallel_corpus, tokenize_corpus
from vanilla_transformer.tokenization import train_joint_bpe

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

PAIRS = [
    ("A dog runs.", "Ein Hund läuft."),
    ("Two men are talking.", "Zwei Männer unterhalten sich."),
    ("It's 5 o'clock, isn't it?", "Es ist 5 Uhr, oder?"),
    ("Über is German.", "„Über“ ist Deutsch."),
]
SRC = [s for s, _ in PAIRS]
TGT = [t for _, t in PAIRS]


def _write(path: Path, lines, gz=False):
    text = "".join(line + "\n" for line in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _rows(ds):
    return list(zip(ds["source"], ds["target"], strict=True))


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Tests never reach the Hub: any unexpected load_dataset call fails loudly."""

    def forbidden(*args, **kwargs):
        raise AssertionError(f"load_dataset called with {args} {kwargs}")

    monkeypatch.setattr(datasets, "load_dataset", forbidden)


# ---------------------------------------------------------------------------------------------
# load_parallel_corpus: formats
# ---------------------------------------------------------------------------------------------


def test_prefix_text_files(tmp_path):
    _write(tmp_path / "train.en", SRC)
    _write(tmp_path / "train.de", TGT)
    dd = load_parallel_corpus(tmp_path / "train", "en", "de")
    assert isinstance(dd, datasets.DatasetDict) and list(dd) == ["train"]
    assert dd["train"].column_names == ["source", "target"]
    assert _rows(dd["train"]) == PAIRS
    # reversed direction swaps the columns
    assert _rows(load_parallel_corpus(str(tmp_path / "train"), "de", "en", split="train")) == [(t, s) for s, t in PAIRS]


def test_prefix_gz_files(tmp_path):
    _write(tmp_path / "c.en.gz", SRC, gz=True)
    _write(tmp_path / "c.de", TGT)  # mixing plain and gzip is fine
    ds = load_parallel_corpus(str(tmp_path / "c"), "en", "de", split="train")
    assert isinstance(ds, datasets.Dataset)
    assert _rows(ds) == PAIRS


def test_folder_with_splits(tmp_path):
    _write(tmp_path / "train.en", SRC)
    _write(tmp_path / "train.de", TGT)
    _write(tmp_path / "val.en", SRC[:2])
    _write(tmp_path / "val.de", TGT[:2])
    _write(tmp_path / "test_2016.en.gz", SRC[2:], gz=True)
    _write(tmp_path / "test_2016.de.gz", TGT[2:], gz=True)
    (tmp_path / "README.md").write_text("not data")
    (tmp_path / "tok").mkdir()
    dd = load_parallel_corpus(tmp_path, "en", "de")
    assert sorted(dd) == ["test_2016", "train", "validation"]
    assert _rows(dd["train"]) == PAIRS
    assert _rows(dd["validation"]) == PAIRS[:2]
    assert _rows(dd["test_2016"]) == PAIRS[2:]
    for name in ("val", "validation"):
        assert _rows(load_parallel_corpus(tmp_path, "en", "de", split=name)) == PAIRS[:2]
    with pytest.raises(ValueError, match=r"Split 'dev2' not found.*'test_2016', 'train', 'validation'"):
        load_parallel_corpus(tmp_path, "en", "de", split="dev2")


def test_tsv(tmp_path):
    lines = [f"{s}\t{t}" for s, t in PAIRS[:2]] + [
        "",
        f"{SRC[2]}\t{TGT[2]}\tCC-BY 2.0 (France) Attribution",
        f"{SRC[3]}\t{TGT[3]}",
    ]
    ds = load_parallel_corpus(_write(tmp_path / "pairs.tsv", lines), "en", "de", split="train")
    assert _rows(ds) == PAIRS


def test_jsonl_translation_records(tmp_path):
    lines = [json.dumps({"translation": {"de": t, "en": s}}, ensure_ascii=False) for s, t in PAIRS]
    dd = load_parallel_corpus(_write(tmp_path / "pairs.jsonl", lines), "en", "de")
    assert list(dd) == ["train"] and _rows(dd["train"]) == PAIRS


def test_jsonl_flat_records_gz(tmp_path):
    lines = [json.dumps({"en": s, "de": t, "id": i}) for i, (s, t) in enumerate(PAIRS)]
    assert _rows(load_parallel_corpus(_write(tmp_path / "p.jsonl.gz", lines, gz=True), "en", "de", split="x")) == PAIRS


def test_json_list_and_json_lines(tmp_path):
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps([{"translation": {"en": s, "de": t}} for s, t in PAIRS]), encoding="utf-8")
    as_lines = _write(tmp_path / "lines.json", [json.dumps({"en": s, "de": t}) for s, t in PAIRS])
    for path in (as_list, as_lines):
        assert _rows(load_parallel_corpus(path, "en", "de", split="train")) == PAIRS


def test_whitespace_and_bom_are_stripped(tmp_path):
    (tmp_path / "w.en").write_bytes("\ufeff  A dog runs. \r\nB\r\n".encode("utf-8"))
    (tmp_path / "w.de").write_bytes("Ein Hund läuft.\nB\u2028C\n".encode("utf-8"))  # U+2028 is not a line break
    assert _rows(load_parallel_corpus(tmp_path / "w", "en", "de", split="train")) == [
        ("A dog runs.", "Ein Hund läuft."),
        ("B", "B\u2028C"),
    ]


def test_hub_dataset_is_standardised(monkeypatch):
    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        ds = datasets.Dataset.from_dict({"translation": [{"de": t, "en": s} for s, t in PAIRS]})
        dd = datasets.DatasetDict({"train": ds, "validation": ds.select([0])})
        return dd[split] if split else dd

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dd = load_parallel_corpus("wmt14", "en", "de", hub_config="de-en")
    assert calls == [("wmt14", "de-en", None)]  # passed straight to datasets.load_dataset
    assert sorted(dd) == ["train", "validation"]
    assert dd["train"].column_names == ["source", "target"] and _rows(dd["train"]) == PAIRS
    ds = load_parallel_corpus("wmt14", "de", "en", split="validation", hub_config="de-en")
    assert _rows(ds) == [(TGT[0], SRC[0])]
    assert calls[-1] == ("wmt14", "de-en", "validation")


# ---------------------------------------------------------------------------------------------
# load_parallel_corpus: errors
# ---------------------------------------------------------------------------------------------


def test_missing_target_file_named(tmp_path):
    _write(tmp_path / "train.en", SRC)
    with pytest.raises(ValueError, match="File not found") as err:
        load_parallel_corpus(tmp_path / "train", "en", "de")
    assert str(tmp_path / "train.de") in str(err.value)


def test_missing_local_paths_never_go_to_hub(tmp_path):
    for source in (tmp_path / "nothing" / "train", f"{tmp_path}/train", "./no/such/prefix"):
        with pytest.raises(ValueError, match="File not found"):
            load_parallel_corpus(source, "en", "de")
    with pytest.raises(ValueError, match="File not found: .*absent.tsv"):
        load_parallel_corpus(tmp_path / "absent.tsv", "en", "de")


def test_unsupported_file_format(tmp_path):
    _write(tmp_path / "deu.txt", [f"{s}\t{t}" for s, t in PAIRS])
    with pytest.raises(ValueError, match=r"Unsupported file .*deu\.txt.*\.tsv"):
        load_parallel_corpus(tmp_path / "deu.txt", "en", "de")


def test_folder_missing_partner_file(tmp_path):
    _write(tmp_path / "train.en", SRC)
    _write(tmp_path / "train.de", TGT)
    _write(tmp_path / "test.de", TGT)
    with pytest.raises(ValueError, match="File not found") as err:
        load_parallel_corpus(tmp_path, "en", "de")
    assert str(tmp_path / "test.en") in str(err.value)


def test_plain_and_gz_both_present(tmp_path):
    _write(tmp_path / "train.en", SRC)
    _write(tmp_path / "train.en.gz", SRC, gz=True)
    _write(tmp_path / "train.de", TGT)
    with pytest.raises(ValueError, match=r"Both .*train\.en and .*train\.en\.gz exist"):
        load_parallel_corpus(tmp_path / "train", "en", "de")


def test_folder_without_parallel_files(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"No parallel files found.*train\.en.*notes\.txt"):
        load_parallel_corpus(tmp_path, "en", "de")


def test_empty_file(tmp_path):
    _write(tmp_path / "e.en", SRC)
    (tmp_path / "e.de").write_text("")
    with pytest.raises(ValueError, match="File is empty") as err:
        load_parallel_corpus(tmp_path / "e", "en", "de")
    assert str(tmp_path / "e.de") in str(err.value)
    (tmp_path / "blank.tsv").write_text("\n\n")
    with pytest.raises(ValueError, match="File is empty: .*blank.tsv"):
        load_parallel_corpus(tmp_path / "blank.tsv", "en", "de")


def test_misaligned_files(tmp_path):
    _write(tmp_path / "m.en", SRC)
    _write(tmp_path / "m.de", TGT[:3])
    with pytest.raises(ValueError, match="Misaligned") as err:
        load_parallel_corpus(tmp_path / "m", "en", "de")
    msg = str(err.value)
    assert f"{tmp_path / 'm.en'} has 4 lines" in msg and f"{tmp_path / 'm.de'} has 3 lines" in msg


def test_not_utf8(tmp_path):
    _write(tmp_path / "l.en", SRC)
    (tmp_path / "l.de").write_bytes("Ein Hund läuft.\nZwei Männer.\n".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8: line 1") as err:
        load_parallel_corpus(tmp_path / "l", "en", "de")
    assert str(tmp_path / "l.de") in str(err.value)
    (tmp_path / "bad.jsonl").write_bytes(b'{"en": "a", "de": "b"}\n{"en": "c", "de": "\xfc"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl is not UTF-8: line 2"):
        load_parallel_corpus(tmp_path / "bad.jsonl", "en", "de")


def test_malformed_tsv_and_json(tmp_path):
    _write(tmp_path / "t.tsv", ["a\tb", "no tab here"])
    with pytest.raises(ValueError, match=r"t\.tsv, line 2: expected 'source<TAB>target'"):
        load_parallel_corpus(tmp_path / "t.tsv", "en", "de")
    _write(tmp_path / "j.jsonl", [json.dumps({"en": "a", "de": "b"}), json.dumps({"en": "a", "fr": "b"})])
    with pytest.raises(ValueError, match=r"j\.jsonl, line 2: .*found keys \['en', 'fr'\]"):
        load_parallel_corpus(tmp_path / "j.jsonl", "en", "de")
    _write(tmp_path / "k.jsonl", ['{"en": "a", "de": '])
    with pytest.raises(ValueError, match=r"k\.jsonl, line 1: not valid JSON"):
        load_parallel_corpus(tmp_path / "k.jsonl", "en", "de")


def test_invalid_dataset_name():
    with pytest.raises(ValueError, match="nor a valid Hub dataset name"):
        load_parallel_corpus("no such dataset!", "en", "de")


def test_unknown_hub_dataset(monkeypatch):
    def not_found(name, *args, **kwargs):
        raise datasets.exceptions.DatasetNotFoundError(f"Dataset '{name}' doesn't exist on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", not_found)
    with pytest.raises(ValueError, match="Unknown dataset 'wmt99'") as err:
        load_parallel_corpus("wmt99", "en", "de")
    assert "wmt99.en" in str(err.value)


def test_hub_unreachable(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wmt14' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError) as err:
        load_parallel_corpus("wmt14", "en", "de", hub_config="de-en")
    msg = str(err.value)
    assert "'wmt14'" in msg and "'de-en'" in msg and "unreachable" in msg and "local files" in msg
    assert isinstance(err.value.__cause__, ConnectionError)


def test_real_multi30k_folder():
    folder = SHARED_DATA / "multi30k"
    if not (folder / "train.en").is_file():
        pytest.skip(f"Multi30k not found at {folder}")
    dd = load_parallel_corpus(folder, "en", "de")
    assert {k: len(v) for k, v in dd.items()} == {"test_2016_flickr": 1000, "train": 29000, "validation": 1014}
    assert dd["train"][0] == {
        "source": "Two young, White males are outside near many bushes.",
        "target": "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    }


def test_bundled_tatoeba_folder():
    folder = Path(__file__).resolve().parents[1] / "data" / "tatoeba_en_de"
    ds = load_parallel_corpus(folder, "en", "de", split="validation")  # valid.{en,de}.gz
    assert len(ds) > 0 and ds.column_names == ["source", "target"]
    assert all(s and t for s, t in _rows(ds))


def test_real_tatoeba_prefix():
    prefix = SHARED_DATA / "tatoeba_deu_eng" / "tatoeba"
    if not Path(f"{prefix}.en").is_file():
        pytest.skip(f"Tatoeba not found at {prefix}")
    ds = load_parallel_corpus(prefix, "de", "en", split="train")
    assert len(ds) == 169197
    assert ds[2] == {"source": "Lauf!", "target": "Run!"}


# ---------------------------------------------------------------------------------------------
# tokenize_corpus
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tok():
    words = "a dog cat man runs sits the ein hund katze mann läuft sitzt der die das".split()
    texts = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 5
    return train_joint_bpe(texts, vocab_size=400)


def test_tokenize_corpus_drops_exactly_long_and_empty(tiny_tok):
    rng = np.random.default_rng(0)
    words = "a dog cat man runs sits the".split()
    de_words = "ein hund katze mann läuft sitzt der".split()
    pairs = [
        (" ".join(rng.choice(words, rng.integers(1, 14))), " ".join(rng.choice(de_words, rng.integers(1, 14))))
        for _ in range(60)
    ]
    max_length = 8

    def n_tokens(text):
        return len(tiny_tok(text)["input_ids"])

    # boundary cases on each side: exactly max_length tokens is kept, one more is dropped
    en = {n_tokens(" ".join((words * 2)[:k])): " ".join((words * 2)[:k]) for k in range(1, 12)}
    de = {n_tokens(" ".join((de_words * 2)[:k])): " ".join((de_words * 2)[:k]) for k in range(1, 12)}
    assert {max_length, max_length + 1} <= set(en) & set(de)
    pairs += [(en[max_length], "ein hund"), (en[max_length + 1], "ein hund")]
    pairs += [("a dog", de[max_length]), ("a dog", de[max_length + 1])]
    pairs += [("", "ein hund"), ("a dog", "   ")]
    ds = datasets.Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})

    expected = [
        (s, t) for s, t in pairs if s.strip() and t.strip() and n_tokens(s) <= max_length and n_tokens(t) <= max_length
    ]
    assert 5 < len(expected) < 55  # the test data exercises both outcomes

    kept, dropped = tokenize_corpus(ds, tiny_tok, max_length=max_length)
    assert dropped == len(pairs) - len(expected)
    assert _rows(kept) == expected
    assert (en[max_length], "ein hund") in expected and ("a dog", de[max_length]) in expected
    assert (en[max_length + 1], "ein hund") not in expected and ("a dog", de[max_length + 1]) not in expected
    assert set(kept.column_names) >= {"source", "target", "input_ids", "labels", "src_len", "tgt_len"}
    for row in kept:
        assert row["input_ids"] == tiny_tok(row["source"])["input_ids"]  # not truncated
        assert row["labels"] == tiny_tok(row["target"])["input_ids"]
        assert row["input_ids"][-1] == row["labels"][-1] == tiny_tok.eos_token_id
        assert (row["src_len"], row["tgt_len"]) == (len(row["input_ids"]), len(row["labels"]))
        assert max(row["src_len"], row["tgt_len"]) <= max_length


def test_tokenize_corpus_nothing_dropped(tiny_tok):
    ds = datasets.Dataset.from_dict({"source": ["a dog", "the cat"], "target": ["ein hund", "die katze"]})
    kept, dropped = tokenize_corpus(ds, tiny_tok)
    assert dropped == 0 and len(kept) == 2


def test_tokenize_corpus_rejects_datasetdict(tiny_tok):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"source": ["a"], "target": ["b"]})})
    with pytest.raises(TypeError, match="once per split"):
        tokenize_corpus(dd, tiny_tok)


# ---------------------------------------------------------------------------------------------
# TokenBucketBatchSampler
# ---------------------------------------------------------------------------------------------


def _lengths(n=500, seed=1):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 60, n)
    tgt = np.clip(src + rng.integers(-10, 11, n), 1, None)
    return list(zip(src.tolist(), tgt.tolist(), strict=True))


def _padded(batch, lengths, side):
    return len(batch) * max(lengths[i][side] for i in batch)


@pytest.mark.parametrize("max_tokens", [70, 256, 1000])  # longest example: 69 tokens
def test_sampler_cap_and_exact_cover(max_tokens):
    lengths = _lengths()
    sampler = TokenBucketBatchSampler(lengths, max_tokens=max_tokens, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    for b in batches:
        assert _padded(b, lengths, 0) <= max_tokens and _padded(b, lengths, 1) <= max_tokens
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # every example exactly once
    # batching by length actually packs: batches are nearly full on the source side
    mean_fill = np.mean([_padded(b, lengths, 0) / max_tokens for b in batches])
    assert mean_fill > 0.6


def test_sampler_groups_similar_lengths():
    lengths = _lengths()
    batches = list(TokenBucketBatchSampler(lengths, max_tokens=256, shuffle=False))
    maxima = [max(lengths[i][0] for i in b) for b in batches]
    assert maxima == sorted(maxima)  # shortest first when not shuffled
    padding = sum(_padded(b, lengths, 0) - sum(lengths[i][0] for i in b) for b in batches)
    assert padding / sum(s for s, _ in lengths) < 0.1


def test_sampler_deterministic_per_seed_and_epoch():
    lengths = _lengths()
    a, b = TokenBucketBatchSampler(lengths, 256, seed=7), TokenBucketBatchSampler(lengths, 256, seed=7)
    epoch0 = list(a)
    assert list(b) == epoch0 and list(a) == epoch0  # same seed, same epoch: same batches, same order
    a.set_epoch(1)
    epoch1 = list(a)
    assert epoch1 != epoch0
    assert sorted(map(tuple, epoch1)) == sorted(map(tuple, epoch0))  # same batches, new order
    b.set_epoch(1)
    assert list(b) == epoch1
    assert list(TokenBucketBatchSampler(lengths, 256, seed=8)) != epoch0


def test_sampler_two_lists_input_equals_pairs():
    lengths = _lengths(100)
    src, tgt = [s for s, _ in lengths], [t for _, t in lengths]
    expected = list(TokenBucketBatchSampler(lengths, 128, seed=2))
    assert list(TokenBucketBatchSampler((src, tgt), 128, seed=2)) == expected
    assert list(TokenBucketBatchSampler(src, 128, seed=2, tgt_lengths=tgt)) == expected
    assert list(TokenBucketBatchSampler(np.array(lengths), 128, seed=2)) == expected
    with pytest.raises(ValueError, match="tgt_lengths"):
        TokenBucketBatchSampler(src, 128)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [500, 507])
def test_sampler_shards_across_two_replicas(drop_last, n):
    lengths = _lengths(n)
    full = TokenBucketBatchSampler(lengths, 128, seed=5)
    all_batches = sorted(map(tuple, full))
    shards = [
        TokenBucketBatchSampler(lengths, 128, seed=5, num_replicas=2, rank=r, drop_last=drop_last) for r in (0, 1)
    ]
    for s in shards:
        s.set_epoch(4)
    per_rank = [list(map(tuple, s)) for s in shards]
    assert len(per_rank[0]) == len(per_rank[1]) == len(shards[0]) == len(shards[1])
    n_batches = len(all_batches)
    combined = per_rank[0] + per_rank[1]
    if drop_last:
        assert len(shards[0]) == n_batches // 2
        assert not set(per_rank[0]) & set(per_rank[1])  # disjoint
        assert len(set(combined)) == len(combined) == n_batches - n_batches % 2
        assert set(combined) <= set(all_batches)
    else:
        assert len(shards[0]) == (n_batches + 1) // 2
        assert set(combined) == set(all_batches)  # everything covered
        assert len(combined) - len(set(combined)) == n_batches % 2  # at most one batch repeated
        if n_batches % 2 == 0:
            assert not set(per_rank[0]) & set(per_rank[1])


def test_sampler_shard_counts_odd_number_of_batches():
    # make sure the padding/dropping path is exercised: 5 batches of one example each
    lengths = [(10, 10)] * 5
    for drop_last, expected_len in ((False, 3), (True, 2)):
        shards = [
            TokenBucketBatchSampler(lengths, 10, seed=0, num_replicas=2, rank=r, drop_last=drop_last) for r in (0, 1)
        ]
        got = [list(s) for s in shards]
        assert [len(g) for g in got] == [expected_len, expected_len] == [len(s) for s in shards]
        flat = [i for g in got for b in g for i in b]
        assert len(set(flat)) == (5 if not drop_last else 4)
    assert len(TokenBucketBatchSampler(lengths, 10, num_replicas=8, rank=7)) == 1
    assert len(list(TokenBucketBatchSampler(lengths, 10, num_replicas=8, rank=7))) == 1


def test_sampler_oversized_example_gets_own_batch():
    lengths = [(5, 5)] * 6 + [(50, 3)]
    with pytest.warns(UserWarning, match="1 example"):
        sampler = TokenBucketBatchSampler(lengths, 20, shuffle=False)
    batches = list(sampler)
    assert [6] in batches
    assert sorted(i for b in batches for i in b) == list(range(7))


def test_sampler_argument_errors():
    with pytest.raises(ValueError, match="rank"):
        TokenBucketBatchSampler([(1, 1)], 10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBucketBatchSampler([(1, 1)], 0)


# ---------------------------------------------------------------------------------------------
# collate_batch
# ---------------------------------------------------------------------------------------------


def test_collate_pads_right_with_minus_100_labels():
    examples = [
        {"input_ids": [5, 6, 2], "labels": [7, 2], "source": "x"},
        {"input_ids": [8, 2], "labels": [9, 10, 11, 2]},
    ]
    batch = collate_batch(examples, pad_token_id=0)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[5, 6, 2], [8, 2, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[7, 2, -100, -100], [9, 10, 11, 2]]
    assert all(t.dtype == torch.long for t in batch.values())

    with_dec = collate_batch(examples, pad_token_id=0, decoder_start_token_id=1, pad_to_multiple_of=8)
    assert with_dec["input_ids"].shape == (2, 8) and with_dec["labels"].shape == (2, 8)
    assert with_dec["decoder_input_ids"].tolist() == [[1, 7, 0, 0, 0, 0, 0, 0], [1, 9, 10, 11, 0, 0, 0, 0]]


def test_collate_shifts_labels_as_the_model_does_where_the_labels_are_real():
    """decoder_input_ids are the model's shift_tokens_right of the labels at every position that has a label
    (what the loss sees), and padding beyond, whatever value pads the labels."""
    from vanilla_transformer import shift_tokens_right

    examples = [
        {"input_ids": [4], "labels": [7, 8, 9, 2]},
        {"input_ids": [4], "labels": [5, 2]},
        {"input_ids": [4], "labels": [6]},
    ]
    for label_pad in (-100, -1):
        batch = collate_batch(examples, pad_token_id=0, label_pad_token_id=label_pad, decoder_start_token_id=3)
        labels = batch["labels"]
        real = labels != label_pad
        assert real.sum(1).tolist() == [4, 2, 1]
        model_shift = shift_tokens_right(labels.masked_fill(~real, -100), 0, 3)
        assert torch.equal(batch["decoder_input_ids"][real], model_shift[real])
        assert (batch["decoder_input_ids"][~real] == 0).all()
        assert batch["decoder_input_ids"][:, 0].tolist() == [3, 3, 3]


def test_collate_pairs_leaves_out_the_mask_only_when_no_source_is_padded():
    from vanilla_transformer.data import collate_pairs

    sources, targets = [[5, 2], [6, 2], [7, 8, 2]], [[9, 2], [9, 9, 2], [2]]
    same = collate_pairs(sources, targets, [0, 1], pad_token_id=0)
    assert "attention_mask" not in same and same["labels"].tolist() == [[9, 2, -100], [9, 9, 2]]
    padded = collate_pairs(sources, targets, [2, 0], pad_token_id=0)
    assert padded["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]] and padded["input_ids"].tolist() == [
        [7, 8, 2],
        [5, 2, 0],
    ]


def test_end_to_end_dataloader(tiny_tok):
    ds = datasets.Dataset.from_dict(
        {
            "source": ["a dog runs", "the cat", "a man sits the dog", "cat"],
            "target": ["ein hund läuft", "die katze", "ein mann sitzt", "katze"],
        }
    )
    kept, dropped = tokenize_corpus(ds, tiny_tok, max_length=32)
    assert dropped == 0
    sampler = TokenBucketBatchSampler(kept["src_len"], 16, tgt_lengths=kept["tgt_len"], seed=0)
    loader = DataLoader(
        kept, batch_sampler=sampler, collate_fn=partial(collate_batch, pad_token_id=tiny_tok.pad_token_id)
    )
    seen = 0
    for batch in loader:
        assert batch["input_ids"].numel() <= 16 and batch["labels"].numel() <= 16
        assert (batch["input_ids"] == tiny_tok.pad_token_id).sum() == (batch["attention_mask"] == 0).sum()
        seen += batch["input_ids"].shape[0]
    assert seen == 4


def test_every_exported_name_exists_and_is_documented():
    for name in data_module.__all__:
        assert getattr(data_module, name).__doc__, name


def test_read_text_lines_keeps_blank_lines_reads_gzip_and_names_a_bad_line(tmp_path):
    (tmp_path / "a.txt").write_text("one\n\n  \nfour\n", encoding="utf-8")
    assert data_module.read_text_lines(tmp_path / "a.txt") == ["one", "", "  ", "four"]
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("eins\nzwei\n")
    assert data_module.read_text_lines(tmp_path / "b.txt.gz") == ["eins", "zwei"]
    (tmp_path / "c.txt").write_bytes("ok\n".encode() + "Grüße\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"c.txt is not UTF-8: line 2"):
        data_module.read_text_lines(tmp_path / "c.txt")
    with pytest.raises(ValueError, match="File not found"):
        data_module.read_text_lines(tmp_path / "missing.txt")
