"""A corpus of WMT14's size through the multi-process training command: preparation time, the second start, and
each process's memory, beside the same model on the bundled corpus.

    python benchmarks/prepared_corpus.py   # 4.5M pairs, 2 processes, 50 steps each run (~15 min on 2 cores)
    python benchmarks/prepared_corpus.py --pairs 20000 --steps 4 --output /tmp/x   # a quick check of the script

The synthetic corpus is built from the bundled one (``data/tatoeba_en_de``, 100,000 training pairs): pair ``i``
is bundled pair ``i mod 100,000`` followed by a randomly drawn second bundled pair, source after source and target
after target, so that lines are distinct (about 16 words a side, WMT14's order of magnitude) and a tokenizer cannot
reuse its cache of whole lines. Its validation and test splits are the bundled ones.

Each corpus is trained twice through ``torchrun --nproc_per_node 2 -m vanilla_transformer train`` with the main
job's model (``configs/tatoeba_en_de_small.yaml``) for ``--steps`` steps, each time in a fresh output folder:

* the **first run** starts with an empty prepared-corpus cache: it trains the BPE and prepares every split;
* the **second run** gives the first run's tokenizer (``--tokenizer_name``), so it finds the prepared splits.

Times are read from the run's own log, stamped as its lines arrive, from the command's start: *data ready* is
its "data ready" line (tokenizer and prepared corpus, memory-mapped by every process), *loop starts* its
"training from step" line (model built, checkpoints looked for). Memory is sampled every 0.2 s from
``/proc/PID/smaps_rollup`` of each worker: RSS, USS (``Private_Clean + Private_Dirty``: what the process alone
holds) and PSS (shared pages split between the processes that map them; the sum over processes counts a shared
page once). Peaks are given for the whole run and for the training loop alone.

Writes ``prepared-corpus.{json,md}`` under ``--output`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import cpu_model  # noqa: E402  (benchmarks/reporting.py)

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "data" / "tatoeba_en_de"
CONFIG = ROOT / "configs" / "tatoeba_en_de_small.yaml"


def build_corpus(folder: Path, pairs: int, seed: int = 0) -> Path:
    """Write ``pairs`` synthetic training pairs (plain text, one sentence a line) and the bundled valid/test."""
    folder.mkdir(parents=True, exist_ok=True)
    sides = {}
    for lang in ("en", "de"):
        with gzip.open(BUNDLED / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            sides[lang] = np.array(f.read().splitlines(), dtype=object)
    n = len(sides["en"])
    second = np.random.default_rng(seed).integers(0, n, size=pairs)
    chunk = 200_000
    for lang, lines in sides.items():
        with open(folder / f"train.{lang}", "w", encoding="utf-8") as out:
            for start in range(0, pairs, chunk):
                stop = min(pairs, start + chunk)
                first = np.arange(start, stop) % n
                out.write("\n".join(a + " " + b for a, b in zip(lines[first], lines[second[start:stop]])) + "\n")
    for split in ("valid", "test"):
        for lang in ("en", "de"):
            shutil.copyfile(BUNDLED / f"{split}.{lang}.gz", folder / f"{split}.{lang}.gz")
    return folder


def _memory(pid: int) -> dict | None:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kb = {}
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        kb[key.strip()] = int(rest.split()[0])
    return {
        "rss": kb["Rss"] * 1024,
        "pss": kb["Pss"] * 1024,
        "uss": (kb["Private_Clean"] + kb["Private_Dirty"]) * 1024,
        "anonymous": kb.get("Anonymous", 0) * 1024,
    }


def _workers(root_pid: int) -> dict[int, int]:
    """{pid: rank} of the processes under ``root_pid`` whose environment has a RANK (torchrun's workers)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0)
        rank = next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), None)
        if rank is not None and _descends(parent, root_pid):
            found[int(entry.name)] = rank
    return found


def _descends(pid: int, root: int) -> bool:
    for _ in range(8):
        if pid == root:
            return True
        if pid <= 1:
            return False
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
    return False


