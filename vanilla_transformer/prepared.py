"""A corpus tokenised once, into flat token arrays that every process memory-maps.

Training on a large corpus should not tokenise it again in every process and on every restart, nor hold it in
every process's own memory. :func:`prepare_split` tokenises one split a chunk at a time and streams it to disk as
fairseq's ``fairseq-preprocess`` does: per side, the token ids of all pairs end to end in one flat binary file
(2 bytes per token for vocabularies up to 65,536) and the offsets where each pair starts; the texts likewise, as
UTF-8 bytes. :func:`load_prepared_split` maps those files read-only (``numpy.memmap``): the pages are the
operating system's page cache, shared by all processes of a machine, and only the pairs a process reads are
loaded. Token-bucket batching reads only the length arrays.

Why flat arrays rather than Arrow (``datasets``): the training loop reads rows of ids by index, and a flat
array gives each row as a view with no per-row objects; the files are plain numpy, readable without this package.

:func:`prepared_split_folder` names a split's folder by what determines its contents (the corpus files, the
tokenizer and ``max_length``), so that a second run, or a resume, on the same corpus finds it ready. The cache
lives in ``$VANILLA_TRANSFORMER_CACHE`` (default ``~/.cache/vanilla_transformer``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm
from transformers import TokenizersBackend

from .checkpoints import save_folder_atomically

__all__ = [
    "PREPARED_FORMAT",
    "PreparedSplit",
    "RaggedArray",
    "RaggedText",
    "cache_folder",
    "file_digest",
    "is_prepared",
    "load_prepared_split",
    "mark_absent",
    "prepare_split",
    "prepared_split_folder",
]

#: The layout of a prepared split; a new layout gets a new number, so that older folders are not read as newer.
PREPARED_FORMAT = 1
_META = "meta.json"
_ABSENT = "absent.json"
_CHUNK = 50_000  # pairs tokenised at a time


class RaggedArray(Sequence):
    """Rows of different lengths in one flat array: row ``i`` is ``flat[offsets[i]:offsets[i + 1]]``, a view."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat, self.offsets = flat, offsets
        self._lengths: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        return self.flat[self.offsets[index] : self.offsets[index + 1]]

    @property
    def lengths(self) -> np.ndarray:
        """The rows' lengths (computed from the offsets once)."""
        if self._lengths is None:
            self._lengths = np.diff(self.offsets)
        return self._lengths


class RaggedText(RaggedArray):
    """Strings stored as one flat array of UTF-8 bytes and offsets; row ``i`` is decoded when it is read."""

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return bytes(super().__getitem__(index)).decode("utf-8")


class PreparedSplit:
    """One prepared split: ``input_ids`` and ``labels`` (token ids, ``</s>`` included) and the ``sources`` and
    ``targets`` texts of the pairs kept, each indexable by pair, plus how many pairs were ``dropped``."""

    def __init__(
        self, input_ids: RaggedArray, labels: RaggedArray, sources: RaggedText, targets: RaggedText, dropped: int
    ):
        self.input_ids, self.labels, self.sources, self.targets, self.dropped = (
            input_ids,
            labels,
            sources,
            targets,
            dropped,
        )


def cache_folder() -> Path:
    """Where prepared corpora are kept: ``$VANILLA_TRANSFORMER_CACHE/prepared``
    (default ``~/.cache/vanilla_transformer``)."""
    root = os.environ.get("VANILLA_TRANSFORMER_CACHE") or Path.home() / ".cache" / "vanilla_transformer"
    return Path(root) / "prepared"


