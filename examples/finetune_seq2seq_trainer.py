"""Fine-tune a Transformer with transformers' Seq2SeqTrainer, with the paper's optimiser, schedule and smoothing.

A saved model folder (e.g. RUN/final of `vanilla-transformer train`) or a fresh preset of Table 3 (with a joint
BPE trained on the training pairs) is trained on a parallel corpus, evaluated (loss, sacreBLEU and chrF of beam
search) and saved to --output-dir, loadable with `from_pretrained`. The pieces are in
vanilla_transformer/finetuning.py:

    python examples/finetune_seq2seq_trainer.py --model RUN/final --data data/tatoeba_en_de --max-steps 2000
    python examples/finetune_seq2seq_trainer.py --preset base --d-model 256 --layers 3 --heads 4 --d-ff 1024 \\
        --data data/tatoeba_en_de --vocab-size 8000 --max-steps 3000 --warmup-steps 800 --output-dir outputs/ft
"""

import argparse
import json

from vanilla_transformer.finetuning import finetune


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_argument_group("model (a saved folder, or a preset with optional size overrides)")
    start = what.add_mutually_exclusive_group()
    start.add_argument("--model", help="saved model folder to fine-tune")
    start.add_argument("--preset", choices=("base", "big"), default="base", help="a fresh model of Table 3")
    what.add_argument("--tokenizer", help="tokenizer folder (default: the model folder; a new joint BPE for a preset)")
    what.add_argument("--vocab-size", type=int, default=8000, help="joint BPE size for a preset")
    what.add_argument("--d-model", type=int)
    what.add_argument("--layers", type=int, help="encoder and decoder layers")
    what.add_argument("--heads", type=int, help="attention heads")
    what.add_argument("--d-ff", type=int, help="inner size of the feed-forward layers")
    what.add_argument("--dropout", type=float)
    what.add_argument("--attn-implementation", choices=("sdpa", "eager"))

    data = parser.add_argument_group("data")
    data.add_argument("--data", default="data/tatoeba_en_de", help="folder, .tsv, .jsonl, path prefix or Hub name")
    data.add_argument("--hub-config", help="configuration of a Hub dataset, e.g. de-en for wmt14")
    data.add_argument("--src-lang", default="en")
    data.add_argument("--tgt-lang", default="de")
    data.add_argument("--train-split", default="train")
    data.add_argument("--eval-split", default="validation", help="split to evaluate on (empty: no evaluation)")
    data.add_argument("--max-length", type=int, default=128, help="drop pairs longer than this (tokens)")
    data.add_argument("--max-train-pairs", type=int, help="use the first N training pairs")
    data.add_argument("--max-eval-pairs", type=int, default=200, help="translate and score the first N eval pairs")

    train = parser.add_argument_group("training (Seq2SeqTrainingArguments)")
    train.add_argument("--output-dir", default="outputs/finetune")
    train.add_argument("--max-steps", type=int, default=1000)
    train.add_argument("--warmup-steps", type=int, default=4000)
    train.add_argument("--lr-factor", type=float, default=1.0, help="multiplies the paper's learning-rate schedule")
    train.add_argument("--per-device-train-batch-size", type=int, default=64)
    train.add_argument("--per-device-eval-batch-size", type=int)
    train.add_argument("--gradient-accumulation-steps", type=int, default=1)
    train.add_argument("--label-smoothing", type=float, default=0.1)
    train.add_argument("--num-beams", type=int, default=4)
    train.add_argument("--bf16", action="store_true", help="bf16 autocast (on the CPU when no bf16 GPU is present)")
    train.add_argument("--eval-steps", type=int, help="evaluate every N updates (default: only at the end)")
    train.add_argument("--save-steps", type=int, help="write a checkpoint every N updates (default: none)")
    train.add_argument("--logging-steps", type=int, default=50)
    train.add_argument("--eval-before", action="store_true", help="also evaluate before training")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
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
    if args.model and sizes:
        raise SystemExit("--d-model/--layers/--heads/--d-ff/--dropout apply to a --preset, not to a saved --model.")

    result = finetune(
        args.data,
        args.output_dir,
        model=args.model,
        tokenizer=args.tokenizer,
        preset=args.preset,
        model_overrides=sizes,
        vocab_size=args.vocab_size,
        src_lang=args.src_lang,
        tgt_lang=args.tgt_lang,
        hub_config=args.hub_config,
        train_split=args.train_split,
        eval_split=args.eval_split or None,
        max_length=args.max_length,
        max_train_pairs=args.max_train_pairs,
        max_eval_pairs=args.max_eval_pairs,
        attn_implementation=args.attn_implementation,
        eval_before=args.eval_before,
        # Seq2SeqTrainingArguments, through make_training_arguments
        max_steps=args.max_steps,
        warmup_steps=args.warmup_steps,
        lr_factor=args.lr_factor,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        label_smoothing=args.label_smoothing,
        num_beams=args.num_beams,
        bf16=args.bf16,
        eval_steps=args.eval_steps,
        save_steps=args.save_steps,
        logging_steps=args.logging_steps,
        seed=args.seed,
        disable_tqdm=args.no_progress,
    )
    summary = {"output_dir": str(result.output_dir), "train": result.train_metrics, "eval": result.eval_after}
    if result.eval_before is not None:
        summary["eval_before"] = result.eval_before
    print(json.dumps(summary, indent=2, default=str))
    return summary


if __name__ == "__main__":
    main()
