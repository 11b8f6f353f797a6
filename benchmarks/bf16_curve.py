"""bf16 autocast against fp32 on a CPU: the same training run twice, loss curves side by side.

    python benchmarks/bf16_curve.py              # Multi30k de->en, the sizes of benchmarks/multi30k.py, 300 steps
    python benchmarks/bf16_curve.py --smoke --data PATH --src-lang en --tgt-lang de --output DIR

Both runs start from the same initial weights and read the same batches in the same order (same seed);
only ``mixed_precision`` differs. The training loss (label-smoothed, mean over each 10 steps) and the
validation loss every 100 steps are compared point by point; the script reports the largest relative gap
and the target tokens/s of each run, and draws both curves. Writes
``benchmarks/results/bf16-vs-fp32.{json,md,png}`` (``--output`` to change the folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reporting import check_multi30k, cpu_name, multi30k_folder  # noqa: E402  (benchmarks/reporting.py)

from vanilla_transformer.training import train  # noqa: E402
from vanilla_transformer.training_config import TrainConfig  # noqa: E402

# the model and recipe of benchmarks/multi30k.py (one process)
MODEL = {
    "d_model": 256,
    "encoder_layers": 3,
    "decoder_layers": 3,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 1024,
    "decoder_ffn_dim": 1024,
    "dropout": 0.3,
}
SMOKE_MODEL = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "dropout": 0.1,
}


def run(precision: str, args: argparse.Namespace, tokenizer: Path | None) -> dict:
    config = TrainConfig(
        dataset_name=str(args.data),
        source_lang=args.src_lang,
        target_lang=args.tgt_lang,
        validation_split="validation",
        test_split=None,
        tokenizer_name=None if tokenizer is None else str(tokenizer),
        vocab_size=400 if args.smoke else 8000,
        config_overrides=SMOKE_MODEL if args.smoke else MODEL,
        max_tokens=256 if args.smoke else 2500,
        warmup_steps=300,
        lr_factor=0.3,
        max_steps=args.steps,
        logging_steps=args.log_every,
        eval_steps=args.eval_every,
        eval_bleu_sentences=0,
        save_steps=10**6,
        save_total_limit=1,
        average_last=1,
        mixed_precision=precision,
        seed=args.seed,
        output_dir=str(args.workdir / precision),
        disable_tqdm=args.smoke,
    )
    summary = train(config)
    state_file = sorted((args.workdir / precision / "checkpoints").glob("checkpoint-*/trainer_state.json"))[-1]
    history = json.loads(state_file.read_text())["history"]
    return {
        "precision": precision,
        "target_tokens_per_s": summary["target_tokens"] / summary["loop_seconds"],
        "seconds_per_step": summary["loop_seconds"] / summary["step"],  # evaluations excluded
        "train": [(r["step"], r["train_loss"]) for r in history if "train_loss" in r],
        "valid": [(r["step"], r["valid_loss"]) for r in history if "valid_loss" in r],
    }


def compare(fp32: dict, bf16: dict) -> dict:
    def gaps(key: str) -> list[tuple[int, float]]:
        other = dict(bf16[key])
        return [(step, abs(other[step] - value) / value) for step, value in fp32[key] if step in other]

    train_gaps, valid_gaps = gaps("train"), gaps("valid")
    return {
        "max_relative_gap_train": max(g for _, g in train_gaps),
        "mean_relative_gap_train": sum(g for _, g in train_gaps) / len(train_gaps),
        "max_relative_gap_valid": max((g for _, g in valid_gaps), default=float("nan")),
        "speedup_bf16": bf16["target_tokens_per_s"] / fp32["target_tokens_per_s"],
    }


def draw(fp32: dict, bf16: dict, comparison: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    for run_, color in ((fp32, "tab:blue"), (bf16, "tab:orange")):
        steps, losses = zip(*run_["train"])
        ax.plot(
            steps,
            losses,
            color=color,
            lw=1.4,
            label=f"{run_['precision']} training loss ({run_['target_tokens_per_s']:,.0f} target tokens/s)",
        )
        if run_["valid"]:
            steps, losses = zip(*run_["valid"])
            ax.plot(steps, losses, "o--", color=color, ms=5, label=f"{run_['precision']} validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("label-smoothed cross-entropy (nats per target token)")
    ax.set_title(
        f"bf16 autocast vs fp32: largest relative gap {comparison['max_relative_gap_train']:.2%} (training), "
        f"{comparison['max_relative_gap_valid']:.2%} (validation)",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=multi30k_folder(),
        help="Multi30k task 1 files (python scripts/get_multi30k.py puts them in data/multi30k)",
    )
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a tiny model (checks the script itself)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--workdir", type=Path, default=ROOT / "outputs" / "bf16-vs-fp32")
    parser.add_argument(
        "--name", help="writes bf16-vs-fp32-NAME.{json,md,png} (default: bf16-vs-fp32.*), e.g. for another machine"
    )
    args = parser.parse_args(argv)
    check_multi30k(args.data, parser, splits=("train",))
    if args.workdir.exists():
        import shutil

        shutil.rmtree(args.workdir)
    fp32 = run("no", args, None)
    fp32["precision"] = "fp32"
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # a second Accelerator with another precision
    bf16 = run("bf16", args, args.workdir / "no" / "tokenizer")  # the same tokenizer, so the same ids
    comparison = compare(fp32, bf16)
    environment = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": cpu_name(),
    }
    report = {"environment": environment, "steps": args.steps, "fp32": fp32, "bf16": bf16, **comparison}
    args.output.mkdir(parents=True, exist_ok=True)
    stem = "bf16-vs-fp32" if args.name is None else f"bf16-vs-fp32-{args.name}"
    (args.output / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    draw(fp32, bf16, comparison, args.output / f"{stem}.png")
    lines = [
        "| steps | fp32 tokens/s | bf16 tokens/s | bf16 speed-up | largest gap, training loss | mean gap | "
        "largest gap, validation loss |",
        "|---|---|---|---|---|---|---|",
        f"| {args.steps} | {fp32['target_tokens_per_s']:,.0f} | {bf16['target_tokens_per_s']:,.0f} | "
        f"{comparison['speedup_bf16']:.2f}x | {comparison['max_relative_gap_train']:.2%} | "
        f"{comparison['mean_relative_gap_train']:.2%} | {comparison['max_relative_gap_valid']:.2%} |",
    ]
    (args.output / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
