"""Parallel-corpus loading, tokenisation and length-bucketed batching for translation training.

Three steps, each usable on its own:

1. :func:`load_parallel_corpus` reads aligned text files, a TSV or JSON(L) file, a folder of
   ``{split}.{lang}`` files, or a Hub dataset such as ``wmt14``, and always returns
   ``datasets`` objects with exactly two string columns, ``source`` and ``target``. Bad input
   (missing, empty, misaligned or non-UTF-8 files) fails early with a ``ValueError`` that says
   which file and what to do. :func:`local_corpus_readers` gives the same local splits as readers
   that stream their pairs, for corpora too large to hold in memory.
2. :func:`tokenize_corpus` adds ``input_ids`` / ``labels`` (and their lengths) and drops the pairs
   that are empty or longer than ``max_length`` tokens: nothing is silently truncated.
3. :class:`TokenBucketBatchSampler` batches "by approximate sequence length" with a cap on tokens
   per batch, as the paper does (§5.1: ~25,000 source and ~25,000 target tokens per batch), and
   shards the batches across data-parallel processes. :func:`collate_batch` pads a batch.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from datasets import Dataset, DatasetDict, Features, Value
from torch.utils.data import Sampler

from .modeling_vanilla_transformer import shift_tokens_right

__all__ = [
    "PairReader",
    "TokenBucketBatchSampler",
    "collate_batch",
    "collate_pairs",
    "load_parallel_corpus",
    "local_corpus_readers",
    "read_text_lines",
    "tokenize_corpus",
]

_FEATURES = Features({"source": Value("string"), "target": Value("string")})
# Split names that mean "validation" in file names; they are returned as "validation", the name
# Hub datasets (e.g. wmt14) use, so callers need not care where the data came from.
_SPLIT_ALIASES = {"val": "validation", "valid": "validation", "dev": "validation"}
_JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
_TSV_SUFFIXES = (".tsv", ".tsv.gz")
# owner/name or name, as the Hub spells dataset ids.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


# --------------------------------------------------------------------------------------------
# 1. Loading
# --------------------------------------------------------------------------------------------


def load_parallel_corpus(
    source: str | os.PathLike,
    src_lang: str,
    tgt_lang: str,
    split: str | None = None,
    hub_config: str | None = None,
) -> DatasetDict | Dataset:
    """Load a sentence-aligned parallel corpus as ``source``/``target`` string columns.

    ``source`` is tried as, in this order:

    * a folder holding ``{split}.{lang}`` files (optionally ``.gz``), e.g. ``train.en``/``train.de``,
      ``val.en``/``val.de``: one split per file pair. ``val``, ``valid`` and ``dev`` are returned as
      ``"validation"``;
    * a ``.tsv`` file (``source<TAB>target`` per line; further columns, such as Tatoeba's
      attribution column, are ignored);
    * a ``.jsonl`` / ``.json`` file of ``{"translation": {src_lang: ..., tgt_lang: ...}}`` or
      ``{src_lang: ..., tgt_lang: ...}`` records (a ``.json`` file may also hold one JSON list);
    * a path prefix ``path/name`` meaning ``path/name.{src_lang}`` + ``path/name.{tgt_lang}``
      (optionally ``.gz``);
    * otherwise a Hub dataset name, e.g. ``"wmt14"`` with ``hub_config="de-en"``, loaded with
      ``datasets.load_dataset`` (this needs the Hub, or its local cache).

    Lines of text files are stripped of surrounding whitespace; blank lines are kept in aligned
    text files (alignment is by line number) and skipped in TSV/JSONL files.

    A folder or Hub dataset gives one entry per split. A single file or prefix is one split,
    named after the file for a prefix (``path/val`` -> ``"validation"``) and ``"train"`` for a
    TSV/JSON file, as ``datasets.load_dataset`` names ``data_files``.

    Args:
        source: folder, file, path prefix or Hub dataset name (see above).
        src_lang / tgt_lang: language codes, used as file suffixes and record keys (``"en"``, ``"de"``).
        split: return only this split, as a ``Dataset``. For a single file or prefix the one
            split is returned whatever its name.
        hub_config: configuration of a Hub dataset (``"de-en"`` for ``wmt14``).

    Returns:
        ``DatasetDict`` keyed by split, or a ``Dataset`` when ``split`` is given.

    Raises:
        ValueError: missing, empty, misaligned or non-UTF-8 files; malformed TSV/JSON lines;
            an unknown split; a name that is neither a local path nor a loadable Hub dataset.
    """
    readers = local_corpus_readers(source, src_lang, tgt_lang, split)
    if readers is None:
        splits = _load_hub(str(source), src_lang, tgt_lang, None if split is None else str(split), hub_config)
    else:
        splits = {key: _pairs_to_dataset(read()) for key, read in readers.items()}

    # One code path for every format from here on.
    for key, ds in splits.items():
        assert ds.column_names == ["source", "target"], (key, ds.column_names)
    if split is None:
        return DatasetDict(splits)
    return next(iter(splits.values())) if len(splits) == 1 else splits[_resolve_split(str(split), splits, str(source))]


class PairReader:
    """One split of a local corpus: calling it reads the split's ``(source, target)`` pairs anew, one at a time,
    from ``files``, with the checks of :func:`load_parallel_corpus` (a misaligned, empty or non-UTF-8 file raises
    ``ValueError`` when the reading reaches the problem). Reading a corpus this way holds one pair at a time, not
    the corpus: how a corpus of any size is tokenised (:mod:`~vanilla_transformer.prepared`)."""

    def __init__(self, files: Sequence[Path], read: Callable[[], Iterator[tuple[str, str]]]):
        self.files, self._read = tuple(files), read

    def __call__(self) -> Iterator[tuple[str, str]]:
        return self._read()


def local_corpus_readers(
    source: str | os.PathLike, src_lang: str, tgt_lang: str, split: str | None = None
) -> dict[str, PairReader] | None:
    r"""The splits of a local corpus (any form :func:`load_parallel_corpus` takes but a Hub name) as
    :class:`PairReader`\ s, without reading the pairs yet; None if ``source`` names a Hub dataset.

    Files are looked for now (a missing one raises ``ValueError``); their lines are read when a reader is called.
    With ``split``, the one reader is returned under that name (a single file or prefix holds one split, whatever
    its name).
    """
    name = str(source)
    path = Path(name).expanduser()
    src_file, tgt_file = Path(f"{path}.{src_lang}"), Path(f"{path}.{tgt_lang}")
    if path.is_dir():
        readers = _folder_readers(path, src_lang, tgt_lang, split)
    elif name.endswith(_TSV_SUFFIXES):
        tsv = _require_file(path)
        readers = {"train": PairReader([tsv], lambda: _tsv_pairs(tsv))}
    elif name.endswith(_JSON_SUFFIXES):
        records = _require_file(path)
        readers = {"train": PairReader([records], lambda: zip(*_read_json(records, src_lang, tgt_lang), strict=True))}
    elif path.is_file() and not (_exists_maybe_gz(src_file) or _exists_maybe_gz(tgt_file)):
        raise ValueError(
            f"Unsupported file {path}: expected a .tsv, .jsonl or .json file (optionally .gz), a folder, or the "
            f"prefix of aligned files (path/train for path/train.{src_lang} + path/train.{tgt_lang}). A "
            f"tab-separated file such as Tatoeba's deu.txt can be renamed to .tsv."
        )
    elif _exists_maybe_gz(src_file) or _exists_maybe_gz(tgt_file) or _looks_local(name):
        files = (_require_file_maybe_gz(src_file), _require_file_maybe_gz(tgt_file))
        readers = {_split_name(path.name): PairReader(files, lambda: _aligned_pairs(*files))}
    else:
        return None
    if split is None:
        return readers
    if len(readers) == 1:
        return {str(split): next(iter(readers.values()))}
    key = _resolve_split(str(split), readers, name)
    return {key: readers[key]}


def _pairs_to_dataset(pairs: Iterable[tuple[str, str]]) -> Dataset:
    sources, targets = [], []
    for source, target in pairs:
        sources.append(source)
        targets.append(target)
    return Dataset.from_dict({"source": sources, "target": targets}, features=_FEATURES)


def _split_name(stem: str) -> str:
    return _SPLIT_ALIASES.get(stem, stem)


def _resolve_split(split: str, available: Mapping[str, Any], where: str) -> str:
    for candidate in (split, _split_name(split)):
        if candidate in available:
            return candidate
    raise ValueError(f"Split {split!r} not found in {where}; available splits: {sorted(available)}.")


def _looks_local(name: str) -> bool:
    """True if ``name`` can only be meant as a local path (so it is not sent to the Hub)."""
    if name.startswith(("/", "./", "../", "~")) or (os.sep != "/" and os.sep in name) or name.count("/") > 1:
        return True
    parent = Path(name).expanduser().parent
    return str(parent) != "." and parent.is_dir()


def _exists_maybe_gz(path: Path) -> bool:
    return path.is_file() or path.with_name(path.name + ".gz").is_file()


def _require_file(path: Path) -> Path:
    if not path.is_file():
        raise ValueError(f"File not found: {path}")
    return path


def _require_file_maybe_gz(path: Path) -> Path:
    """``path`` or ``path.gz``, whichever exists (an error if both or neither do)."""
    gz = path.with_name(path.name + ".gz")
    if path.is_file() and gz.is_file():
        raise ValueError(f"Both {path} and {gz} exist; keep only one of them.")
    if gz.is_file():
        return gz
    if not path.is_file():
        raise ValueError(f"File not found: {path} (nor {gz.name}). Expected aligned files {path.stem}.<lang>[.gz].")
    return path


def _folder_readers(folder: Path, src_lang: str, tgt_lang: str, split: str | None) -> dict[str, PairReader]:
    stems: dict[str, str] = {}  # split name -> file stem
    for f in sorted(folder.iterdir()):
        for lang in (src_lang, tgt_lang):
            for suffix in (f".{lang}", f".{lang}.gz"):
                if f.is_file() and f.name.endswith(suffix) and len(f.name) > len(suffix):
                    stem = f.name[: -len(suffix)]
                    key = _split_name(stem)
                    if stems.setdefault(key, stem) != stem:
                        raise ValueError(
                            f"{folder} holds two files for split {key!r}: {stems[key]}.{lang} and {stem}.{lang}; "
                            f"keep one of them."
                        )
    if not stems:
        present = sorted(p.name for p in folder.iterdir())[:10]
        raise ValueError(
            f"No parallel files found in folder {folder}: expected {{split}}.{src_lang} + {{split}}.{tgt_lang} "
            f"(e.g. train.{src_lang}, train.{tgt_lang}); found {present}."
        )
    if split is not None:
        key = _resolve_split(split, stems, str(folder))
        stems = {key: stems[key]}
    # Check that every file exists before reading any of them.
    files = {
        key: (
            _require_file_maybe_gz(folder / f"{stem}.{src_lang}"),
            _require_file_maybe_gz(folder / f"{stem}.{tgt_lang}"),
        )
        for key, stem in stems.items()
    }
    return {key: PairReader(pair, lambda pair=pair: _aligned_pairs(*pair)) for key, pair in files.items()}


def _iter_utf8_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` with the line ending removed; a clear error for bad bytes."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            # Iterating a binary file splits on b"\n" only, unlike str.splitlines(), which would also
            # split on U+2028, U+0085, ... inside a sentence and break the alignment.
            for lineno, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    bad = raw[err.start : err.start + 1]
                    raise ValueError(
                        f"{path} is not UTF-8: line {lineno}, byte {err.start} of the line is {bad!r}. "
                        f"Re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)."
                    ) from None
                if lineno == 1:
                    line = line.removeprefix("\ufeff")  # byte-order mark
                yield lineno, line.rstrip("\r\n")
    except gzip.BadGzipFile as err:
        raise ValueError(f"{path} ends in .gz but is not a gzip file ({err}).") from None


def read_text_lines(path: str | os.PathLike) -> list[str]:
    """Every line of a UTF-8 text file (``.gz`` too), without its line ending; blank lines are kept.

    Raises:
        ValueError: the file is missing, is not UTF-8 (the message names the line), or is not gzip despite ``.gz``.
    """
    return [line for _, line in _iter_utf8_lines(_require_file(Path(path).expanduser()))]


def _empty_file(path: Path, lines: int) -> ValueError:
    return ValueError(f"File is empty: {path}" + (f" ({lines} blank lines)" if lines else ""))


def _aligned_pairs(src_file: Path, tgt_file: Path) -> Iterator[tuple[str, str]]:
    """Line ``i`` of one file with line ``i`` of the other, stripped; read in step, so that only the current pair
    is held. An empty file (no text on any line) or files of different lengths raise when the end is reached."""
    sides = (_iter_utf8_lines(src_file), _iter_utf8_lines(tgt_file))
    count, text = [0, 0], [False, False]
    for pair in itertools.zip_longest(*sides):
        if None in pair:  # one file ended: count (and look for text in) the rest of the other
            longer = pair.index(None) ^ 1
            for _, line in itertools.chain([pair[longer]], sides[longer]):
                count[longer] += 1
                text[longer] = text[longer] or bool(line.strip())
            break
        stripped = pair[0][1].strip(), pair[1][1].strip()
        for side in (0, 1):
            count[side] += 1
            text[side] = text[side] or bool(stripped[side])
        if count[0] == count[1]:
            yield stripped
    for side, path in enumerate((src_file, tgt_file)):
        if not text[side]:
            raise _empty_file(path, count[side])
    if count[0] != count[1]:
        raise ValueError(
            f"Misaligned parallel files: {src_file} has {count[0]} lines but {tgt_file} has "
            f"{count[1]} lines. Line i of one must translate line i of the other."
        )


def _tsv_pairs(path: Path) -> Iterator[tuple[str, str]]:
    """The first two fields of each non-blank line; a line without a TAB raises, naming it."""
    found = False
    for lineno, line in _iter_utf8_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise ValueError(f"{path}, line {lineno}: expected 'source<TAB>target', found no TAB: {line[:80]!r}")
        found = True
        yield fields[0].strip(), fields[1].strip()
    if not found:
        raise ValueError(f"File is empty: {path}")


def _read_json(path: Path, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Records from a JSON-lines file, or from a ``.json`` file holding one list of records."""
    records: list[tuple[str, Any]] = []  # (where, record)
    whole = None
    if not path.name.endswith((".jsonl", ".jsonl.gz")):
        text = "\n".join(line for _, line in _iter_utf8_lines(path))
        try:
            whole = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            whole = None  # not one JSON document: read it as JSON lines below
        if isinstance(whole, dict) and isinstance(whole.get("data"), list):
            whole = whole["data"]
        if isinstance(whole, dict):
            whole = [whole]
        if isinstance(whole, list):
            records = [(f"record {i + 1}", r) for i, r in enumerate(whole)]
    if whole is None:
        for lineno, line in _iter_utf8_lines(path):
            if not line.strip():
                continue
            try:
                records.append((f"line {lineno}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {lineno}: not valid JSON ({err.msg}).") from None
    if not records:
        raise ValueError(f"File is empty: {path}")

    sources, targets = [], []
    for where, record in records:
        pair = record.get("translation", record) if isinstance(record, dict) else None
        if not isinstance(pair, dict) or not all(isinstance(pair.get(k), str) for k in (src_lang, tgt_lang)):
            keys = sorted(pair) if isinstance(pair, dict) else type(record).__name__
            raise ValueError(
                f"{path}, {where}: expected {{'translation': {{'{src_lang}': str, '{tgt_lang}': str}}}} or "
                f"{{'{src_lang}': str, '{tgt_lang}': str}}, found keys {keys}."
            )
        sources.append(pair[src_lang].strip())
        targets.append(pair[tgt_lang].strip())
    return sources, targets


def _load_hub(name: str, src_lang: str, tgt_lang: str, split: str | None, hub_config: str | None) -> dict[str, Dataset]:
    if not _HUB_ID.match(name):
        raise ValueError(
            f"{name!r} is neither an existing file, folder or path prefix ({name}.{src_lang}) nor a valid "
            f"Hub dataset name (such as 'wmt14')."
        )
    what = f"Hub dataset {name!r}" + (f" (config {hub_config!r})" if hub_config else "")
    try:
        loaded = datasets.load_dataset(name, hub_config, split=split)
    except datasets.exceptions.DatasetNotFoundError as err:
        raise ValueError(
            f"Unknown dataset {name!r}: it is not a local file, folder or path prefix ({name}.{src_lang}), "
            f"and the Hugging Face Hub does not have it or cannot be reached ({err})."
        ) from err
    except Exception as err:  # ConnectionError, offline mode, missing config, ...
        raise ValueError(
            f"Could not load {what}: {name!r} is not a local file, folder or path prefix ({name}.{src_lang}), "
            f"so it was looked up with datasets.load_dataset, which failed with {type(err).__name__}: {err}. "
            f"If the Hub is unreachable (offline machine), use local files instead: a folder of "
            f"{{split}}.{src_lang}/{{split}}.{tgt_lang} files, a .tsv or a .jsonl file."
        ) from err

    parts = {split: loaded} if isinstance(loaded, Dataset) else dict(loaded)
    return {key: _hub_columns(ds, name, src_lang, tgt_lang) for key, ds in parts.items()}


def _hub_columns(ds: Dataset, name: str, src_lang: str, tgt_lang: str) -> Dataset:
    """Map a Hub split to source/target columns, staying Arrow-backed (WMT14 has 4.5M pairs)."""
    if "translation" in ds.column_names:
        langs = list(getattr(ds.features["translation"], "languages", None) or ds.features["translation"])
        missing = [k for k in (src_lang, tgt_lang) if k not in langs]
        if missing:
            raise ValueError(f"Hub dataset {name!r} has no language(s) {missing}; its pairs have {langs}.")

        def convert(batch: dict[str, list]) -> dict[str, list]:
            pairs = batch["translation"]
            return {"source": [p[src_lang] for p in pairs], "target": [p[tgt_lang] for p in pairs]}

    elif src_lang in ds.column_names and tgt_lang in ds.column_names:

        def convert(batch: dict[str, list]) -> dict[str, list]:
            return {"source": batch[src_lang], "target": batch[tgt_lang]}

    else:
        raise ValueError(
            f"Hub dataset {name!r} has columns {ds.column_names}; expected 'translation' or "
            f"{src_lang!r} and {tgt_lang!r}."
        )
    return ds.map(convert, batched=True, remove_columns=ds.column_names, features=_FEATURES, desc="Selecting languages")


# --------------------------------------------------------------------------------------------
# 2. Tokenisation
# --------------------------------------------------------------------------------------------


def tokenize_corpus(
    dataset: Dataset, tokenizer: Any, max_length: int = 256, num_proc: int | None = None
) -> tuple[Dataset, int]:
    """Tokenise ``source``/``target`` and drop pairs that are empty or too long.

    Adds ``input_ids`` (source ids, ``</s>`` included), ``labels`` (target ids, ``</s>`` included,
    from ``tokenizer(..., text_target=...)``), ``src_len`` and ``tgt_len``; nothing is padded or
    truncated. The ``source``/``target`` text columns are kept (e.g. as BLEU references).

    Returns:
        ``(kept, n_dropped)``: the pairs whose both sides are non-empty and at most ``max_length``
        tokens long, and how many pairs were removed (for the caller to report).
    """
    if isinstance(dataset, DatasetDict):
        raise TypeError("tokenize_corpus takes one split (a Dataset); call it once per split of the DatasetDict.")
    missing = {"source", "target"} - set(dataset.column_names)
    if missing:
        raise ValueError(
            f"Dataset lacks column(s) {sorted(missing)}; got {dataset.column_names}. Use load_parallel_corpus."
        )

    def encode(batch: dict[str, list]) -> dict[str, list]:
        # verbose=False: over-long pairs are dropped below, a "longer than model_max_length" warning is noise.
        enc = tokenizer(batch["source"], text_target=batch["target"], return_attention_mask=False, verbose=False)
        return {
            "input_ids": enc["input_ids"],
            "labels": enc["labels"],
            "src_len": [len(ids) for ids in enc["input_ids"]],
            "tgt_len": [len(ids) for ids in enc["labels"]],
        }

    def keep(sources: list[str], targets: list[str], src_len: list[int], tgt_len: list[int]) -> list[bool]:
        return [
            bool(s.strip()) and bool(t.strip()) and a <= max_length and b <= max_length
            for s, t, a, b in zip(sources, targets, src_len, tgt_len, strict=True)
        ]

    encoded = dataset.map(encode, batched=True, num_proc=num_proc, desc="Tokenizing")
    kept = encoded.filter(
        keep,
        batched=True,
        input_columns=["source", "target", "src_len", "tgt_len"],
        num_proc=num_proc,
        desc="Filtering",
    )
    return kept, len(encoded) - len(kept)


# --------------------------------------------------------------------------------------------
# 3. Batching
# --------------------------------------------------------------------------------------------


class TokenBucketBatchSampler(Sampler[list[int]]):
    """Batches of similar-length pairs, capped in padded tokens, sharded across processes.

    The paper (§5.1): "Sentence pairs were batched together by approximate sequence length. Each
    training batch contained a set of sentence pairs containing approximately 25000 source tokens
    and 25000 target tokens." Here:

    * Examples are sorted by (source length, target length), ties broken by a random permutation
      drawn from ``seed``, and cut greedily into batches such that, for the source and for the
      target side separately, ``len(batch) * max(length in batch) <= max_tokens`` (the number of
      tokens after padding). The batches are built once, so ``len()`` never changes.
    * An example longer than ``max_tokens`` on either side gets a batch of its own (which then
      exceeds the cap) and a warning is issued; filter such pairs beforehand
      (``tokenize_corpus(max_length=...)``).
    * Each epoch the batch order is shuffled with ``seed + epoch`` (call :meth:`set_epoch`), or
      kept shortest-first if ``shuffle=False``.
    * Sharding: rank ``r`` of ``num_replicas`` takes batches ``r, r + num_replicas, ...`` of that
      order, so ranks get disjoint batches. To give every rank the same number of batches, as
      ``torch.utils.data.DistributedSampler`` does, the order is padded by *repeating* its first
      few batches (``drop_last=False``), or its last ``len % num_replicas`` batches are *dropped*
      for this epoch (``drop_last=True``). All ranks must pass the same lengths and seed.

    Args:
        lengths: ``(src_len, tgt_len)`` per example (a sequence of pairs or an ``(N, 2)`` array), or
            two sequences ``(src_lens, tgt_lens)``. With exactly two examples the two readings
            coincide in shape and ``lengths`` is read as pairs; pass ``tgt_lengths`` to be explicit.
        max_tokens: cap on padded tokens per batch and per side, in this process. The paper's ~25000
            tokens per training batch were spread over 8 GPUs: the same global batch is
            ``max_tokens ≈ 25000 / num_replicas`` (a little more, as padding counts here).
        shuffle: shuffle the batch order each epoch.
        seed: seed of the tie-break and of the shuffles.
        num_replicas / rank: number of data-parallel processes and this process's index.
        drop_last: drop instead of repeat batches to even out the shards (see above).
        tgt_lengths: if given, ``lengths`` holds the source lengths and this the target lengths.
    """

    def __init__(
        self,
        lengths: Sequence[Sequence[int]] | Sequence[int] | np.ndarray,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
        *,
        tgt_lengths: Sequence[int] | None = None,
    ) -> None:
        src, tgt = _split_lengths(lengths, tgt_lengths)
        if int(max_tokens) < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens}.")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(
                f"Need num_replicas >= 1 and 0 <= rank < num_replicas, got rank={rank}, num_replicas={num_replicas}."
            )
        self.max_tokens = int(max_tokens)
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.num_replicas, self.rank = num_replicas, rank
        self.epoch = 0

        too_long = int(np.count_nonzero((src > self.max_tokens) | (tgt > self.max_tokens)))
        if too_long:
            warnings.warn(
                f"{too_long} example(s) are longer than max_tokens={self.max_tokens} and get a batch of their "
                f"own, above the cap; filter them out (tokenize_corpus(max_length=...)) or raise max_tokens.",
                stacklevel=2,
            )
        tie_break = np.random.default_rng(seed).permutation(len(src))
        order = np.lexsort((tie_break, tgt, src))  # last key is the primary one
        # The batches as one array of indices and where each batch starts: a few bytes an example, not a Python
        # list of ints (36 bytes an example; 160 MB for WMT14's 4.5M pairs)
        self._order = order
        self._starts = _greedy_batches(order, src, tgt, self.max_tokens)

    @property
    def batches(self) -> list[list[int]]:
        """Every batch, in the order before shuffling (a list built on each access)."""
        return [self._batch(k) for k in range(len(self._starts) - 1)]

    def _batch(self, k: int) -> list[int]:
        return self._order[self._starts[k] : self._starts[k + 1]].tolist()

    def set_epoch(self, epoch: int) -> None:
        """Select the batch order of ``epoch`` (call before iterating, on every rank)."""
        self.epoch = epoch

    def __len__(self) -> int:
        n = len(self._starts) - 1
        return n // self.num_replicas if self.drop_last else math.ceil(n / self.num_replicas)

    def __iter__(self) -> Iterator[list[int]]:
        n = len(self._starts) - 1
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n).tolist()
        else:
            order = list(range(n))
        total = len(self) * self.num_replicas
        if total <= n:
            order = order[:total]
        else:  # repeat from the start (cyclically, in case there are fewer batches than ranks)
            order = (order * math.ceil(total / n))[:total]
        for k in order[self.rank :: self.num_replicas]:
            yield self._batch(k)


