"""Training speed through transformers' ``Seq2SeqTrainer``, side by side with MarianMTModel of the same sizes.

    python benchmarks/trainer_speed.py --threads 1   # the committed run: d_model 256, 3+3 layers, vocabulary 8,000,
                                                     # fp32 (~6 min)
    python benchmarks/trainer_speed.py               # torch's number of threads
    python benchmarks/trainer_speed.py --smoke       # tiny sizes, one repeat: checks the script itself

Four ways to run one training step on the same batches, label smoothing 0.1 throughout:

* ``marian``: ``Seq2SeqTrainer(label_smoothing_factor=0.1).training_step`` on MarianMTModel: the model
  returns logits, transformers' ``LabelSmoother`` smooths them, the Trainer back-propagates.
* ``ours_label_smoother``: the same ``Seq2SeqTrainer`` on this model (logits, then ``LabelSmoother``).
* ``ours_fused``: the package's ``TranslationSeq2SeqTrainer``, whose ``compute_loss`` passes the labels to
  the model with ``smoothing=0.1, skip_logits=True``: the same loss, computed block-wise without logits.
* ``ours_package_step``: no Trainer, ``model(**batch, smoothing=0.1, skip_logits=True).loss.backward()``,
  the package's own training step (as in ``benchmarks/speed.py``), for reference.

Each step is the Trainer's ``training_step`` (inputs to the device, ``compute_loss`` with the Trainer's
``num_items_in_batch``, backward through Accelerate) followed by the Trainer's optimizer (torch's fused
AdamW, weight decay 0, from ``create_optimizer``) and ``zero_grad``; the package step uses the same
optimizer. Models as in ``speed.py`` (Marian configured like the paper; dropout 0.1; sdpa attention for
both, Marian's faster one in fp32 there). Batches: random ids, every pair's source and target length drawn
from 16..48, padded as ``DataCollatorForSeq2Seq`` pads them (labels with -100, ``decoder_input_ids`` the
labels shifted right), about 4,100 target tokens per batch of 128 pairs. All four take every round's batch
in turn, the order rotating from round to round; figures are medians over the rounds, after warm-up.
Tokens/s counts non-padding target tokens. The speed against Marian is the median of the rounds' ratios
(each round's rows ran on the same batch, one after the other), and, beside it, the ratio of the fastest
rounds. On a 2-core machine shared with other work, one thread (``--threads 1``) keeps a step from waiting
for a core that another process holds: with 2 threads the same step ranged from 3 to 16 s.

Writes ``benchmarks/results/trainer-speed.{json,md}`` (``--smoke``: under ``--output``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOOTHING = 0.1
ROWS = {
    "marian": "MarianMTModel, Seq2SeqTrainer (logits + LabelSmoother)",
    "ours_label_smoother": "ours, Seq2SeqTrainer (logits + LabelSmoother)",
    "ours_fused": "ours, TranslationSeq2SeqTrainer (fused loss)",
    "ours_package_step": "ours, the package's own step (no Trainer)",
}


def make_batches(size: dict, count: int, pairs: int, lengths: tuple[int, int], seed: int = 0) -> list[dict]:
    """``count`` padded batches of random pairs, as DataCollatorForSeq2Seq lays them out (pad id 0,
    decoder start 1, for both models)."""
    from vanilla_transformer.modeling_vanilla_transformer import shift_tokens_right

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        src_len = torch.randint(lengths[0], lengths[1] + 1, (pairs,), generator=g)
        tgt_len = torch.randint(lengths[0], lengths[1] + 1, (pairs,), generator=g)
        src = torch.randint(4, size["vocab_size"], (pairs, int(src_len.max())), generator=g)
        labels = torch.randint(4, size["vocab_size"], (pairs, int(tgt_len.max())), generator=g)
        attention_mask = (torch.arange(src.shape[1]) < src_len[:, None]).long()
        src = src.masked_fill(attention_mask == 0, 0)
        labels = labels.masked_fill(torch.arange(labels.shape[1]) >= tgt_len[:, None], -100)
        out.append(
            {
                "input_ids": src,
                "attention_mask": attention_mask,
                "labels": labels,
                "decoder_input_ids": shift_tokens_right(labels, 0, 1),
            }
        )
    return out


def training_arguments(output_dir: str):
    from transformers import Seq2SeqTrainingArguments

    return Seq2SeqTrainingArguments(
        output_dir=output_dir,
        label_smoothing_factor=SMOOTHING,
        learning_rate=1e-4,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        max_grad_norm=0.0,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )


def make_steps(size: dict, output_dir: str) -> tuple[dict, dict]:
    """A function per row running one optimizer step on a given batch; and a check that the fused row
    really skipped the logits while the LabelSmoother rows made them."""
    from transformers import Seq2SeqTrainer

    from vanilla_transformer.finetuning import TranslationSeq2SeqTrainer

    args = training_arguments(output_dir)
    trainers = {
        "marian": Seq2SeqTrainer(model=speed.build("marian", size), args=args),
        "ours_label_smoother": Seq2SeqTrainer(model=speed.build("ours", size), args=args),
        "ours_fused": TranslationSeq2SeqTrainer(model=speed.build("ours", size), args=args),
    }
    package_model = speed.build("ours", size)
    package_optimizer = Seq2SeqTrainer(model=package_model, args=args).create_optimizer()

    steps = {}
    for name, trainer in trainers.items():
        optimizer = trainer.create_optimizer()
        trainer.model.train()

        def step(batch, trainer=trainer, optimizer=optimizer):
            num_items = (batch["labels"] != -100).sum()  # what the Trainer's training loop passes
            trainer.training_step(trainer.model, dict(batch), num_items)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        steps[name] = step

    package_workspace = {}  # the loss's logits kept from step to step, as the training loop keeps them

    def package_step(batch):
        package_model.train()
        package_model(**batch, smoothing=SMOOTHING, skip_logits=True, loss_workspace=package_workspace).loss.backward()
        package_optimizer.step()
        package_optimizer.zero_grad(set_to_none=True)

    steps["ours_package_step"] = package_step
    return steps, trainers


def check_paths(trainers: dict, batch: dict) -> dict:
    """Whether each Trainer row's compute_loss made logits (it should, but for the fused row)."""
    made_logits = {}
    for name, trainer in trainers.items():
        trainer.model.train()
        with torch.no_grad():
            _, outputs = trainer.compute_loss(trainer.model, dict(batch), return_outputs=True, num_items_in_batch=None)
        made_logits[name] = outputs.logits is not None
    return made_logits


