"""Command line: ``vanilla-transformer <command> ...`` (also ``python -m vanilla_transformer``).

Each command imports what it runs (Accelerate, datasets, sacreBLEU, matplotlib) only when it runs.

A mistake in the input (a missing folder, a bad file, an option out of range) prints its message alone and
exits with status 1; ``--debug`` (before the command) shows the traceback as well. Options are spelt as in
transformers' ``Seq2SeqTrainingArguments`` and its translation example (``--model_name_or_path``,
``--num_beams``, ...), with ``-`` or ``_`` between words; older spellings still work and say what replaced them.
"""

import argparse
import dataclasses
import difflib
import io
import json
import os
import select
import sys
from collections.abc import Iterator
from typing import Any

from transformers import HfArgumentParser

from .distributed import MainProcessFailed
from .training_config import RENAMED_OPTIONS, TrainConfig, options_from_file


def train_command(args: argparse.Namespace) -> int:
    from .training import train

    values = {field.name: getattr(args, field.name) for field in dataclasses.fields(TrainConfig)}
    if isinstance(values["push_to_hub"], str):  # --push_to_hub REPO, as it once was
        print(
            "vanilla-transformer: --push_to_hub REPO is an old spelling of --push_to_hub --hub_model_id REPO; it "
            "still works, but use the latter.",
            file=sys.stderr,
        )
        values["hub_model_id"], values["push_to_hub"] = values["push_to_hub"], True
    summary = train(TrainConfig(**values))
    if "final_dir" not in summary:  # not the main process: it saves and scores nothing
        return 0
    print(
        f"trained {summary['step']} steps, {summary['target_tokens']:,} target tokens in "
        f"{summary['loop_seconds'] / 60:.1f} min ({summary['stop_reason']}); "
        f"averaged {len(summary['averaged_checkpoints'])} checkpoints; saved {summary['final_dir']}"
    )
    if "test" in summary:
        test = summary["test"]
        print(f"test ({test['n']} sentences, beam search): sacreBLEU {test['bleu']:.2f}  {test['bleu_signature']}")
        print(f"                                      chrF {test['chrf']:.2f}  {test['chrf_signature']}")
    if "hub_commit" in summary:
        print(f"uploaded {summary['final_dir']} to the Hub: {summary['hub_commit']}")
    return 0


def average_command(args: argparse.Namespace) -> int:
    from .checkpoints import average_into_model
    from .loading import load_model_and_tokenizer
    from .tokenization import save_tokenizer

    # The model folder gives the configuration, generation settings and tokenizer that the checkpoints lack,
    # so that the averaged folder translates like any saved model (translate, evaluate, export).
    model, tokenizer = load_model_and_tokenizer(args.model_name_or_path)
    average_into_model(model, args.checkpoints)
    model.save_pretrained(args.output_dir)
    save_tokenizer(tokenizer, args.output_dir)
    print(f"averaged {len(args.checkpoints)} checkpoints into {args.output_dir} (model, generation config, tokenizer)")
    return 0


def _device(name: str | None) -> str:
    """``--device``, or the GPU when there is one."""
    import torch

    return name or ("cuda" if torch.cuda.is_available() else "cpu")


def _engine(args: argparse.Namespace) -> Any:
    """``--engine``: a translator (:class:`~vanilla_transformer.evaluation.Translator`) of the saved model and its
    tokenizer (transformers), or of an export (CTranslate2, with its own tokenizer)."""
    if args.engine == "ctranslate2":
        from .deployment import CTranslate2Translator

        return CTranslate2Translator(args.model_name_or_path, device=_device(args.device))
    from .evaluation import TransformersTranslator
    from .loading import load_model_and_tokenizer

    return TransformersTranslator(*load_model_and_tokenizer(args.model_name_or_path, device=_device(args.device)))


