"""What the benchmark scripts share: where Multi30k is, reading sentence files, naming the CPU, and writing a
results pair (``NAME.json`` and ``NAME.md``) under ``benchmarks/results``."""

from __future__ import annotations

import gzip
import json
import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def multi30k_folder() -> Path:
    """Where the Multi30k scripts read it by default: ``data/multi30k`` in the repository, which
    ``python scripts/get_multi30k.py`` fills, or else a ``shared/data/multi30k`` copy beside the repository."""
    inside = ROOT / "data" / "multi30k"
    return inside if inside.is_dir() else ROOT.parent / "shared" / "data" / "multi30k"


def check_multi30k(folder: Path, parser, splits=("train", "val", "test_2016_flickr"), gz: bool = True) -> None:
    """Stop with a usage error naming the fix when ``folder`` lacks one of the Multi30k files a script reads
    (``<split>.en`` and ``<split>.de``; also accepted gzipped when ``gz``)."""
    names = [f"{split}.{lang}" for split in splits for lang in ("en", "de")]
    missing = [n for n in names if not (folder / n).is_file() and not (gz and (folder / f"{n}.gz").is_file())]
    if missing:
        parser.error(
            f"Multi30k is not in {folder} (missing: {', '.join(missing)}). Get it with "
            f"'python scripts/get_multi30k.py' (into data/multi30k, read by default), or give --data FOLDER."
        )


def read_lines(path: Path, n: int | None = None) -> list[str]:
    """The lines of a text file (``.gz`` read too), without line ends; only the first ``n`` when given."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\r\n") for line in f]
    return lines if n is None else lines[:n]


def cpu_model() -> str:
    """The CPU model as /proc/cpuinfo names it (else what ``platform`` knows)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return model or platform.processor() or platform.machine()


def cpu_name() -> str:
    """The CPU model and core count, as results files record the machine."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def shown_command(script: str, argv: list[str]) -> str:
    """The command line as results files quote it: absolute paths shortened to their file names."""
    return f"python benchmarks/{script} " + " ".join(a if not a.startswith("/") else Path(a).name for a in argv)


def write_report(results_dir: Path, name: str, report: dict, markdown: str) -> None:
    """``results_dir/NAME.json`` (the report) and ``results_dir/NAME.md`` (its table)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{name}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (results_dir / f"{name}.md").write_text(markdown, encoding="utf-8")
