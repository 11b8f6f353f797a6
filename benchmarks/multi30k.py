"""Translation quality at a fixed wall-clock budget: Multi30k (train / val / test_2016_flickr), de->en and en->de.

    python benchmarks/multi30k.py --minutes 60            # the budget of the project's goal
    python benchmarks/multi30k.py --minutes 10 --directions de-en
    python benchmarks/multi30k.py --minutes 60 --directions en-de --max-steps 7212   # an earlier run's steps
    python benchmarks/multi30k.py --minutes 60 --directions en-de --max-steps 7212 --resume   # after a stop

Each direction trains with `vanilla_transformer.training.train` (the paper's recipe: token-bucketed
batches, Adam 0.9/0.98/1e-9 with warm-up + inverse square root, label smoothing 0.1, average of the last
5 checkpoints) for the given minutes, then scores test_2016_flickr with beam 4, alpha 0.6, max = source + 50
(sacreBLEU, detokenised, with its signature). Writes benchmarks/results/multi30k-<minutes>min.{json,md}.
By default it starts itself again as 2 data-parallel processes of 1 thread each (torchrun, gloo), which share
the recipe's tokens per step; `--processes 1` trains in this process with every thread.
"""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
from reporting import check_multi30k, cpu_name, multi30k_folder  # noqa: E402  (benchmarks/reporting.py)

from vanilla_transformer.training import resolve_mixed_precision, train
from vanilla_transformer.training_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
# The sizes of the MarianMTModel baseline (with a joint 8k BPE).
MODEL = {
    "d_model": 256,
    "encoder_layers": 3,
    "decoder_layers": 3,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 1024,
    "decoder_ffn_dim": 1024,
}
# Every row of the results file records this recipe, and scripts/make_model_cards.py rebuilds the run's
# TrainConfig from it (train_config) for the model card.
RECIPE = {
    "dropout": 0.3,  # the paper's P_drop for its big EN-DE model: an hour is ~50 epochs of this small corpus
    "max_tokens_per_step": 2500,  # padded tokens per side in one optimizer step, shared by the processes
    "warmup_steps": 300,
    # peak learning rate lr_factor * 256^-0.5 * 300^-0.5 = 1.1e-3. The paper's factor 1 (3.6e-3 at this size
    # and warm-up) is far too high here: after 1,000 steps (one process, fp32), validation NLL / BLEU (beam 4,
    # first 400 sentences) were 3.20 / 10.9 at lr_factor 0.8 (this script until 2026-12-03), 3.03 / 13.7 at 0.5,
    # 2.84 / 19.3 at 0.3 and 3.16 / 15.4 at 0.15 (benchmarks/lr_sweep.py; results/lr-sweep.md).
    "lr_factor": 0.3,
    "eval_every": 1000,
    "save_every": 250,
    # the paper's bias-free attention projections; rows whose recipe lacks this field were run before the field
    # existed, with biases
    "attention_bias": False,
}


#: What a model card says about the data (the fields of ``vanilla_transformer.cards.DATASET_CARD``).
DATASET = {
    "hub_id": "multi30k",
    "title": "Multi30k (WMT 2016 multimodal translation, task 1), English–German",
    "about": (
        "English descriptions of Flickr30K images and their German translations: the `train`, `val` and "
        "`test_2016_flickr` files of the official repository (https://github.com/multi30k/dataset, commit "
        "a3d2e0d26b56f3846f66a952536ffed4e401d05a), untokenised"
    ),
    "licence": (
        "no explicit licence for the text; the source provides it for non-commercial research and "
        "educational use only (it is partly derived from Flickr30K, whose images fall under the Flickr "
        "Terms of Use), and asks users to cite Elliott et al. (2016)"
    ),
    "caveat": None,
    "citation": """@inproceedings{elliott2016multi30k,
  title     = {Multi30K: Multilingual English-German Image Descriptions},
  author    = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  pages     = {70--74},
  year      = {2016},
  doi       = {10.18653/v1/W16-3210}
}""",
}