def evaluate_command(args: argparse.Namespace) -> int:
    from .data import read_text_lines
    from .evaluation import evaluate_translator

    sources, references = read_text_lines(args.source), read_text_lines(args.reference)  # before loading the model
    result = evaluate_translator(
        _engine(args),
        sources,
        references,
        hypotheses_path=args.output,
        num_beams=args.num_beams,
        length_penalty=args.length_penalty,
        batch_size=args.batch_size,
        progress=True,
    )
    print(f"BLEU {result['bleu']:.2f}  {result['bleu_signature']}")
    print(f"chrF {result['chrf']:.2f}  {result['chrf_signature']}")
    return 0


def translate_command(args: argparse.Namespace) -> int:
    from .evaluation import translate_with

    translator = _engine(args)
    batches = [args.text] if args.text else _line_batches(sys.stdin, args.batch_size)
    for texts in batches:  # one output line per input line, printed as soon as its batch is translated
        translations = translate_with(
            translator,
            texts,
            num_beams=args.num_beams,
            length_penalty=args.length_penalty,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
        )
        for line in translations:
            print(" ".join(line.splitlines()))  # a line break inside a translation would shift every later line
        sys.stdout.flush()
    return 0


def _line_batches(stream: Any, batch_size: int) -> Iterator[list[str]]:
    """The lines of a text stream (standard input) in batches of at most ``batch_size``, as they arrive.

    A batch is handed on when it is full, at the end of the input, or when no more input is waiting: lines
    piped from a file are translated ``batch_size`` at a time, a line typed by hand at once. Blank lines are
    kept (each gets an empty translation), and a line that is not UTF-8 stops with its number.
    """
    try:
        fd = stream.buffer.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # not a real stream (e.g. a test's StringIO)
        lines = [line.rstrip("\r\n") for line in stream]
        yield from (lines[i : i + batch_size] for i in range(0, len(lines), batch_size))
        return
    pending, batch, number = b"", [], 0
    while True:
        chunk = os.read(fd, 1 << 16)
        pending += chunk
        *complete, pending = pending.split(b"\n")
        if not chunk and pending:  # the last line has no line ending
            complete, pending = [*complete, pending], b""
        for raw in complete:
            number += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                if batch:  # the lines before it are translated first
                    yield batch
                raise ValueError(
                    f"standard input, line {number}, is not UTF-8 "
                    f"(byte {error.start} is {raw[error.start : error.start + 1]!r}); "
                    f"re-encode the input (e.g. `iconv -f latin1 -t utf-8`)."
                ) from None
            batch.append((line.removeprefix("\ufeff") if number == 1 else line).rstrip("\r"))
            if len(batch) == batch_size:
                yield batch
                batch = []
        if not chunk:
            break
        if batch and not _input_waiting(fd):
            yield batch
            batch = []
    if batch:
        yield batch


def _input_waiting(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):  # a descriptor select cannot watch: wait for full batches
        return True


def export_command(args: argparse.Namespace) -> int:
    from .deployment import export_ctranslate2

    folder = export_ctranslate2(
        args.model_name_or_path,
        args.output_dir,
        quantization=args.quantization,
        max_positions=args.max_positions,
        force=args.force,
    )
    print(f"exported {args.model_name_or_path} to {folder} (CTranslate2, {args.quantization})")
    return 0


def visualize_command(args: argparse.Namespace) -> int:
    from .loading import load_model_and_tokenizer
    from .visualization import draw_all

    if args.model_name_or_path is not None and args.source is None:
        raise ValueError("--model_name_or_path needs --source (the sentence whose attention maps are drawn).")
    model = tokenizer = None
    if args.model_name_or_path is not None:
        model, tokenizer = load_model_and_tokenizer(
            args.model_name_or_path, attn_implementation="eager", device=args.device or "cpu"
        )
    paths = draw_all(
        args.output_dir,
        model,
        tokenizer,
        source=args.source,
        target=args.target,
        layer=args.layer,
        heads=args.heads,
        num_beams=args.num_beams,
    )
    for path in paths:
        print(path)
    return 0