def file_digest(paths: Iterable[str | os.PathLike]) -> str:
    """SHA-256 of the named files' bytes, in the order given (what a cached preparation of them is keyed by)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(Path(path).name).encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def prepared_split_folder(
    corpus_identity: str, tokenizer_json: str | os.PathLike, max_length: int, root: Path | None = None
) -> Path:
    """The folder of a prepared split, named by everything its contents depend on: ``corpus_identity`` (e.g. a
    :func:`file_digest` of its files, with the split's name and languages), the tokenizer (its ``tokenizer.json``
    bytes) and ``max_length``."""
    key = json.dumps([PREPARED_FORMAT, corpus_identity, file_digest([tokenizer_json]), int(max_length)])
    return (root or cache_folder()) / hashlib.sha256(key.encode()).hexdigest()[:32]


def prepare_split(
    pairs: Iterable[tuple[str, str]], tokenizer: Any, max_length: int, folder: Path, progress: bool = False
) -> int:
    """Tokenise ``pairs`` (``(source, target)`` texts, e.g. from a :class:`~vanilla_transformer.data.PairReader`)
    a chunk at a time into ``folder``, dropping the pairs that are empty or longer than ``max_length`` tokens on
    either side, as ``data.tokenize_corpus`` does (the same ids: ``tokenizer(source, text_target=target)``).
    Memory holds one chunk, whatever the corpus size. The folder appears complete or not at all (an error while
    reading leaves nothing behind). Returns the number of pairs dropped."""
    dtype = np.uint16 if len(tokenizer) <= 1 << 16 else np.int32
    counts = {"pairs": 0, "dropped": 0}
    encode = _encoder(tokenizer)

    def write(staging: Path) -> None:
        staging.mkdir(parents=True)
        names = ("input_ids", "labels", "sources", "targets")
        files = {name: open(staging / f"{name}.bin", "wb") for name in names}
        offsets = {name: [np.zeros(1, np.int64)] for name in names}
        ends = dict.fromkeys(names, 0)
        stream = iter(pairs)
        chunks = iter(lambda: list(itertools.islice(stream, _CHUNK)), [])
        bar = tqdm(desc=f"preparing {Path(folder).name[:8]}", unit=" pairs", unit_scale=True, disable=not progress)
        # The next chunk is read and encoded in a thread (the Rust tokenizer releases the GIL) while this one
        # is written. Two chunks encoded at once in two threads took the same time (docs/performance-log.md).
        try:
            with ThreadPoolExecutor(max_workers=1) as pool:
                pending = pool.submit(_read_and_encode, chunks, encode)
                while (done := pending.result()) is not None:
                    pending = pool.submit(_read_and_encode, chunks, encode)
                    sources, targets, source_ids, target_ids = done
                    kept = [
                        i
                        for i, (s, t, a, b) in enumerate(zip(sources, targets, source_ids, target_ids, strict=True))
                        if s.strip() and t.strip() and len(a) <= max_length and len(b) <= max_length
                    ]
                    counts["pairs"] += len(kept)
                    counts["dropped"] += len(sources) - len(kept)
                    rows = {
                        "input_ids": [source_ids[i] for i in kept],
                        "labels": [target_ids[i] for i in kept],
                        "sources": [sources[i].encode("utf-8") for i in kept],
                        "targets": [targets[i].encode("utf-8") for i in kept],
                    }
                    for name, values in rows.items():
                        if not values:
                            continue
                        lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
                        if name in ("input_ids", "labels"):
                            flat = np.fromiter(
                                itertools.chain.from_iterable(values), dtype=dtype, count=int(lengths.sum())
                            )
                            files[name].write(flat.tobytes())
                        else:
                            files[name].write(b"".join(values))
                        offsets[name].append(ends[name] + np.cumsum(lengths))
                        ends[name] += int(lengths.sum())
                    bar.update(len(sources))
        finally:
            bar.close()
            for f in files.values():
                f.close()
        for name in names:
            np.save(staging / f"{name}.offsets.npy", np.concatenate(offsets[name]))
        meta = {"format": PREPARED_FORMAT, "dtype": np.dtype(dtype).name, "max_length": int(max_length), **counts}
        (staging / _META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    save_folder_atomically(Path(folder), write)
    return counts["dropped"]


def _encoder(tokenizer: Any):
    """``encode(texts) -> ids``, as ``tokenizer(texts)["input_ids"]`` (and ``text_target=``) give them.

    A plain ``tokenizers``-backed tokenizer (the class ``AutoTokenizer`` gives for a ``tokenizer.json``) encodes
    sources and targets alike, so its Rust tokenizer is called directly, without transformers' conversion of every
    encoding into a dict (a third of the time). Any other class, which may treat targets differently, is called
    as transformers calls it.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if type(tokenizer) is TokenizersBackend and backend.truncation is None and backend.padding is None:

        def encode(texts: list[str], target: bool = False) -> list[list[int]]:
            return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=True)]

        return encode

    def encode(texts: list[str], target: bool = False) -> list[list[int]]:
        # verbose=False: over-long pairs are dropped later; a "longer than model_max_length" warning is noise
        if target:
            return tokenizer(text_target=texts, return_attention_mask=False, verbose=False)["input_ids"]
        return tokenizer(texts, return_attention_mask=False, verbose=False)["input_ids"]

    return encode


def _read_and_encode(chunks, encode):
    """The next chunk of pairs and their ids, or None at the end of the corpus."""
    chunk = next(chunks, None)
    if chunk is None:
        return None
    sources, targets = [s for s, _ in chunk], [t for _, t in chunk]
    return sources, targets, encode(sources), encode(targets, target=True)


def mark_absent(folder: Path) -> None:
    """Record that the corpus has no such split (so that the next run need not read the corpus to find out)."""

    def write(staging: Path) -> None:
        staging.mkdir(parents=True)
        (staging / _ABSENT).write_text("{}\n", encoding="utf-8")

    save_folder_atomically(Path(folder), write)


def is_prepared(folder: Path) -> bool | None:
    """True: ``folder`` holds a prepared split; False: it records that the corpus has no such split; None: neither."""
    folder = Path(folder)
    if (folder / _META).is_file():
        return True
    return False if (folder / _ABSENT).is_file() else None


def load_prepared_split(folder: Path) -> PreparedSplit:
    """A split :func:`prepare_split` wrote, memory-mapped read-only.

    Raises:
        ValueError: the folder holds no complete prepared split of this format.
    """
    folder = Path(folder)
    try:
        meta = json.loads((folder / _META).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{str(folder)!r} holds no prepared split ({error}); prepare it again (delete the folder)."
        ) from None
    if meta.get("format") != PREPARED_FORMAT:
        raise ValueError(
            f"{str(folder)!r} was prepared in format {meta.get('format')!r}, "
            f"this package reads format {PREPARED_FORMAT}: "
            f"delete the folder to prepare the corpus again."
        )

    def ragged(name: str, dtype: Any, kind: type[RaggedArray]) -> RaggedArray:
        offsets = np.load(folder / f"{name}.offsets.npy", mmap_mode="r")
        size = int(offsets[-1])
        # numpy cannot map an empty file; an empty split has no rows to read
        flat = np.memmap(folder / f"{name}.bin", dtype=dtype, mode="r") if size else np.zeros(0, dtype)
        return kind(flat, offsets)

    return PreparedSplit(
        ragged("input_ids", meta["dtype"], RaggedArray),
        ragged("labels", meta["dtype"], RaggedArray),
        ragged("sources", np.uint8, RaggedText),
        ragged("targets", np.uint8, RaggedText),
        int(meta["dropped"]),
    )
