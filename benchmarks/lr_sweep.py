"""The learning-rate sweep behind benchmarks/multi30k.py's `lr_factor`: its training, stopped early, with several
factors on the paper's schedule.

    python benchmarks/lr_sweep.py                                # factors 0.15 0.3 0.5 0.8, 1,000 steps each
    python benchmarks/lr_sweep.py --factors 0.15 0.3 & python benchmarks/lr_sweep.py --factors 0.5 0.8   # 2 cores

The paper's schedule peaks at lr_factor · d_model^-0.5 · warmup^-0.5. Each run is multi30k.py's recipe and model
(de-en by default, 2,500 padded tokens per step, one process with one thread) except its factor, trained for
`--steps` steps with seed 0. It is evaluated halfway and at the end: validation NLL (unsmoothed, every sentence
of `val`) and sacreBLEU (beam 4, α 0.6) of the first `--bleu-sentences` of `val`. Results go to
benchmarks/results/lr-sweep.{json,md} after every run (runs side by side keep each other's); a factor already
there is skipped unless `--rerun`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import multi30k  # noqa: E402  (benchmarks/multi30k.py)
from reporting import check_multi30k, cpu_name, multi30k_folder, shown_command  # noqa: E402

from vanilla_transformer.checkpoints import write_json_atomically  # noqa: E402
from vanilla_transformer.training import resolve_mixed_precision, train  # noqa: E402

FACTORS = [0.15, 0.3, 0.5, 0.8]


def peak_lr(factor: float, d_model: int, warmup_steps: int) -> float:
    return factor * d_model**-0.5 * warmup_steps**-0.5


def run_factor(factor: float, args) -> dict:
    """Train one factor from scratch; the record of the results file (its two evaluations)."""
    folder = args.output_root / f"lr-sweep-{args.direction}-{factor:g}"
    shutil.rmtree(folder, ignore_errors=True)
    recipe = {**multi30k.RECIPE, "lr_factor": factor, "eval_every": args.steps // 2, "save_every": args.steps}
    config = multi30k.train_config(
        args.direction, 0, recipe, args.mixed_precision, 1, str(args.data), str(folder), max_steps=args.steps
    )
    config = dataclasses.replace(
        config,
        test_split=None,  # the test set is not looked at to choose a setting
        eval_bleu_sentences=args.bleu_sentences,
        save_total_limit=1,
        average_last=1,
        seed=0,
    )
    started = time.monotonic()
    summary = train(config)
    evaluations = [
        {k: r[k] for k in ("step", "valid_nll", "valid_bleu") if k in r} for r in summary["history"] if "valid_nll" in r
    ]
    shutil.rmtree(folder / "checkpoints")
    return {
        "lr_factor": factor,
        "peak_lr": peak_lr(factor, multi30k.MODEL["d_model"], recipe["warmup_steps"]),
        "direction": args.direction,
        "steps": summary["step"],
        "evaluations": evaluations,
        "bleu_sentences": args.bleu_sentences,
        "recipe": recipe,
        "mixed_precision": args.mixed_precision,
        "loop_seconds": summary["loop_seconds"],
        "seconds": time.monotonic() - started,
        "machine": cpu_name(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "revision": args.revision,
        "command": args.command,
    }


def table(runs: list[dict]) -> str:
    """The Markdown table of the sweep: one row per factor, its evaluations halfway and at the end."""
    if not runs:
        return ""
    half, end = runs[0]["evaluations"][0]["step"], runs[0]["evaluations"][-1]["step"]
    lines = [
        f"| lr_factor | peak learning rate | valid NLL at {half:,} steps | valid NLL at {end:,} | "
        f"valid sacreBLEU at {half:,} | valid sacreBLEU at {end:,} |",
        "|---|---|---|---|---|---|",
    ]
    for run in sorted(runs, key=lambda r: r["lr_factor"]):
        first, last = run["evaluations"][0], run["evaluations"][-1]
        lines.append(
            f"| {run['lr_factor']:g} | {run['peak_lr']:.1e} | {first['valid_nll']:.2f} | {last['valid_nll']:.2f} | "
            f"{first.get('valid_bleu', float('nan')):.1f} | {last.get('valid_bleu', float('nan')):.1f} |"
        )
    precision = {"no": "fp32", "bf16": "bf16 autocast"}
    machines = sorted({f"{r['machine']}, {r['threads']} thread(s), {precision[r['mixed_precision']]}" for r in runs})
    commits = sorted({r["revision"] or "?" for r in runs})
    commands = sorted({f"`{r['command']}`" for r in runs})
    return (
        "\n".join(lines) + f"\n\n{runs[0]['direction']}, one process, seed 0; sacreBLEU (beam 4) of the first "
        f"{runs[0]['bleu_sentences']} sentences of val. Machine: {'; '.join(machines)}. Commits: {', '.join(commits)}."
        f"\nCommands: {', '.join(commands)}.\n"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--factors", nargs="+", type=float, default=FACTORS, help="lr_factor values to train")
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps per run (evaluated halfway and here)")
    parser.add_argument("--direction", default="de-en", choices=["de-en", "en-de"])
    parser.add_argument("--bleu-sentences", type=int, default=400, help="sentences of val scored by sacreBLEU")
    parser.add_argument("--data", type=Path, default=multi30k_folder())
    parser.add_argument("--mixed-precision", default="auto", choices=["auto", "no", "bf16"])
    parser.add_argument("--output-root", type=Path, default=ROOT / "outputs")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="lr-sweep", help="results file stem (default lr-sweep)")
    parser.add_argument("--rerun", action="store_true", help="train factors already in the results again")
    args = parser.parse_args(argv)
    check_multi30k(args.data, parser, splits=("train", "val"))
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: give 2 or more (the runs are evaluated halfway and at the end)")
    if args.bleu_sentences < 1:
        parser.error(f"--bleu-sentences {args.bleu_sentences}: give 1 or more")
    if any(f <= 0 for f in args.factors):
        parser.error(f"--factors {' '.join(map(str, args.factors))}: every factor must be above 0")
    args.mixed_precision = resolve_mixed_precision(args.mixed_precision, cpu=not torch.cuda.is_available())
    args.revision = multi30k._git_revision()
    args.command = shown_command("lr_sweep.py", sys.argv[1:] if argv is None else argv)
    path = args.results_dir / f"{args.name}.json"
    args.results_dir.mkdir(parents=True, exist_ok=True)
    done = {r["lr_factor"] for r in json.loads(path.read_text())["runs"]} if path.is_file() else set()
    for factor in args.factors:
        if factor in done and not args.rerun:
            print(f"lr_factor {factor:g}: already in {path.name} (--rerun trains it again)", flush=True)
            continue
        print(f"lr_factor {factor:g}: {args.steps} steps", flush=True)
        record = run_factor(factor, args)
        with FileLock(str(path) + ".lock"):
            runs = json.loads(path.read_text())["runs"] if path.is_file() else []
            runs = sorted([r for r in runs if r["lr_factor"] != factor] + [record], key=lambda r: r["lr_factor"])
            write_json_atomically(path, {"runs": runs})
            (args.results_dir / f"{args.name}.md").write_text(table(runs), encoding="utf-8")
    results = json.loads(path.read_text()) if path.is_file() else {"runs": []}
    print(table(results["runs"]))
    return results


if __name__ == "__main__":
    main()
