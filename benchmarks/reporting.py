"""What the benchmark scripts share: reading sentence files, naming the CPU, and writing a results pair
(``NAME.json`` and ``NAME.md``) under ``benchmarks/results``."""

from __future__ import annotations

import gzip
import json
import os
import platform
from pathlib import Path


def read_lines(path: Path, n: int | None = None) -> list[str]:
    """The lines of a text file (``.gz`` read too), without line ends; only the first ``n`` when given."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\r\n") for line in f]
    return lines if n is None else lines[:n]


def cpu_name() -> str:
    """The CPU model and core count, as results files record the machine."""
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor())
    return f"{model}, {os.cpu_count()} cores"


def shown_command(script: str, argv: list[str]) -> str:
    """The command line as results files quote it: absolute paths shortened to their file names."""
    return f"python benchmarks/{script} " + " ".join(a if not a.startswith("/") else Path(a).name for a in argv)


def write_report(results_dir: Path, name: str, report: dict, markdown: str) -> None:
    """``results_dir/NAME.json`` (the report) and ``results_dir/NAME.md`` (its table)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{name}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (results_dir / f"{name}.md").write_text(markdown, encoding="utf-8")