def explore_command(args: argparse.Namespace) -> int:
    from .explorer import launch

    try:
        launch(args.model_name_or_path, port=args.port, host=args.host, source=args.source or "")
    except OSError as error:  # the port is taken
        raise ValueError(f"{str(error).rstrip('.')}. Choose another port with --port.") from None
    return 0


class _OldSpelling(argparse.Action):
    """An older spelling of an option: it still works, and says (once per use) which spelling replaced it."""

    def __init__(self, option_strings, dest, new: str, convert=None, **kwargs):
        self.new, self.convert = new, convert
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        value = self.const if self.nargs == 0 else values
        new, value = self.convert(value) if self.convert else (self.new, value)
        print(
            f"{parser.prog}: {option_string} is an old spelling of {new}; it still works, but use {new}.",
            file=sys.stderr,
        )
        setattr(namespace, new.lstrip("-").replace("-", "_"), value)


def _option(parser: argparse.ArgumentParser, name: str, *old: str, **kwargs: Any) -> None:
    """``--name`` (also spelt with ``-`` for ``_``), and hidden older spellings that still work."""
    spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    required = kwargs.pop("required", False)
    target = parser.add_mutually_exclusive_group(required=True) if required and old else parser  # either spelling
    target.add_argument(*spellings, dest=name, required=required and not old, **kwargs)
    for spelling in old:
        flag = kwargs.get("action") in ("store_true", "store_false")
        target.add_argument(
            f"--{spelling}",
            action=_OldSpelling,
            new=f"--{name}",
            dest=name,
            nargs=0 if flag else None,
            const=kwargs.get("action") == "store_true" if flag else None,
            type=kwargs.get("type"),
        )


def _train_option_spellings(parser: argparse.ArgumentParser) -> None:
    """Older spellings of `train` options (TrainConfig's field names before they took transformers' names)."""
    for old, (new, convert) in RENAMED_OPTIONS.items():
        if old in ("model", "model_json"):
            continue  # below: JSON settings, or a folder
        target = parser._option_string_actions[f"--{new}"]
        flag = old in ("resume", "cpu", "progress")
        for spelling in {f"--{old}", f"--{old.replace('_', '-')}"}:
            parser.add_argument(
                spelling,
                action=_OldSpelling,
                new=f"--{new}",
                dest=new,
                nargs=0 if flag else None,
                const=True if flag else None,
                type=None if flag else target.type,
                convert=(lambda value, n=new, c=convert: (f"--{n}", c(value))) if convert else None,
            )
    parser.add_argument(
        "--no-progress",
        "--no_progress",
        action=_OldSpelling,
        new="--disable_tqdm",
        dest="disable_tqdm",
        nargs=0,
        const=True,
    )

    def settings_or_folder(value: str) -> tuple[str, Any]:  # `train --model` once took JSON; now a folder, as elsewhere
        if value.lstrip().startswith("{"):
            try:
                return "--config_overrides", json.loads(value)
            except json.JSONDecodeError as error:
                raise argparse.ArgumentTypeError(f"not valid JSON ({error.msg}): {value}") from None
        return "--model_name_or_path", value

    for spelling in ("--model", "--model-json", "--model_json"):
        parser.add_argument(
            spelling, action=_OldSpelling, new="--config_overrides", dest="config_overrides", convert=settings_or_folder
        )


def _bool_or_repository(value: str) -> bool | str:
    """``--push_to_hub`` [true|false], or, as it once was, ``--push_to_hub REPO``."""
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    return words.get(value.lower(), value)


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations (``--max_step`` is not silently ``--max_steps``), whose "unrecognized
    arguments" error names the closest option of the command given. (Python 3.14's ``suggest_on_error`` suggests only
    for choices and commands; click and typer would replace transformers' HfArgumentParser, which builds the
    train options from TrainConfig.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def _options(self) -> set[str]:
        """This parser's long options and those of the command named in the arguments (unknown ones end up here)."""
        options = {o for o in self._option_string_actions if o.startswith("--")} - {"--help", "--version"}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                command = next((action.choices[w] for w in getattr(self, "_words", []) if w in action.choices), None)
                if command is not None:
                    options |= command._options()
        return options

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):
            known = sorted(self._options())
            for word in message.split(": ", 1)[1].split():
                close = difflib.get_close_matches(word.split("=")[0], known, n=1) if word.startswith("--") else []
                if close:
                    message += f" (did you mean {close[0]}?)"
                    break
        super().error(message)


