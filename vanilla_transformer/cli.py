"""Command line: ``vanilla-transformer <command> ...`` (also ``python -m vanilla_transformer``).

Each command imports what it runs (Accelerate, datasets, sacreBLEU, matplotlib) only when it runs.
"""

import argparse
import dataclasses
import json
import sys
from typing import Any

from transformers import HfArgumentParser

from .training_config import TrainConfig, options_from_file


def train_command(args: argparse.Namespace) -> int:
    from .training import train

    summary = train(TrainConfig(**{field.name: getattr(args, field.name) for field in dataclasses.fields(TrainConfig)}))
    if "final_dir" not in summary:  # not the main process: it saves and scores nothing
        return 0
    print(f"trained {summary['step']} steps, {summary['target_tokens']:,} target tokens in "
          f"{summary['loop_seconds'] / 60:.1f} min ({summary['stop_reason']}); "
          f"averaged {len(summary['averaged_checkpoints'])} checkpoints; saved {summary['final_dir']}")  # fmt: skip
    if "test" in summary:
        test = summary["test"]
        print(f"test ({test['n']} sentences, beam search): sacreBLEU {test['bleu']:.2f}  {test['bleu_signature']}")
        print(f"                                      chrF {test['chrf']:.2f}  {test['chrf_signature']}")
    if "hub_commit" in summary:
        print(f"uploaded {summary['final_dir']} to the Hub: {summary['hub_commit']}")
    return 0


def average_command(args: argparse.Namespace) -> int:
    from .checkpoints import average_into_model
    from .loading import load_model

    model = load_model(args.model)
    average_into_model(model, args.checkpoints)
    model.save_pretrained(args.output_dir)
    print(f"averaged {len(args.checkpoints)} checkpoints into {args.output_dir}")
    return 0


def _device(name: str | None) -> str:
    """``--device``, or the GPU when there is one."""
    import torch

    return name or ("cuda" if torch.cuda.is_available() else "cpu")


def _read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _engine(args: argparse.Namespace) -> tuple[Any, Any]:
    """``--engine``: the saved model and its tokenizer (transformers), or an export (CTranslate2, its own tokenizer)."""
    if args.engine == "ctranslate2":
        from .deployment import CTranslate2Translator

        try:
            return CTranslate2Translator(args.model, device=_device(args.device)), None
        except ImportError as error:  # the optional extra is missing: say how to install it
            print(f"{args.command}: {error}", file=sys.stderr)
            raise SystemExit(2) from None
    from .loading import load_model_and_tokenizer

    return load_model_and_tokenizer(args.model, device=_device(args.device))


def evaluate_command(args: argparse.Namespace) -> int:
    from .evaluation import evaluate_model

    model, tokenizer = _engine(args)
    sources, references = _read_lines(args.source), _read_lines(args.reference)
    result = evaluate_model(
        model, tokenizer, sources, references, hypotheses_path=args.output, num_beams=args.num_beams,
        length_penalty=args.length_penalty, batch_size=args.batch_size, progress=True,
    )  # fmt: skip
    print(f"BLEU {result['bleu']:.2f}  {result['bleu_signature']}")
    print(f"chrF {result['chrf']:.2f}  {result['chrf_signature']}")
    return 0


def translate_command(args: argparse.Namespace) -> int:
    from .evaluation import translate

    model, tokenizer = _engine(args)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    for line in translate(model, tokenizer, texts, num_beams=args.num_beams, batch_size=args.batch_size):
        print(line)
    return 0


def export_command(args: argparse.Namespace) -> int:
    from .deployment import export_ctranslate2

    try:
        folder = export_ctranslate2(args.model, args.output_dir, quantization=args.quantization,
                                    max_positions=args.max_positions, force=args.force)  # fmt: skip
    except ImportError as error:  # the optional extra is missing: say how to install it
        print(f"export: {error}", file=sys.stderr)
        return 2
    print(f"exported {args.model} to {folder} (CTranslate2, {args.quantization})")
    return 0


