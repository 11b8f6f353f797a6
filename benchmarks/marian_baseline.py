"""The baseline of the Multi30k results: transformers' MarianMTModel with benchmarks/multi30k.py's sizes, trained from
scratch by transformers' Seq2SeqTrainer as a transformers user would train it, and scored as the package's runs are.

    python benchmarks/marian_baseline.py                  # de-en, 10 epochs (about an hour on 2 cores)
    python benchmarks/marian_baseline.py --resume         # go on from the newest checkpoint after a stop
    python benchmarks/marian_baseline.py --smoke --epochs 1 --data DIR --output-root DIR --results-dir DIR

The model: ``MarianMTModel`` configured like the paper (post-LN, sinusoidal positions, embeddings × √d_model,
one matrix for both embeddings and the output layer, ReLU), multi30k.py's sizes (d_model 256, 3+3 layers,
4 heads, d_ff 1024) and transformers' default dropout, 0.1. The tokenizer: a joint byte-level BPE of 8,000
tokens trained on the training pairs, as multi30k.py's runs train theirs.

The training: ``Seq2SeqTrainingArguments`` with label smoothing 0.1, Adam (0.9, 0.98, 1e-9), the inverse
square root schedule with 300 warm-up steps to multi30k.py's peak learning rate (1.1e-3), batches of 64 pairs
grouped by length (``train_sampling_strategy="group_by_length"``), 10 epochs, a checkpoint every epoch, fp32.
Plain ``Seq2SeqTrainer``: logits, then transformers' ``LabelSmoother``.

The test: test_2016_flickr, beam 4, α 0.6, at most the longest source + 50 new tokens (``generate`` takes one
limit for a batch, not the package's source + 50 per sentence; a trained model rarely comes near either),
sacreBLEU and chrF as the package reports them. Writes benchmarks/results/marian-baseline.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import multi30k  # noqa: E402  (benchmarks/multi30k.py)
import speed  # noqa: E402  (benchmarks/speed.py: MarianMTModel configured like the paper)
from reporting import check_multi30k, cpu_name, multi30k_folder, shown_command, write_report  # noqa: E402

from vanilla_transformer.data import load_parallel_corpus  # noqa: E402
from vanilla_transformer.evaluation import score, translate  # noqa: E402
from vanilla_transformer.finetuning import make_training_arguments, prepare_datasets  # noqa: E402
from vanilla_transformer.tokenization import config_ids_from_tokenizer, train_joint_bpe  # noqa: E402

SMOKE_MODEL = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}
WARMUP_STEPS = 300
LR_FACTOR = multi30k.RECIPE["lr_factor"]  # peak 1.1e-3 at d_model 256 and 300 warm-up steps


def build_marian(tokenizer, sizes: dict, dropout: float, seed: int):
    """A fresh MarianMTModel configured like the paper, its special ids the tokenizer's."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    config = MarianConfig(
        **sizes,
        **config_ids_from_tokenizer(tokenizer),
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        **speed.MARIAN_AS_THE_PAPER,
    )
    return MarianMTModel(config)