def measure(steps: dict, batches: list[dict], warmup: int, repeats: int) -> dict:
    """Per row: the seconds of each measured round. Round r uses batch r mod len(batches) for every
    row; the order of the rows rotates by one each round."""
    names = list(steps)
    times = {name: [] for name in names}
    for r in range(warmup + repeats):
        batch = batches[r % len(batches)]
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            steps[name](batch)
            if r >= warmup:
                times[name].append((time.perf_counter() - start, int((batch["labels"] != -100).sum())))
    return times


def summarise(times: dict) -> list[dict]:
    """Per row: median and best target tokens/s and step time; the speed against Marian as the median
    of the rounds' ratios (each round's rows ran on the same batch, one after the other) and as the
    ratio of the best rounds (on a shared machine, the least disturbed)."""
    marian = times["marian"]
    rows = []
    for name, runs in times.items():
        throughputs = [tokens / seconds for seconds, tokens in runs]
        rows.append(
            {
                "row": name,
                "description": ROWS[name],
                "tokens_per_s": statistics.median(throughputs),
                "best_tokens_per_s": max(throughputs),
                "step_ms": 1000 * statistics.median(s for s, _ in runs),
                "best_step_ms": 1000 * min(s for s, _ in runs),
                "ratio_to_marian": statistics.median(m / s for (s, _), (m, _) in zip(runs, marian)),
                "best_ratio_to_marian": min(m for m, _ in marian) / min(s for s, _ in runs),
                "repeats": len(runs),
            }
        )
    return rows


def markdown(results: dict) -> str:
    env, setup = results["environment"], results["setup"]
    lines = [
        f"Measured {env['date']} on {env['cpu']} ({env['threads']} thread{'' if env['threads'] == 1 else 's'}), "
        f"torch {env['torch']}, transformers "
        f"{env['transformers']}. Command: `{env['command']}`",
        "",
        f"**One training step** (d_model {setup['d_model']}, {setup['layers']}+{setup['layers']} layers, "
        f"vocabulary {setup['vocab_size']:,}, {setup['precision']}; "
        f"{setup['batches']} random batches of {setup['pairs']} pairs, "
        f"lengths {setup['lengths'][0]}–{setup['lengths'][1]}, "
        f"{setup['mean_target_tokens']:,.0f} target tokens on average; "
        f"label smoothing {SMOOTHING}; medians of {setup['repeats']} rounds after {setup['warmup']} warm-up rounds, "
        "the rows taken in turn)",
        "",
        "| path | target tokens/s | step ms | / Marian | best step ms | best / best Marian |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['description']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:,.0f} | **{r['ratio_to_marian']:.2f}** | "
            f"{r['best_step_ms']:,.0f} | {r['best_ratio_to_marian']:.2f} |"
        )
    lines += [
        "",
        "tokens/s and step ms: medians over the rounds; / Marian: the median of the rounds' ratios (same batch, "
        "run one after the other); best: the fastest round of each row.",
    ]
    made = results["made_logits"]
    lines += [
        "",
        "Logits made by `compute_loss` in training: "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in made.items())
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    import transformers

    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=128, help="sentence pairs per batch")
    parser.add_argument("--batches", type=int, default=4, help="distinct random batches, used in turn")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (tests use it)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    size = speed.SIZES["smoke" if args.smoke else "small"]
    lengths = (4, 12) if args.smoke else (16, 48)
    if args.smoke:
        args.repeats, args.warmup, args.pairs, args.batches = 1, 1, 8, 2

    if args.threads:
        torch.set_num_threads(args.threads)
    batches = make_batches(size, args.batches, args.pairs, lengths)
    with tempfile.TemporaryDirectory() as output_dir:
        steps, trainers = make_steps(size, output_dir)
        made_logits = check_paths(trainers, batches[0])
        times = measure(steps, batches, args.warmup, args.repeats)
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    results = {
        "environment": {
            "date": time.strftime("%Y-%m-%d"),
            "cpu": cpu,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "command": " ".join(
                ["python", "benchmarks/trainer_speed.py", *(argv if argv is not None else sys.argv[1:])]
            ),
        },
        "setup": {
            "d_model": size["d_model"],
            "layers": size["layers"],
            "heads": size["heads"],
            "d_ff": size["ffn"],
            "vocab_size": size["vocab_size"],
            "precision": "fp32",
            "pairs": args.pairs,
            "batches": args.batches,
            "lengths": list(lengths),
            "mean_target_tokens": statistics.mean(int((b["labels"] != -100).sum()) for b in batches),
            "repeats": args.repeats,
            "warmup": args.warmup,
            "label_smoothing": SMOOTHING,
        },
        "made_logits": made_logits,
        "rows": summarise(times),
        "seconds": {name: [s for s, _ in runs] for name, runs in times.items()},
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "trainer-speed.json").write_text(json.dumps(results, indent=2))
    (args.output / "trainer-speed.md").write_text(markdown(results))
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
