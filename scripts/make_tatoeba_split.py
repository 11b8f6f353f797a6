#!/usr/bin/env python
"""Build the bundled, fixed train/valid/test split of Tatoeba English-German.

The project ships a small offline corpus under ``data/tatoeba_en_de`` so that
its main job (train a small en->de or de->en Transformer for a few minutes on
CPU and report sacreBLEU on a held-out test split) works without a network.
This script is the one and only way those files are made; running it with the
default arguments from the repository root reproduces them byte for byte::

    python scripts/make_tatoeba_split.py

Input
    ``tatoeba.en`` and ``tatoeba.de`` in ``--source-dir`` (default:
    ``<repo>/../shared/data/tatoeba_deu_eng``): the two columns of the
    manythings.org ``deu-eng.zip`` (``deu.txt``, 2018-04-07), built from
    tatoeba.org, line-aligned, 169,197 pairs. Licence CC BY 2.0; attribution
    "www.manythings.org/anki and tatoeba.org". Their sha256 digests are
    hard-coded below and checked before anything else happens.

Steps (all deterministic)
    1. Split each file on ``"\\n"`` only (not ``str.splitlines``, which would
       also break on U+2028 and friends and could misalign the two sides).
    2. Strip surrounding whitespace from each side; drop a pair if either side
       is empty or has more than ``--max-words`` whitespace-separated words.
    3. Drop exact duplicate pairs (the first occurrence is kept).
    4. Group pairs by their normalised English side (``normalize_en``:
       lowercase, whitespace-collapsed, stripped), so that one English sentence
       and all its German translations land in exactly one split: no
       train/valid/test leakage on the English side.
    5. Shuffle the groups (in order of first occurrence) with
       ``random.Random(--seed)``.
    6. Fill ``test`` then ``valid`` then ``train`` from the shuffled groups.
       A group is taken whole, and only if it still fits in the split's target
       size (``--test-size``, ``--valid-size``, ``--max-train``); groups that
       do not fit are skipped, so the targets are met exactly when enough
       data is left. Groups left over after train is full are not used.
    7. Write ``{train,valid,test}.{en,de}.gz`` (UTF-8, one sentence per line,
       ``\\n`` endings, line i of .en aligned with line i of .de), gzipped with
       level 9, no file name and mtime=0 in the header so the bytes are
       reproducible, plus ``MANIFEST.json`` (line counts, sizes, sha256 of each
       file, the parameters used and the filtering statistics).

The output directory (``--out-dir``, default ``<repo>/data/tatoeba_en_de``)
also holds a hand-written ``README.md`` and a copy of the source's
``_about.txt``; this script does not touch them.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import random
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE_DIR = REPO_ROOT.parent / "shared" / "data" / "tatoeba_deu_eng"
DEFAULT_OUT_DIR = REPO_ROOT / "data" / "tatoeba_en_de"

# sha256 of the source files, as listed in the source's SOURCE.md.
SOURCE_SHA256 = {
    "tatoeba.en": "5838b598e37c17a731999d0a12bfb3e3fb8643cfacfb41a7bd9ba007c709ed30",
    "tatoeba.de": "1f60ebf204af5162389e1bf4c5c030d5d785c717abbb084e6e8166e0aa7e0bd4",
}
SOURCE_PAIRS = 169_197

SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")


def normalize_en(sentence: str) -> str:
    """Key used to group pairs: lowercase, internal whitespace collapsed, stripped."""
    return " ".join(sentence.lower().split())


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_source(source_dir: Path, verify: bool = True) -> tuple[list[str], list[str]]:
    sides = {}
    for name, expected in SOURCE_SHA256.items():
        path = source_dir / name
        data = path.read_bytes()
        if verify:
            got = sha256_bytes(data)
            if got != expected:
                raise SystemExit(f"error: sha256 mismatch for {path}\n  expected {expected}\n  got      {got}")
        text = data.decode("utf-8")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        sides[name] = lines
    en, de = sides["tatoeba.en"], sides["tatoeba.de"]
    if len(en) != len(de):
        raise SystemExit(f"error: tatoeba.en has {len(en)} lines but tatoeba.de has {len(de)}")
    return en, de


def clean_pairs(en: list[str], de: list[str], max_words: int) -> tuple[list[tuple[str, str]], dict]:
    stats = {"source_pairs": len(en), "dropped_empty": 0, "dropped_too_long": 0, "dropped_duplicate": 0}
    seen: set[tuple[str, str]] = set()
    pairs: list[tuple[str, str]] = []
    for e, d in zip(en, de):
        e, d = e.strip(), d.strip()
        if not e or not d:
            stats["dropped_empty"] += 1
            continue
        if len(e.split()) > max_words or len(d.split()) > max_words:
            stats["dropped_too_long"] += 1
            continue
        if (e, d) in seen:
            stats["dropped_duplicate"] += 1
            continue
        seen.add((e, d))
        pairs.append((e, d))
    stats["kept_pairs"] = len(pairs)
    return pairs, stats


def split_groups(
    pairs: list[tuple[str, str]], seed: int, test_size: int, valid_size: int, max_train: int
) -> tuple[dict[str, list[tuple[str, str]]], dict]:
    groups: dict[str, list[tuple[str, str]]] = {}  # insertion order = first occurrence
    for pair in pairs:
        groups.setdefault(normalize_en(pair[0]), []).append(pair)
    ordered = list(groups.values())
    random.Random(seed).shuffle(ordered)

    targets = {"test": test_size, "valid": valid_size, "train": max_train}
    out: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    n_groups = {s: 0 for s in SPLITS}
    remaining = ordered
    for split in ("test", "valid", "train"):
        target, taken, leftover = targets[split], out[split], []
        # Walk the still unused groups in shuffled order; take a group whole
        # if it fits, otherwise keep it (in order) for the next split.
        for group in remaining:
            if len(taken) + len(group) <= target:
                taken.extend(group)
                n_groups[split] += 1
            else:
                leftover.append(group)
        remaining = leftover
    stats = {
        "english_groups": len(ordered),
        "groups_per_split": n_groups,
        "unused_groups": len(remaining),
        "unused_pairs": sum(len(g) for g in remaining),
    }
    return out, stats


def gzip_lines(lines: list[str]) -> bytes:
    raw = "".join(line + "\n" for line in lines).encode("utf-8")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(raw)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--source-dir", type=Path, default=DEFAULT_SOURCE_DIR, help="folder with tatoeba.en and tatoeba.de"
    )
    parser.add_argument(
        "--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where the .gz files and MANIFEST.json go"
    )
    parser.add_argument("--seed", type=int, default=1234, help="seed for shuffling the English groups")
    parser.add_argument("--test-size", type=int, default=2000, help="test pairs")
    parser.add_argument("--valid-size", type=int, default=1000, help="validation pairs")
    parser.add_argument("--max-train", type=int, default=100_000, help="cap on training pairs")
    parser.add_argument(
        "--max-words", type=int, default=30, help="drop pairs where either side has more whitespace words than this"
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the sha256 check of the source files (output then need not match MANIFEST)",
    )
    args = parser.parse_args(argv)

    en, de = read_source(args.source_dir, verify=not args.no_verify)
    pairs, clean_stats = clean_pairs(en, de, args.max_words)
    splits, split_stats = split_groups(pairs, args.seed, args.test_size, args.valid_size, args.max_train)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for split in SPLITS:
        for i, lang in enumerate(LANGS):
            name = f"{split}.{lang}.gz"
            data = gzip_lines([p[i] for p in splits[split]])
            (args.out_dir / name).write_bytes(data)
            files[name] = {"lines": len(splits[split]), "bytes": len(data), "sha256": sha256_bytes(data)}

    manifest = {
        "description": "Fixed split of Tatoeba English-German pairs (manythings.org deu-eng 2018-04-07), "
        "made by scripts/make_tatoeba_split.py",
        "license": "CC BY 2.0 (https://creativecommons.org/licenses/by/2.0/)",
        "attribution": "www.manythings.org/anki and tatoeba.org",
        "source": {"files": dict(SOURCE_SHA256), "pairs": SOURCE_PAIRS},
        "parameters": {
            "seed": args.seed,
            "test_size": args.test_size,
            "valid_size": args.valid_size,
            "max_train": args.max_train,
            "max_words": args.max_words,
            "english_normalisation": "lowercase, collapse whitespace, strip",
            "gzip": "level 9, mtime 0, no file name",
        },
        "counts": {split: len(splits[split]) for split in SPLITS},
        "statistics": {**clean_stats, **split_stats},
        "files": files,
    }
    (args.out_dir / "MANIFEST.json").write_text(
        json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )

    print(f"source pairs: {clean_stats['source_pairs']}")
    print(
        f"dropped: empty {clean_stats['dropped_empty']}, >{args.max_words} words "
        f"{clean_stats['dropped_too_long']}, duplicate {clean_stats['dropped_duplicate']}"
    )
    print(f"kept pairs: {clean_stats['kept_pairs']} in {split_stats['english_groups']} English groups")
    for split in SPLITS:
        print(f"{split:>5}: {len(splits[split]):>7} pairs ({split_stats['groups_per_split'][split]} groups)")
    print(f"unused: {split_stats['unused_pairs']} pairs ({split_stats['unused_groups']} groups)")
    total = sum(f["bytes"] for f in files.values())
    print(f"wrote {len(files)} files, {total} bytes, to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
