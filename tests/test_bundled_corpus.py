"""Checks of the bundled Tatoeba English-German split in ``data/tatoeba_en_de``.

These tests read only the committed files (plus, for the reproducibility test,
the source folder next to the repository when it exists). They are fast.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data" / "tatoeba_en_de"
SCRIPT = REPO_ROOT / "scripts" / "make_tatoeba_split.py"
SOURCE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "tatoeba_deu_eng"

SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")
GZ_FILES = [f"{split}.{lang}.gz" for split in SPLITS for lang in LANGS]


def normalize_en(sentence: str) -> str:
    # Same as scripts/make_tatoeba_split.py: lowercase, collapse whitespace, strip.
    return " ".join(sentence.lower().split())


@lru_cache(maxsize=None)
def read_lines(name: str) -> tuple[str, ...]:
    raw = gzip.decompress((DATA_DIR / name).read_bytes())
    text = raw.decode("utf-8")  # strict: raises on invalid UTF-8
    assert text.endswith("\n"), f"{name} does not end with a newline"
    return tuple(text[:-1].split("\n"))


@lru_cache(maxsize=None)
def manifest() -> dict:
    return json.loads((DATA_DIR / "MANIFEST.json").read_text(encoding="utf-8"))


def test_all_files_present():
    for name in [*GZ_FILES, "MANIFEST.json", "README.md", "_about.txt"]:
        assert (DATA_DIR / name).is_file(), f"missing {DATA_DIR / name}"
    assert sorted(manifest()["files"]) == sorted(GZ_FILES)


@pytest.mark.parametrize("name", GZ_FILES)
def test_manifest_checksums_and_counts(name):
    entry = manifest()["files"][name]
    data = (DATA_DIR / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert len(data) == entry["bytes"]
    assert len(read_lines(name)) == entry["lines"]


@pytest.mark.parametrize("split", SPLITS)
def test_splits_aligned_and_clean(split):
    en, de = read_lines(f"{split}.en.gz"), read_lines(f"{split}.de.gz")
    assert len(en) == len(de) == manifest()["counts"][split]
    max_words = manifest()["parameters"]["max_words"]
    for lines in (en, de):
        for line in lines:
            assert line.strip(), "empty line"
            assert line == line.strip(), f"surrounding whitespace: {line!r}"
            assert "\r" not in line and "\t" not in line
            assert len(line.split()) <= max_words
    assert len(set(zip(en, de))) == len(en), "duplicate pairs"


def test_expected_sizes():
    counts = manifest()["counts"]
    params = manifest()["parameters"]
    assert counts["test"] == params["test_size"]
    assert counts["valid"] == params["valid_size"]
    assert 0 < counts["train"] <= params["max_train"]
    total = sum(p.stat().st_size for p in DATA_DIR.iterdir() if p.is_file())
    assert total < 3_000_000, f"bundled corpus too large: {total} bytes"


def test_no_english_overlap_between_splits():
    keys = {s: {normalize_en(x) for x in read_lines(f"{s}.en.gz")} for s in SPLITS}
    assert not keys["train"] & keys["test"]
    assert not keys["train"] & keys["valid"]
    assert not keys["valid"] & keys["test"]


def test_readme_names_licence_and_attribution():
    readme = (DATA_DIR / "README.md").read_text(encoding="utf-8")
    assert "CC BY 2.0" in readme
    assert "https://creativecommons.org/licenses/by/2.0/" in readme
    assert "www.manythings.org/anki and tatoeba.org" in readme
    assert "contains errors" in readme
    assert "python scripts/make_tatoeba_split.py" in readme
    about = (DATA_DIR / "_about.txt").read_text(encoding="utf-8")
    assert "Attribution: www.manythings.org/anki and tatoeba.org" in about
    assert "creativecommons.org/licenses/by/2.0" in about


@pytest.mark.skipif(not (SOURCE_DIR / "tatoeba.en").is_file(), reason=f"source data not at {SOURCE_DIR}")
def test_split_script_reproduces_committed_files(tmp_path):
    subprocess.run(
        [sys.executable, str(SCRIPT), "--source-dir", str(SOURCE_DIR), "--out-dir", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    for name in GZ_FILES:
        new, old = (tmp_path / name).read_bytes(), (DATA_DIR / name).read_bytes()
        # The decompressed text must match whatever zlib is in use ...
        assert gzip.decompress(new) == gzip.decompress(old), f"{name}: content differs"
        # ... and the gzip bytes too (deflate output can differ with another zlib build, e.g. zlib-ng).
        assert new == old, f"{name}: same text but different gzip bytes (different zlib build?)"
    assert (tmp_path / "MANIFEST.json").read_bytes() == (DATA_DIR / "MANIFEST.json").read_bytes()