def train_and_score(args) -> dict:
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

    src, tgt = args.direction.split("-")
    corpus = load_parallel_corpus(str(args.data), src, tgt)
    folder = args.output_root / f"marian-baseline-{args.direction}"
    tokenizer = train_joint_bpe(
        itertools.chain(corpus["train"]["source"], corpus["train"]["target"]), vocab_size=args.vocab_size
    )
    model = build_marian(tokenizer, SMOKE_MODEL if args.smoke else multi30k.MODEL, args.dropout, args.seed)
    train_set, _, dropped = prepare_datasets(corpus["train"], None, tokenizer)
    steps_per_epoch = math.ceil(len(train_set) / args.batch_size)
    training = make_training_arguments(
        folder,
        model.config.d_model,
        warmup_steps=WARMUP_STEPS,
        lr_factor=LR_FACTOR,
        max_steps=steps_per_epoch * args.epochs,
        per_device_train_batch_size=args.batch_size,
        save_steps=steps_per_epoch,
        seed=args.seed,
        save_total_limit=2,
        train_sampling_strategy="group_by_length",
        predict_with_generate=False,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=args.smoke,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=training,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=train_set,
        processing_class=tokenizer,
    )
    resume = args.resume and any(folder.glob("checkpoint-*"))
    metrics = trainer.train(resume_from_checkpoint=True if resume else None).metrics
    test = corpus[args.test_split]
    longest = max(len(ids) for ids in tokenizer(list(test["source"]))["input_ids"])
    started = time.monotonic()
    hypotheses = translate(
        model, tokenizer, list(test["source"]), num_beams=4, length_penalty=0.6, max_new_tokens=longest + 50
    )
    result = score(hypotheses, list(test["target"]))
    (folder / f"{args.test_split}.hyp.{tgt}").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    return {
        "direction": args.direction,
        "model": {**model.config.to_diff_dict(), "parameters": sum(p.numel() for p in model.parameters())},
        "training": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "steps": trainer.state.global_step,
            "warmup_steps": WARMUP_STEPS,
            "peak_learning_rate": training.learning_rate,
            "label_smoothing": training.label_smoothing_factor,
            "dropout": args.dropout,
            "train_sampling_strategy": "group_by_length",
            "dropped_pairs": dropped["train"],
            "train_seconds": metrics["train_runtime"],  # this start's (after a --resume, only what it trained)
            "resumed": bool(resume),
            "final_loss": metrics.get("train_loss"),
        },
        "test": {
            "split": args.test_split,
            "sentences": len(hypotheses),
            "max_new_tokens": longest + 50,
            "decode_seconds": time.monotonic() - started,
            **{k: result[k] for k in ("bleu", "bleu_signature", "chrf", "chrf_signature")},
        },
        "machine": cpu_name() if not torch.cuda.is_available() else multi30k.gpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "revision": args.revision,
        "command": args.command,
    }


def markdown(run: dict) -> str:
    t, test = run["training"], run["test"]
    return (
        "| model | direction | epochs | steps | training | test sacreBLEU | chrF | machine |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| MarianMTModel, d_model {run['model']['d_model']}, {run['model']['encoder_layers']}+"
        f"{run['model']['decoder_layers']} layers, {run['model']['parameters']:,} parameters | {run['direction']} | "
        f"{t['epochs']} | {t['steps']:,} | {t['train_seconds'] / 60:.0f} min | {test['bleu']:.2f} | "
        f"{test['chrf']:.2f} | {run['machine']}, {run['threads']} thread(s) |\n\n"
        f"Seq2SeqTrainer: batches of {t['batch_size']} pairs grouped by length, label smoothing "
        f"{t['label_smoothing']}, inverse square root schedule, {t['warmup_steps']} warm-up steps to "
        f"{t['peak_learning_rate']:.2g}, dropout {t['dropout']}. Test: {test['split']} ({test['sentences']} "
        f"sentences), beam 4, α 0.6, at most {test['max_new_tokens']} new tokens; `{test['bleu_signature']}`.\n"
        f"Command: `{run['command']}` at {run['revision']}, {run['date']}.\n"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--direction", default="de-en", choices=["de-en", "en-de"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="sentence pairs per step (default 64)")
    parser.add_argument("--dropout", type=float, default=0.1, help="MarianConfig's dropout (default: its default)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=multi30k_folder())
    parser.add_argument("--test-split", default="test_2016_flickr")
    parser.add_argument("--output-root", type=Path, default=ROOT / "outputs")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--name", default="marian-baseline", help="results file stem")
    parser.add_argument("--resume", action="store_true", help="go on from the run's newest checkpoint")
    parser.add_argument("--smoke", action="store_true", help="a tiny model (checks the script itself)")
    args = parser.parse_args(argv)
    check_multi30k(args.data, parser, splits=("train", args.test_split))
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: give 1 or more")
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout {args.dropout}: give a probability in [0, 1)")
    folder = args.output_root / f"marian-baseline-{args.direction}"
    if any(folder.glob("checkpoint-*")) and not args.resume:
        parser.error(f"{folder} holds an earlier run: go on with it with --resume, or move or delete it")
    if args.smoke:
        args.vocab_size = min(args.vocab_size, 400)
    args.revision = multi30k._git_revision()
    args.command = shown_command("marian_baseline.py", sys.argv[1:] if argv is None else argv)
    run = train_and_score(args)
    write_report(args.results_dir, args.name, run, markdown(run))
    print(markdown(run))
    return run


if __name__ == "__main__":
    main()
