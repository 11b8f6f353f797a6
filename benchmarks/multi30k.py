"""Translation quality at a fixed wall-clock budget: Multi30k (train / val / test_2016_flickr), de->en and en->de.

    python benchmarks/multi30k.py --minutes 60            # the budget of the project's goal
    python benchmarks/multi30k.py --minutes 10 --directions de-en

Each direction trains with `vanilla_transformer.training.train` (the paper's recipe: token-bucketed
batches, Adam 0.9/0.98/1e-9 with warm-up + inverse square root, label smoothing 0.1, average of the last
5 checkpoints) for the given minutes, then scores test_2016_flickr with beam 4, alpha 0.6, max = source + 50
(sacreBLEU, detokenised, with its signature). Writes benchmarks/results/multi30k-<minutes>min.{json,md}.
"""

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

from vanilla_transformer.training import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
MODEL = {  # the sizes of the MarianMTModel baseline: d 256, 3+3 layers, 4 heads, d_ff 1024, joint 8k BPE
    "d_model": 256, "encoder_layers": 3, "decoder_layers": 3, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024,
    "dropout": 0.3,  # the paper's P_drop for its big EN-DE model: an hour is ~50 epochs of this small corpus
}  # fmt: skip


def run(direction: str, minutes: float, data: Path, output_root: Path, mixed_precision: str) -> dict:
    src, tgt = direction.split("-")
    config = TrainConfig(
        data=str(data), src_lang=src, tgt_lang=tgt, valid_split="validation", test_split="test_2016_flickr",
        vocab_size=8000, model=MODEL, max_tokens=2500, warmup_steps=300, lr_factor=0.8, max_steps=10**6,
        max_minutes=minutes, eval_every=1000, eval_bleu_sentences=100, save_every=250, keep_checkpoints=5,
        average_last=5, mixed_precision=mixed_precision, output_dir=str(output_root / f"multi30k-{direction}-{minutes:g}min"),
    )  # fmt: skip
    summary = train(config)
    return {"direction": direction, "minutes": minutes, "mixed_precision": mixed_precision, **{k: summary[k] for k in ("step", "target_tokens", "loop_seconds", "test")}}


def _git_revision() -> str | None:
    """The commit the script ran at (with "+changes" when the working tree differed), if git is there."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--directions", nargs="+", default=["de-en", "en-de"])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--output-root", type=Path, default=ROOT / "outputs")
    parser.add_argument("--mixed-precision", default="bf16", choices=["no", "bf16"], help="bf16 autocast (default) or fp32")
    args = parser.parse_args()
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stem = f"multi30k-{args.minutes:g}min"  # e.g. multi30k-0.5min: not Path.with_suffix, which would cut at ".5"
    environment = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                   "processor": platform.processor() or platform.machine()}  # fmt: skip
    # Rows of directions not run this time are kept: each direction is an hour, and may be run on its own.
    previous = json.loads((out / f"{stem}.json").read_text()) if (out / f"{stem}.json").is_file() else {"results": []}
    results = [r for r in previous["results"] if r["direction"] not in args.directions]
    for direction in args.directions:
        row = run(direction, args.minutes, args.data, args.output_root, args.mixed_precision)
        row.update(date=time.strftime("%Y-%m-%d", time.gmtime()), revision=_git_revision())
        results.append(row)
        results.sort(key=lambda r: r["direction"])
        # written after each direction, so that a crash in the second hour does not lose the first
        (out / f"{stem}.json").write_text(json.dumps({"environment": environment, "results": results}, indent=2) + "\n")
    lines = ["| direction | budget | steps | target tokens | sacreBLEU | chrF | signature |", "|---|---|---|---|---|---|---|"]
    for r in results:
        t = r["test"]
        lines.append(f"| {r['direction']} | {r['minutes']:g} min | {r['step']} | {r['target_tokens']:,} | "
                     f"{t['bleu']:.2f} | {t['chrf']:.2f} | {t['bleu_signature'].replace('|', chr(92) + '|')} |")  # fmt: skip
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