def visualize_command(args: argparse.Namespace) -> int:
    from .loading import load_model_and_tokenizer
    from .visualization import draw_all

    if args.model is not None and args.source is None:
        print("visualize: --model needs --source (the sentence whose attention maps are drawn)", file=sys.stderr)
        return 2
    model = tokenizer = None
    if args.model is not None:
        model, tokenizer = load_model_and_tokenizer(args.model, attn_implementation="eager", device=args.device or "cpu")
    try:
        paths = draw_all(args.output_dir, model, tokenizer, source=args.source, target=args.target, layer=args.layer,
                         heads=args.heads, num_beams=args.num_beams)  # fmt: skip
    except ValueError as error:  # a layer or head that does not exist
        print(f"visualize: {error}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def explore_command(args: argparse.Namespace) -> int:
    from .explorer import launch

    try:
        launch(args.model, port=args.port, host=args.host, source=args.source or "")
    except ImportError as error:  # gradio (or matplotlib) is missing: the message says what to install
        print(f"explore: {error}", file=sys.stderr)
        return 1
    except ValueError as error:  # not a model folder
        print(f"explore: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the port is taken
        print(f"explore: {str(error).rstrip('.')}. Choose another port with --port.", file=sys.stderr)
        return 2
    return 0


def build_parser(train_defaults: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The command line; ``train_defaults`` replace TrainConfig's defaults (the values of ``train --config``)."""
    parser = argparse.ArgumentParser(prog="vanilla-transformer", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    # One option per TrainConfig field, with the field's help and default (HfArgumentParser reads them).
    options = HfArgumentParser(TrainConfig, add_help=False)
    options._option_string_actions["--no-progress"].help = "hide progress bars"  # it had --progress's help
    p = commands.add_parser(
        "train", parents=[options], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="train a translation model (the paper's recipe, on Accelerate)",
        description="Train a translation model with the paper's recipe, on Accelerate (one CPU, one GPU or many). "
        "The options below can also come from a YAML or JSON file (--config); those given here win over it.",
    )  # fmt: skip
    p.add_argument("--config", metavar="FILE", help="YAML or JSON file of these options; options given here win over it")
    # HfArgumentParser gives --model its field's type, dict[str, Any], which cannot read text: it is JSON.
    p.register("type", dict[str, Any], json.loads)
    p.set_defaults(func=train_command, **(train_defaults or {}))

    p = commands.add_parser("average", help="average the weights of several checkpoints (§6.1)")
    p.add_argument("checkpoints", nargs="+", help="checkpoint folders (holding model.safetensors)")
    p.add_argument("--model", required=True, help="a saved model folder with the same configuration")
    p.add_argument("--output-dir", required=True)
    p.set_defaults(func=average_command)

    for name, helptext in (("evaluate", "translate a test set and score it (sacreBLEU, chrF)"),
                           ("translate", "translate sentences given as arguments or on stdin")):  # fmt: skip
        p = commands.add_parser(name, help=helptext)
        p.add_argument("--model", required=True, help="a saved model folder (model + tokenizer)")
        p.add_argument("--num-beams", type=int, default=None, help="default: the model's (paper: 4)")
        p.add_argument("--batch-size", type=int, default=32)
        p.add_argument("--device", default=None, help="default: the GPU if there is one, else the CPU")
        p.add_argument("--engine", choices=["transformers", "ctranslate2"], default="transformers",
                       help="transformers (a saved model folder) or ctranslate2 (a folder written by `export`)")  # fmt: skip
        if name == "evaluate":
            p.add_argument("--source", required=True)
            p.add_argument("--reference", required=True)
            p.add_argument("--output", help="write the hypotheses here")
            p.add_argument("--length-penalty", type=float, default=None)
            p.set_defaults(func=evaluate_command)
        else:
            p.add_argument("text", nargs="*")
            p.set_defaults(func=translate_command)

    p = commands.add_parser("export", help="export a saved model to CTranslate2, a faster inference engine")
    p.add_argument("--model", required=True, help="a saved model folder (model + tokenizer)")
    p.add_argument("--output-dir", required=True, help="folder of the export (translate --engine ctranslate2 --model DIR)")
    p.add_argument("--quantization", choices=["float32", "int8", "int8_float32", "bfloat16"], default="float32",
                   help="type of the exported weights")  # fmt: skip
    p.add_argument("--max-positions", type=int, default=None,
                   help="longest source and output, in tokens, the export accepts "
                        "(default: the model's max_position_embeddings; at least 1024 for sinusoids)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace --output-dir if it exists")
    p.set_defaults(func=export_command)

    p = commands.add_parser("visualize", help="draw the paper's pictures from the real code (and attention maps of a model)")
    p.add_argument("--output-dir", required=True, help="folder for the PNG files")
    p.add_argument("--model", help="a saved model folder (model + tokenizer): adds its attention maps")
    p.add_argument("--source", help="source sentence of the attention maps (with --model)")
    p.add_argument("--target", help="target sentence read by the decoder (default: the model's own translation)")
    p.add_argument("--layer", type=int, default=-1, help="layer of the attention maps, from 0; -1: the last (default)")
    p.add_argument("--heads", type=int, nargs="+", default=None, help="heads to draw (default: all)")
    p.add_argument("--num-beams", type=int, default=None, help="beam size of the translation (default: the model's; paper: 4)")
    p.add_argument("--device", default=None, help="default: cpu")
    p.set_defaults(func=visualize_command)

    p = commands.add_parser(
        "explore", help="look inside a trained translator in the browser: translations, beam candidates, attention",
        description="Serve the attention explorer, a Gradio app, for a saved model: type a sentence, see its "
        "translation, beam search's candidates with their scores, and the attention of each layer and head. "
        "Needs gradio: pip install 'vanilla-transformer[app]'. Stop it with Ctrl-C.",
    )  # fmt: skip
    p.add_argument("--model", required=True, help="a saved model folder (model + tokenizer), e.g. RUN/final")
    p.add_argument("--port", type=int, default=None, help="port to serve on (default: the first free one from 7860)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default: this machine only)")
    p.add_argument("--source", default=None, help="a sentence to put in the source box")
    p.set_defaults(func=explore_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config", None):  # train --config FILE: its values replace the defaults; options given win
        args = build_parser(options_from_file(args.config)).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