def train_config(
    direction: str,
    minutes: float,
    recipe: dict,
    mixed_precision: str,
    processes: int,
    data: str,
    output_dir: str | None = None,
    max_steps: int | None = None,
    resume: bool = False,
) -> TrainConfig:
    """The TrainConfig that trains ``direction`` with ``recipe`` in each of ``processes`` (which share the
    recipe's tokens per step): for ``minutes``, or, with ``max_steps``, to that step whatever the time."""
    src, tgt = direction.split("-")
    return TrainConfig(
        dataset_name=data,
        source_lang=src,
        target_lang=tgt,
        validation_split="validation",
        test_split="test_2016_flickr",
        vocab_size=8000,
        config_overrides={**MODEL, "dropout": recipe["dropout"], "attention_bias": recipe.get("attention_bias", True)},
        max_tokens=recipe["max_tokens_per_step"] // processes,
        warmup_steps=recipe["warmup_steps"],
        lr_factor=recipe["lr_factor"],
        max_steps=max_steps or 10**6,
        max_minutes=None if max_steps else minutes,
        eval_steps=recipe["eval_every"],
        eval_bleu_sentences=100,
        save_steps=recipe["save_every"],
        save_total_limit=5,
        average_last=5,
        mixed_precision=mixed_precision,
        output_dir=output_dir or f"outputs/multi30k-{direction}-{minutes:g}min",
        resume_from_checkpoint="latest" if resume else None,
    )


def run_folder(output_root: Path, direction: str, minutes: float) -> Path:
    return output_root / f"multi30k-{direction}-{minutes:g}min"


def run(
    direction: str,
    minutes: float,
    data: Path,
    output_root: Path,
    mixed_precision: str,
    max_steps: int | None = None,
    resume: bool = False,
) -> dict:
    """Train and score one direction in this process (one of several under torchrun); the row of the results."""
    output_dir = str(run_folder(output_root, direction, minutes))
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    summary = train(
        train_config(direction, minutes, RECIPE, mixed_precision, processes, str(data), output_dir, max_steps, resume)
    )
    row = {
        "direction": direction,
        "minutes": minutes,
        "mixed_precision": mixed_precision,
        "recipe": RECIPE,
        "processes": processes,
        "threads_per_process": torch.get_num_threads(),
        "machine": cpu_name() if not torch.cuda.is_available() else gpu_name(),
    }
    if max_steps:
        row["max_steps"] = max_steps  # trained to this step, whatever the time (loop_seconds says how long)
    return {**row, **{k: summary.get(k) for k in ("step", "target_tokens", "loop_seconds", "test")}}


def gpu_name() -> str:
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