_COLUMN = getattr(datasets.arrow_dataset, "Column", ())  # a lazy dataset column, e.g. ds["src_len"]


def _as_int_array(x: Any) -> np.ndarray:
    # Slicing a datasets Column reads it in one go; iterating it (as numpy would) is ~100x slower.
    if isinstance(x, _COLUMN):
        x = x[:]
    elif isinstance(x, (list, tuple)) and len(x) == 2 and all(isinstance(e, _COLUMN) for e in x):
        x = [e[:] for e in x]
    return np.asarray(x, dtype=np.int64)


def _split_lengths(lengths: Any, tgt_lengths: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(src_lens, tgt_lens)`` as flat int arrays, from any of the accepted ``lengths`` layouts."""
    usage = (
        "lengths must be (src_len, tgt_len) pairs or two sequences (src_lens, tgt_lens); for source "
        "lengths only, pass the target lengths as tgt_lengths=."
    )
    try:
        arr = _as_int_array(lengths)
        tgt = None if tgt_lengths is None else _as_int_array(tgt_lengths)
    except (TypeError, ValueError):
        raise ValueError(usage) from None
    if tgt is not None:
        if arr.shape != tgt.shape or arr.ndim != 1:
            raise ValueError(
                f"lengths and tgt_lengths must be flat and equally long, got shapes {arr.shape} and {tgt.shape}."
            )
        src = arr
    elif arr.size == 0:
        src = tgt = np.zeros(0, np.int64)
    elif arr.ndim == 2 and arr.shape[1] == 2:
        src, tgt = arr[:, 0], arr[:, 1]
    elif arr.ndim == 2 and arr.shape[0] == 2:
        src, tgt = arr[0], arr[1]
    else:
        raise ValueError(f"{usage} Got an array of shape {arr.shape}.")
    if src.size and min(src.min(), tgt.min()) < 0:
        raise ValueError("lengths must be non-negative.")
    return src, tgt


def _greedy_batches(order: np.ndarray, src: np.ndarray, tgt: np.ndarray, cap: int) -> np.ndarray:
    """Where each batch starts in ``order`` (and, last, ``len(order)``): examples are added in order until one
    more would take the padded source or target tokens above ``cap``."""
    starts: list[int] = [0]
    size = max_src = max_tgt = 0
    for begin in range(0, len(order), 1 << 16):  # Python ints a slice at a time, not 4.5M of them at once
        part = order[begin : begin + (1 << 16)]
        for s, t in zip(src[part].tolist(), tgt[part].tolist()):
            new_src, new_tgt = max(max_src, s), max(max_tgt, t)
            if size and (new_src * (size + 1) > cap or new_tgt * (size + 1) > cap):
                starts.append(starts[-1] + size)  # adding this example would exceed the cap: close the batch
                size, new_src, new_tgt = 0, s, t
            size += 1
            max_src, max_tgt = new_src, new_tgt
    return np.asarray(starts + [len(order)] if size else starts, dtype=np.int64)


def collate_batch(
    examples: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    label_pad_token_id: int = -100,
    decoder_start_token_id: int | None = None,
    pad_to_multiple_of: int | None = None,
) -> dict[str, torch.Tensor]:
    """Right-pad a list of tokenised examples into tensors.

    Returns ``input_ids`` (padded with ``pad_token_id``), ``attention_mask`` (1 on real tokens) and
    ``labels`` (padded with ``label_pad_token_id`` = -100, which the loss ignores). If
    ``decoder_start_token_id`` is given, also ``decoder_input_ids``: the labels shifted right behind
    that start token, padded with ``pad_token_id`` (needed e.g. when the Trainer's label smoother
    removes ``labels`` before the forward pass). Other keys of the examples are ignored.
    """

    def pad(seqs: list[list[int]], value: int) -> torch.Tensor:
        width = max((len(s) for s in seqs), default=0)
        if pad_to_multiple_of:
            width = math.ceil(width / pad_to_multiple_of) * pad_to_multiple_of
        out = torch.full((len(seqs), width), value, dtype=torch.long)
        for row, s in enumerate(seqs):  # lists, or arrays of any integer type (a prepared corpus's uint16 rows)
            out[row, : len(s)] = torch.from_numpy(np.asarray(s, dtype=np.int64))
        return out

    inputs = [e["input_ids"] for e in examples]
    batch = {
        "input_ids": pad(inputs, pad_token_id),
        "attention_mask": pad([[1] * len(s) for s in inputs], 0),
    }
    if all("labels" in e for e in examples):
        labels = [e["labels"] for e in examples]
        batch["labels"] = pad(labels, label_pad_token_id)
        if decoder_start_token_id is not None:
            # The model's own shift (label padding becomes pad_token_id), then padding where the labels are
            # padding: position n of a row of n labels would otherwise read its last label.
            ignored = batch["labels"].masked_fill(batch["labels"] == label_pad_token_id, -100)
            shifted = shift_tokens_right(ignored, pad_token_id, decoder_start_token_id)
            batch["decoder_input_ids"] = shifted.masked_fill(pad([[1] * len(s) for s in labels], 0) == 0, pad_token_id)
    return batch


def collate_pairs(
    input_ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], indices: list[int], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """The padded batch of pairs ``indices``; without ``attention_mask`` when no source is padded (known here, on
    the host, so that the model need not read the mask back from the device to skip it)."""
    batch = collate_batch(
        [{"input_ids": input_ids[i], "labels": labels[i]} for i in indices], pad_token_id=pad_token_id
    )
    if len({len(input_ids[i]) for i in indices}) == 1:
        del batch["attention_mask"]
    return batch
