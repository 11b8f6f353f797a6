"""Fine-tune a Transformer with transformers' Seq2SeqTrainer, with the paper's optimiser, schedule and smoothing.

A saved model folder (e.g. RUN/final of `vanilla-transformer train`) or a fresh preset of Table 3 (with a joint
BPE trained on the training pairs) is trained on a parallel corpus, evaluated (loss, sacreBLEU and chrF of beam
search) and saved to --output_dir, loadable with `from_pretrained`. The pieces are in
vanilla_transformer/finetuning.py:

    python examples/finetune_seq2seq_trainer.py --model_name_or_path RUN/final --dataset_name data/tatoeba_en_de \\
        --max_steps 2000
    python examples/finetune_seq2seq_trainer.py --preset base --d_model 256 --layers 3 --heads 4 --d_ff 1024 \\
        --dataset_name data/tatoeba_en_de --vocab_size 8000 --max_steps 3000 --warmup_steps 800 --output_dir outputs/ft

Options are spelt as in transformers' Seq2SeqTrainingArguments and its translation example (run_translation.py),
with `_` or `-` between words; older spellings (--data, --src-lang, --max-train-pairs, ...) still work and say
what replaced them.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vanilla_transformer.finetuning import train_with_seq2seq_trainer


class _OldSpelling(argparse.Action):
    """An older spelling of an option: it still works, and says which spelling replaced it."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(
            f"{parser.prog}: {option_string} is an old spelling of {self.new}; it still works, but use {self.new}.",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def _option(group: Any, name: str, *old: str, **kwargs: Any) -> None:
    """``--name`` (also spelt with ``-`` for ``_``), and hidden older spellings (``--old-name``, ``--old_name``)."""
    group.add_argument(*dict.fromkeys([f"--{name}", f"--{name.replace('_', '-')}"]), dest=name, **kwargs)
    flag = kwargs.get("action") == "store_true"
    for spelling in old:
        for variant in dict.fromkeys([f"--{spelling}", f"--{spelling.replace('_', '-')}"]):
            group.add_argument(
                variant,
                action=_OldSpelling,
                new=f"--{name}",
                dest=name,
                nargs=0 if flag else None,
                const=True if flag else None,
                type=kwargs.get("type"),
                choices=kwargs.get("choices"),
            )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``; ``None``: ``sys.argv[1:]``), without running anything."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=Path(__file__).name,
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    what = parser.add_argument_group("model (a saved folder, or a preset with optional size overrides)")
    start = what.add_mutually_exclusive_group()
    _option(start, "model_name_or_path", "model", help="saved model folder to fine-tune; none: a fresh --preset")
    _option(start, "preset", choices=("base", "big"), default="base", help="a fresh model of Table 3")
    _option(
        what,
        "tokenizer_name",
        "tokenizer",
        help="tokenizer folder; none: the model folder's, or a new joint BPE for a preset",
    )
    _option(what, "vocab_size", type=int, default=8000, help="joint BPE size for a preset")
    _option(what, "d_model", type=int, help="width of a preset (d_model); none: the preset's")
    _option(what, "layers", type=int, help="encoder and decoder layers of a preset; none: the preset's")
    _option(what, "heads", type=int, help="attention heads of a preset; none: the preset's")
    _option(what, "d_ff", type=int, help="inner size of a preset's feed-forward layers; none: the preset's")
    _option(what, "dropout", type=float, help="dropout of a preset; none: the preset's")
    _option(what, "attn_implementation", choices=("sdpa", "eager"), help="attention implementation; none: the model's")

    data = parser.add_argument_group("data")
    _option(
        data,
        "dataset_name",
        "data",
        default="data/tatoeba_en_de",
        help="folder of {split}.{lang} files, .tsv, .jsonl, path prefix or Hub dataset name",
    )
    _option(data, "dataset_config_name", "hub_config", help="configuration of a Hub dataset, e.g. de-en for wmt14")
    _option(data, "source_lang", "src_lang", default="en", help="source language (file suffix or record key)")
    _option(data, "target_lang", "tgt_lang", default="de", help="target language (file suffix or record key)")
    _option(data, "train_split", default="train", help="split to train on")
    _option(
        data, "validation_split", "eval_split", default="validation", help="split to evaluate on (empty: no evaluation)"
    )
    _option(data, "max_length", type=int, default=128, help="drop pairs longer than this many tokens (either side)")
    _option(data, "max_train_samples", "max_train_pairs", type=int, help="use the first N training pairs; none: all")
    _option(
        data,
        "max_eval_samples",
        "max_eval_pairs",
        type=int,
        default=200,
        help="translate and score the first N evaluation pairs",
    )

    train = parser.add_argument_group("training (Seq2SeqTrainingArguments)")
    _option(train, "output_dir", default="outputs/finetune", help="where checkpoints and the final model go")
    _option(train, "max_steps", type=int, default=1000, help="optimizer updates to run")
    _option(train, "warmup_steps", type=int, default=4000, help="warm-up updates of the paper's schedule (§5.3)")
    _option(train, "lr_factor", type=float, default=1.0, help="multiplies the paper's learning-rate schedule")
    _option(train, "per_device_train_batch_size", type=int, default=64, help="sentence pairs per training micro-batch")
    _option(
        train,
        "per_device_eval_batch_size",
        type=int,
        help="sentence pairs per evaluation batch; none: the training batch size",
    )
    _option(train, "gradient_accumulation_steps", type=int, default=1, help="micro-batches per optimizer update")
    _option(
        train, "label_smoothing_factor", "label_smoothing", type=float, default=0.1, help="label smoothing (§5.4: 0.1)"
    )
    _option(train, "num_beams", type=int, default=4, help="beam size of evaluation (§6.1: 4)")
    _option(train, "bf16", action="store_true", help="bf16 autocast (on the CPU when no bf16 GPU is present)")
    _option(train, "eval_steps", type=int, help="evaluate every N updates; none: only at the end")
    _option(train, "save_steps", type=int, help="write a checkpoint every N updates; none: no checkpoints")
    _option(train, "logging_steps", type=int, default=50, help="log loss and learning rate every N updates")
    _option(train, "eval_before", action="store_true", help="also evaluate before training")
    _option(train, "seed", type=int, default=0, help="seed of data order and dropout")
    _option(train, "disable_tqdm", "no_progress", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    sizes = {
        "d_model": args.d_model,
        "encoder_layers": args.layers,
        "decoder_layers": args.layers,
        "encoder_attention_heads": args.heads,
        "decoder_attention_heads": args.heads,
        "encoder_ffn_dim": args.d_ff,
        "decoder_ffn_dim": args.d_ff,
        "dropout": args.dropout,
    }
    sizes = {name: value for name, value in sizes.items() if value is not None}
    if args.model_name_or_path and sizes:
        raise SystemExit(
            "--d_model/--layers/--heads/--d_ff/--dropout apply to a --preset, not to a saved --model_name_or_path."
        )

    result = train_with_seq2seq_trainer(
        args.dataset_name,
        args.output_dir,
        model=args.model_name_or_path,
        tokenizer=args.tokenizer_name,
        preset=args.preset,
        model_overrides=sizes,
        vocab_size=args.vocab_size,
        src_lang=args.source_lang,
        tgt_lang=args.target_lang,
        hub_config=args.dataset_config_name,
        train_split=args.train_split,
        eval_split=args.validation_split or None,
        max_length=args.max_length,
        max_train_pairs=args.max_train_samples,
        max_eval_pairs=args.max_eval_samples,
        attn_implementation=args.attn_implementation,
        eval_before=args.eval_before,
        # Seq2SeqTrainingArguments, through make_training_arguments
        max_steps=args.max_steps,
        warmup_steps=args.warmup_steps,
        lr_factor=args.lr_factor,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        label_smoothing=args.label_smoothing_factor,
        num_beams=args.num_beams,
        bf16=args.bf16,
        eval_steps=args.eval_steps,
        save_steps=args.save_steps,
        logging_steps=args.logging_steps,
        seed=args.seed,
        disable_tqdm=args.disable_tqdm,
    )
    summary = {"output_dir": str(result.output_dir), "train": result.train_metrics, "eval": result.eval_after}
    if result.eval_before is not None:
        summary["eval_before"] = result.eval_before
    print(json.dumps(summary, indent=2, default=str))
    return summary


if __name__ == "__main__":
    main()