def _git_revision() -> str | None:
    """The commit the script starts at (with "+changes" when tracked files other than results differed), if git
    is there. Read at the start: a commit made during an hour's run does not describe the code that ran."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _relaunch_under_torchrun(processes: int) -> int:
    """Run this script again as ``processes`` data-parallel processes (gloo on CPUs), the CPU threads split
    between them. On 2 cores, the 60-minute de-en run trained 4,800 target tokens/s as 2 processes x 1 thread
    (1,250 tokens each per step) against 4,528 as 1 process x 2 threads (2,500 tokens per step): 1.06x. Two
    single-thread processes with 2,500 tokens each ran 3,500-3,700 tokens/s apiece: larger steps would gain more."""
    threads = max(1, (os.cpu_count() or processes) // processes)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        __file__,
        *sys.argv[1:],
    ]
    return subprocess.run(command, env=env).returncode


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--directions", nargs="+", default=["de-en", "en-de"])
    parser.add_argument(
        "--data",
        type=Path,
        default=multi30k_folder(),
        help="Multi30k task 1 files (python scripts/get_multi30k.py puts them in data/multi30k)",
    )
    parser.add_argument("--output-root", type=Path, default=ROOT / "outputs")
    parser.add_argument(
        "--mixed-precision",
        default="auto",
        choices=["auto", "no", "bf16"],
        help="bf16 autocast, fp32 (no), or auto (default): bf16 where the CPU or GPU has bf16 units",
    )
    parser.add_argument("--processes", type=int, default=2, help="data-parallel processes (torchrun, gloo); default 2")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--max-steps",
        type=int,
        help="train to this step instead of for --minutes (to rerun an earlier run of the budget at its step count on "
        "a slower machine); the results keep the --minutes name and record the time taken",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from the newest checkpoint of a stopped run of the same command (resuming is bit-exact)",
    )
    args = parser.parse_args()
    check_multi30k(args.data, parser)
    # recorded as resolved; emulated bf16 (CPUs without AMX or AVX512-BF16) is about 20 times slower than fp32
    args.mixed_precision = resolve_mixed_precision(args.mixed_precision, cpu=not torch.cuda.is_available())
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: give 1 or more")
    if args.max_steps is not None and args.max_steps < 1:
        parser.error(f"--max-steps {args.max_steps}: give 1 or more")
    if "WORLD_SIZE" not in os.environ and not args.resume:  # checked once, before any process starts
        earlier = [run_folder(args.output_root, d, args.minutes) for d in args.directions]
        earlier = [folder for folder in earlier if (folder / "checkpoints").is_dir()]
        if earlier:
            parser.error(
                f"{', '.join(map(str, earlier))} holds an earlier run of this budget: move or delete it, or give "
                f"--output-root elsewhere (a benchmark run starts from scratch), or go on with it with --resume"
            )
    if args.processes > 1 and "WORLD_SIZE" not in os.environ:
        sys.exit(_relaunch_under_torchrun(args.processes))
    main_process = int(os.environ.get("RANK", "0")) == 0
    revision, command = _git_revision(), shlex.join(["python", "benchmarks/multi30k.py", *sys.argv[1:]])
    out = args.results_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = f"multi30k-{args.minutes:g}min"  # e.g. multi30k-0.5min: not Path.with_suffix, which would cut at ".5"
    environment = {
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    # Rows of directions not run this time are kept: each direction is an hour, and may be run on its own.
    previous = json.loads((out / f"{stem}.json").read_text()) if (out / f"{stem}.json").is_file() else {"results": []}
    results = [r for r in previous["results"] if r["direction"] not in args.directions]
    for direction in args.directions:
        folder = run_folder(args.output_root, direction, args.minutes)
        this_start = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "revision": revision, "command": command}
        starts = _record_start(folder, this_start, main_process, args.resume)
        row = run(
            direction, args.minutes, args.data, args.output_root, args.mixed_precision, args.max_steps, args.resume
        )
        if not main_process:
            continue
        row.update(starts[0])  # the first start's date, commit and command describe the run
        if len(starts) > 1:
            row["resumed"] = starts[1:]
        results.append(row)
        results.sort(key=lambda r: r["direction"])
        # written after each direction, so that a crash in the second hour does not lose the first
        (out / f"{stem}.json").write_text(json.dumps({"environment": environment, "results": results}, indent=2) + "\n")
    if not main_process:
        return
    table = results_table(results)
    (out / f"{stem}.md").write_text(table)
    print(table)


def _record_start(folder: Path, start: dict, main_process: bool, resume: bool) -> list[dict]:
    """Every start of a run (date, commit, command), kept in its folder so that a resumed run's row says which code
    ran it: a fresh start replaces the list, a resume adds to it."""
    if not main_process:  # only the main process reads and writes the list (and writes the row)
        return [start]
    path = folder / "benchmark_starts.json"
    starts = [*(json.loads(path.read_text()) if resume and path.is_file() else []), start]
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(starts, indent=2) + "\n")
    return starts


def results_table(results: list[dict]) -> str:
    """The Markdown table of a results file's rows (rows without ``attention_bias`` in their recipe were run with
    attention biases, before the field existed)."""
    lines = [
        "| direction | budget | attention biases | steps | target tokens | sacreBLEU | chrF | run | signature |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        t, biases = r["test"], r.get("recipe", {}).get("attention_bias", True)
        budget = f"{r['minutes']:g} min"
        if r.get("max_steps"):
            budget = f"{r['max_steps']:,} steps ({r['loop_seconds'] / 60:.0f} min)"
        lines.append(
            f"| {r['direction']} | {budget} | {'yes' if biases else 'no'} | {r['step']} | "
            f"{r['target_tokens']:,} | "
            f"{t['bleu']:.2f} | {t['chrf']:.2f} | {r.get('date', '?')}, {r.get('revision') or '?'} | "
            f"{t['bleu_signature'].replace('|', chr(92) + '|')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