def run_training(
    corpus: Path, output_dir: Path, cache: Path, processes: int, steps: int, *extra: str, code: Path = ROOT
) -> dict:
    """One run of the training command as ``processes`` processes, with the package found in ``code``; its times,
    memory and results."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "vanilla_transformer",
        "train",
        "--config",
        str(code / CONFIG.relative_to(ROOT)),
        "--dataset_name",
        str(corpus),
        "--output_dir",
        str(output_dir),
        "--max_steps",
        str(steps),
        "--max_minutes",
        "120",
        "--save_steps",
        str(steps),
        "--disable_tqdm",
        "true",
        *extra,
    ]
    threads = max(1, (os.cpu_count() or processes) // processes)
    env = {
        **os.environ,
        "VANILLA_TRANSFORMER_CACHE": str(cache),
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": str(code),
    }
    env.pop(
        "TOKENIZERS_PARALLELISM", None
    )  # tokenizers' default, as a user runs it: the BPE and encoding use every core
    start = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=code)
    marks: dict[str, float] = {}
    peaks: dict[int, dict] = {}
    training = threading.Event()
    done = threading.Event()

    def sample() -> None:
        workers: dict[int, int] = {}
        while not done.is_set():
            workers.update(_workers(process.pid)) if len(workers) < processes else None
            for pid, rank in workers.items():
                memory = _memory(pid)
                if memory is None:
                    continue
                peak = peaks.setdefault(rank, {})
                for key, value in memory.items():
                    peak[key] = max(peak.get(key, 0), value)
                    if training.is_set():
                        peak[f"training_{key}"] = max(peak.get(f"training_{key}", 0), value)
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = []
    for line in process.stdout:
        log.append(line)
        now = time.monotonic() - start
        if "data ready in" in line:
            marks.setdefault("data_ready_s", now)
        if "training from step" in line:
            marks.setdefault("loop_start_s", now)
            training.set()
    process.wait()
    marks["total_s"] = time.monotonic() - start
    done.set()
    sampler.join()
    if process.returncode != 0:
        sys.stderr.write("".join(log[-60:]))
        raise SystemExit(f"the training command failed ({process.returncode}): {' '.join(command)}")
    results = json.loads((output_dir / "results.json").read_text())
    return {
        **marks,
        "memory": {str(rank): peaks[rank] for rank in sorted(peaks)},
        "target_tokens_per_s": results["target_tokens"] / results["loop_seconds"],
        "steps": results["step"],
        "log_tail": [line.rstrip() for line in log if "pairs kept" in line or "data ready" in line],
    }


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f}"


def markdown(result: dict) -> str:
    lines = [
        f"Machine: {result['environment']['processor']}, {result['environment']['cpus']} cores; "
        f"{result['processes']} processes x {result['threads_per_process']} thread(s); {result['steps']} steps a run. "
        f"Command: `{result['command']}`.",
        "",
        "| corpus | pairs | run | data ready (s) | loop starts (s) | peak RSS per process (GB) "
        "| peak USS per process (GB) | USS in the loop (GB) | PSS sum in the loop (GB) | target tokens/s |",
        "|---|---:|---|---:|---:|---|---|---|---:|---:|",
    ]
    for row in result["rows"]:
        memory = row["memory"]
        per = lambda key: " / ".join(_gb(memory[r].get(key, 0)) for r in sorted(memory))  # noqa: E731
        pss = sum(memory[r].get("training_pss", 0) for r in memory)
        lines.append(
            f"| {row['corpus']} | {row['pairs']:,} | {row['run']} | {row['data_ready_s']:.0f} "
            f"| {row['loop_start_s']:.0f} "
            f"| {per('rss')} | {per('uss')} | {per('training_uss')} | {_gb(pss)} | {row['target_tokens_per_s']:,.0f} |"
        )
    by_side = {
        side: [row["target_tokens_per_s"] for row in result.get("comparison", []) if row["side"] == side]
        for side in ("baseline", "prepared")
    }
    if all(by_side.values()):  # both sides measured
        median = {side: float(np.median(values)) for side, values in by_side.items()}
        lines += [
            "",
            f"Training tokens/s on the bundled corpus, runs taken in turn ({len(by_side['baseline'])} a side; "
            "the baseline is the package before the prepared corpus, given the same tokenizer):",
            "",
            "| code | runs (target tokens/s) | median | / baseline |",
            "|---|---|---:|---:|",
        ]
        for side in ("baseline", "prepared"):
            runs = ", ".join(f"{v:,.0f}" for v in by_side[side])
            lines.append(f"| {side} | {runs} | {median[side]:,.0f} | {median[side] / median['baseline']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000, help="synthetic training pairs (default: WMT14's 4.5M)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument(
        "--work", type=Path, default=None, help="where corpora, runs and caches go (default: a temporary folder)"
    )
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a checkout of the package before the prepared corpus: its training tokens/s on the bundled corpus "
        "is measured in turn with this one's, --repeats times each",
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import tempfile

    work = args.work or Path(tempfile.mkdtemp(prefix="prepared-corpus-"))
    corpora = {"bundled": (BUNDLED, 100_000)}
    started = time.monotonic()
    big = build_corpus(work / "synthetic", args.pairs)
    print(f"synthetic corpus of {args.pairs:,} pairs written in {time.monotonic() - started:.0f} s", flush=True)
    corpora["synthetic"] = (big, args.pairs)
    rows, comparison = [], []
    result = {
        "environment": {"processor": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "processes": args.processes,
        "threads_per_process": max(1, (os.cpu_count() or 1) // args.processes),
        "steps": args.steps,
        "command": _command(args),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "rows": rows,
        "comparison": comparison,
    }
    args.output.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        """Written after every run, so that a later failure (e.g. a baseline that takes other options) keeps
        the runs already measured."""
        (args.output / "prepared-corpus.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.output / "prepared-corpus.md").write_text(markdown(result))

    for name, (corpus, pairs) in corpora.items():
        cache = work / f"cache-{name}"
        first = run_training(corpus, work / f"{name}-first", cache, args.processes, args.steps)
        rows.append({"corpus": name, "pairs": pairs, "run": "first (prepares)", **first})
        save()
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "log_tail"}), flush=True)
        second = run_training(
            corpus,
            work / f"{name}-second",
            cache,
            args.processes,
            args.steps,
            "--tokenizer_name",
            str(work / f"{name}-first" / "tokenizer"),
        )
        rows.append({"corpus": name, "pairs": pairs, "run": "second (cached)", **second})
        save()
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "log_tail"}), flush=True)
    if args.baseline is not None:
        tokenizer = ["--tokenizer_name", str(work / "bundled-first" / "tokenizer")]
        for repeat in range(args.repeats):
            for side, code in (("baseline", args.baseline.resolve()), ("prepared", ROOT)):
                run = run_training(
                    BUNDLED,
                    work / f"compare-{side}-{repeat}",
                    work / "cache-bundled",
                    args.processes,
                    args.steps,
                    *tokenizer,
                    code=code,
                )
                comparison.append({"side": side, "repeat": repeat, "target_tokens_per_s": run["target_tokens_per_s"]})
                save()
                print(json.dumps(comparison[-1]), flush=True)
    print(markdown(result))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _command(args: argparse.Namespace) -> str:
    """The command line as another machine would repeat it (no local paths: the baseline is named by its commit)."""
    words = [
        "python",
        "benchmarks/prepared_corpus.py",
        "--pairs",
        str(args.pairs),
        "--processes",
        str(args.processes),
        "--steps",
        str(args.steps),
    ]
    if args.baseline is not None:
        commit = subprocess.run(
            ["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        words += [
            "--baseline",
            f"<a checkout of {commit.stdout.strip() or 'the baseline'}>",
            "--repeats",
            str(args.repeats),
        ]
    return " ".join(words)


if __name__ == "__main__":
    main()