def build_parser(train_defaults: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The command line; ``train_defaults`` replace TrainConfig's defaults (the values of ``train --config``)."""
    from . import __version__
    from .deployment import QUANTIZATIONS  # deployment imports without ctranslate2; only `export` needs it

    parser = _Parser(prog="vanilla-transformer", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback as well as the message")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    formatter = argparse.ArgumentDefaultsHelpFormatter

    # One option per TrainConfig field, with the field's help and default (HfArgumentParser reads them).
    options = HfArgumentParser(TrainConfig, add_help=False)
    resume = options._option_string_actions["--resume_from_checkpoint"]
    resume.nargs, resume.const = "?", "latest"  # alone: the newest checkpoint of the run
    options._option_string_actions["--push_to_hub"].type = _bool_or_repository
    p = commands.add_parser(
        "train",
        parents=[options],
        formatter_class=formatter,
        help="train a translation model (the paper's recipe, on Accelerate)",
        description="Train a translation model with the paper's recipe, on Accelerate (one CPU, one GPU or many). "
        "The options below can also come from a YAML or JSON file (--config); those given here win over it.",
    )
    p.add_argument(
        "--config", metavar="FILE", help="YAML or JSON file of these options; options given here win over it"
    )
    # HfArgumentParser gives --config_overrides its field's type, dict[str, Any], which cannot read text: it is JSON.
    p.register("type", dict[str, Any], _json_settings)
    _train_option_spellings(p)
    p.set_defaults(func=train_command, **(train_defaults or {}))

    model_help = "a saved model folder (model + tokenizer), e.g. RUN/final of `train`"
    p = commands.add_parser(
        "average",
        formatter_class=formatter,
        help="average the weights of several checkpoints (§6.1)",
        description="Average the weights of checkpoints of one run (§6.1: the last 5) into a "
        "folder that translates like any saved model.",
    )
    p.add_argument(
        "checkpoints", nargs="+", help="checkpoint folders (holding model.safetensors), e.g. RUN/checkpoints/*"
    )
    _option(
        p,
        "model_name_or_path",
        "model",
        required=True,
        help="a saved model folder of the same run (e.g. RUN/final): its configuration, generation settings and "
        "tokenizer go with the averaged weights",
    )
    _option(p, "output_dir", required=True, help="folder of the averaged model")
    p.set_defaults(func=average_command)

    for name, helptext in (
        ("evaluate", "translate a test set and score it (sacreBLEU, chrF)"),
        ("translate", "translate sentences given as arguments, or each line of standard input"),
    ):
        p = commands.add_parser(
            name, formatter_class=formatter, help=helptext, description=helptext[0].upper() + helptext[1:] + "."
        )
        _option(
            p,
            "model_name_or_path",
            "model",
            required=True,
            help=f"{model_help}; with --engine ctranslate2, a folder written by `export`",
        )
        _option(
            p, "num_beams", type=int, default=None, help="beam size; none: the model's generation config (paper: 4)"
        )
        _option(
            p,
            "length_penalty",
            type=float,
            default=None,
            help="α of beam search's length penalty, log P / length**α; none: the model's (paper: 0.6)",
        )
        _option(p, "batch_size", type=int, default=32, help="sentences translated together")
        _option(p, "device", default=None, help="cpu, cuda, cuda:1, ...; none: the GPU if there is one, else the CPU")
        _option(
            p,
            "engine",
            choices=["transformers", "ctranslate2"],
            default="transformers",
            help="transformers (a saved model folder) or ctranslate2 (a folder written by `export`)",
        )
        if name == "evaluate":
            _option(p, "source", required=True, help="text file of source sentences, one per line (UTF-8; .gz too)")
            _option(p, "reference", required=True, help="text file of their reference translations, line by line")
            _option(p, "output", default=None, help="write the translations to this file, one per line")
            p.set_defaults(func=evaluate_command)
        else:
            _option(
                p,
                "max_new_tokens",
                type=int,
                default=None,
                help="longest translation in tokens; none: the model's (paper: source length + 50)",
            )
            p.add_argument(
                "text",
                nargs="*",
                help="sentences to translate; none: each line of standard input, "
                "one output line per input line (a blank line gives a blank line)",
            )
            p.set_defaults(func=translate_command)

    p = commands.add_parser(
        "export", formatter_class=formatter, help="export a saved model to CTranslate2, a faster inference engine"
    )
    _option(p, "model_name_or_path", "model", required=True, help=model_help)
    _option(
        p,
        "output_dir",
        required=True,
        help="folder of the export (translate --engine ctranslate2 --model_name_or_path DIR)",
    )
    _option(p, "quantization", choices=QUANTIZATIONS, default="float32", help="type of the exported weights")
    _option(
        p,
        "max_positions",
        type=int,
        default=None,
        help="longest source and output, in tokens, the export accepts; none: the model's "
        "max_position_embeddings, at least 1024 for sinusoids",
    )
    _option(p, "force", action="store_true", help="replace --output_dir if it exists")
    p.set_defaults(func=export_command)

    p = commands.add_parser(
        "visualize",
        formatter_class=formatter,
        help="draw the paper's pictures from the real code (and attention maps of a model)",
    )
    _option(p, "output_dir", required=True, help="folder for the PNG files")
    _option(p, "model_name_or_path", "model", default=None, help=f"{model_help}: adds its attention maps")
    _option(p, "source", default=None, help="source sentence of the attention maps (with --model_name_or_path)")
    _option(p, "target", default=None, help="target sentence read by the decoder; none: the model's own translation")
    _option(p, "layer", type=int, default=-1, help="layer of the attention maps, from 0; -1: the last")
    _option(p, "heads", type=int, nargs="+", default=None, help="heads to draw; none: all")
    _option(p, "num_beams", type=int, default=None, help="beam size of the translation; none: the model's (paper: 4)")
    _option(p, "device", default=None, help="none: cpu")
    p.set_defaults(func=visualize_command)

    p = commands.add_parser(
        "explore",
        formatter_class=formatter,
        help="look inside a trained translator in the browser: translations, beam candidates, attention",
        description="Serve the attention explorer, a Gradio app, for a saved model: type a sentence, see its "
        "translation, beam search's candidates with their scores, and the attention of each layer and head. "
        "Needs gradio: pip install -e '.[app]' in a clone. Stop it with Ctrl-C.",
    )
    _option(p, "model_name_or_path", "model", required=True, help=model_help)
    _option(p, "port", type=int, default=None, help="port to serve on; none: the first free one from 7860")
    _option(p, "host", default="127.0.0.1", help="address to serve on (127.0.0.1: this machine only)")
    _option(p, "source", default=None, help="a sentence to put in the source box")
    p.set_defaults(func=explore_command)
    return parser


def _json_settings(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error.msg}): {text}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'expected a JSON object such as {{"d_model": 256}}, got {text}')
    return value


#: What a user's mistake raises (the message says what is wrong and what to do); anything else is a bug.
USER_ERRORS = (ValueError, OSError, ImportError, FloatingPointError, MainProcessFailed)


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user's mistake prints its message alone (``--debug``: with the traceback) and returns 1."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "config", None):  # train --config FILE: its values replace the defaults; options given win
            args = build_parser(options_from_file(args.config)).parse_args(argv)
        return args.func(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        message = str(error) or type(error).__name__
        if isinstance(error, OSError) and error.filename and str(error.filename) not in message:
            message = f"{message}: {error.filename}"
        print(f"vanilla-transformer {args.command}: error: {message}", file=sys.stderr)
        print("(run `vanilla-transformer --debug ...` to see where it happened)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"vanilla-transformer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
