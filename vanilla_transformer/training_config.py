"""The settings of a training run: :class:`TrainConfig`, read from YAML/JSON files and the command line.

Each field carries its meaning in ``metadata={"help": ...}`` (written with transformers' ``HfArg``),
which transformers' ``HfArgumentParser`` turns into the options of ``vanilla-transformer train``:
``train --help`` lists every field with its meaning and default.

The model settings a run names are checked here, without loading a model: a preset of Table 3
(:data:`PRESETS`, ``VanillaTransformerConfig.base()`` / ``.big()``) and overrides that must be fields of
:class:`~vanilla_transformer.configuration_vanilla_transformer.VanillaTransformerConfig`
(:func:`check_config_overrides`). :mod:`vanilla_transformer.loading` builds models from them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers.hf_argparser import HfArg

from .configuration_vanilla_transformer import VanillaTransformerConfig

__all__ = [
    "PRESETS",
    "RENAMED_OPTIONS",
    "TrainConfig",
    "check_config_overrides",
    "options_from_file",
    "translate_renamed_options",
]

#: The configurations of Table 3, as ``VanillaTransformerConfig.base()`` / ``.big()``.
PRESETS = ("base", "big")


def check_config_overrides(overrides: dict[str, Any], where: str = "model settings") -> None:
    """Refuse a name that is not a setting of :class:`VanillaTransformerConfig` (which would keep it as an unused
    attribute, so that a typo such as ``d_modl`` would train the preset's size and be saved in ``config.json``)."""
    if not isinstance(overrides, dict):
        raise ValueError(
            f'{where} must be a mapping of setting names to values, e.g. {{"d_model": 256}}; got {overrides!r}.'
        )
    known = {field.name for field in dataclasses.fields(VanillaTransformerConfig)} | {"attn_implementation"}
    for name in overrides:
        if name not in known:
            close = difflib.get_close_matches(str(name), sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"{where}: {name!r} is not a setting of VanillaTransformerConfig.{hint} The settings are: "
                f"{', '.join(sorted(known - {'transformers_version', 'architectures', 'id2label', 'label2id'}))}."
            )


MIXED_PRECISIONS = ("no", "bf16", "fp16", "auto")
ATTENTION_IMPLEMENTATIONS = ("auto", "eager", "sdpa")


@dataclass
class TrainConfig:
    """Everything a training run needs (``vanilla_transformer.training.train``)."""

    # data
    dataset_name: str = HfArg(
        default="data/tatoeba_en_de",
        help="the corpus: a Hub dataset (e.g. wmt14), or a local folder of {split}.{lang}[.gz] files, path prefix, "
        ".tsv or .jsonl file; not read when --train_file is given",
    )
    dataset_config_name: str | None = HfArg(default=None, help="configuration of a Hub dataset, e.g. de-en for wmt14")
    train_file: str | None = HfArg(
        default=None,
        help="the training pairs, in place of --dataset_name: a .tsv, .jsonl or .json file, or a path prefix of "
        "aligned files (path/train for path/train.LANG); needs --validation_file",
    )
    validation_file: str | None = HfArg(default=None, help="the validation pairs (same formats); replaces the corpus's")
    test_file: str | None = HfArg(default=None, help="the test pairs (same formats); replaces the corpus's")
    source_lang: str = HfArg(default="en", help="source language, as in the corpus's file names or columns")
    target_lang: str = HfArg(default="de", help="target language")
    train_split: str = HfArg(default="train", help="split to train on")
    validation_split: str = HfArg(default="validation", help="split of the validation loss and BLEU during training")
    test_split: str | None = HfArg(default="test", help="split translated and scored at the end (null in a file: none)")
    max_length: int = HfArg(
        default=128, help="pairs longer than this many tokens on either side are dropped (and counted), never cut"
    )
    # tokenizer: an existing folder, or a joint BPE trained on the training data
    tokenizer_name: str | None = HfArg(
        default=None, help="a saved tokenizer folder; none: a joint BPE trained on the data"
    )
    vocab_size: int = HfArg(default=8000, help="size of the joint BPE vocabulary trained without --tokenizer_name")
    bpe_train_pairs: int = HfArg(
        default=1_000_000,
        help="the joint BPE learns from at most this many training pairs, spread evenly over a larger corpus "
        "(0: all of them, as SentencePiece's input_sentence_size)",
    )
    # model: a preset of Table 3 plus overrides, or a saved model to continue from
    preset: str = HfArg(default="base", help="model sizes of Table 3", metadata={"choices": PRESETS})
    config_overrides: dict[str, Any] = HfArg(
        default_factory=dict,
        metadata={"metavar": "JSON"},
        help='model settings in place of the preset\'s, as JSON, e.g. \'{"d_model": 256, "dropout": 0.3}\'; '
        "each must be a setting of VanillaTransformerConfig",
    )
    model_name_or_path: str | None = HfArg(
        default=None, help="a saved model folder to start from instead of a new preset"
    )
    # optimisation (§5.3, §5.4)
    max_tokens: int = HfArg(
        default=4096, help="padded tokens per batch and side, per process (the paper: ~25,000 per step on 8 GPUs)"
    )
    gradient_accumulation_steps: int = HfArg(default=1, help="batches per optimizer step")
    max_steps: int = HfArg(default=1000, help="optimizer steps to train")
    max_minutes: float | None = HfArg(
        default=None, help="stop earlier when this wall-clock budget is spent (counted over resumed runs too)"
    )
    warmup_steps: int = HfArg(default=4000, help="warm-up steps of the paper's learning rate (§5.3)")
    lr_factor: float = HfArg(default=1.0, help="multiplies the paper's learning-rate schedule")
    adam_beta1: float = HfArg(default=0.9, help="Adam's β1 (§5.3)")
    adam_beta2: float = HfArg(default=0.98, help="Adam's β2 (§5.3)")
    adam_epsilon: float = HfArg(default=1e-9, help="Adam's ε (§5.3)")
    label_smoothing_factor: float = HfArg(default=0.1, help="ε_ls of the label-smoothed loss (§5.4)")
    max_grad_norm: float | None = HfArg(default=None, help="clip gradients to this norm; none: no clipping")
    mixed_precision: str = HfArg(
        default="no",
        help="autocast dtype; auto: bf16 where the hardware has bf16 units, else no",
        metadata={"choices": MIXED_PRECISIONS},
    )
    # auto: eager for bf16 on CPUs, where torch's flash-attention backward is slower at sentence lengths
    # (docs/performance-log.md)
    attn_implementation: str = HfArg(
        default="auto",
        help="attention kernel; auto: eager for bf16 on a CPU, sdpa otherwise",
        metadata={"choices": ATTENTION_IMPLEMENTATIONS},
    )
    seed: int = HfArg(default=0, help="seed of the initial weights, the batch order and dropout")
    # evaluation
    logging_steps: int = HfArg(default=50, help="record training loss, NLL, learning rate and tokens/s every N steps")
    eval_steps: int = HfArg(default=500, help="validation loss and BLEU every N steps")
    eval_bleu_sentences: int = HfArg(
        default=200, help="validation sentences translated (beam search) at each evaluation"
    )
    generation_num_beams: int = HfArg(default=4, help="beam size of those translations")
    attention_pictures: int | None = HfArg(
        default=None,
        help="index of a validation sentence whose attention maps are drawn at each evaluation, into "
        "OUTPUT_DIR/pictures/step-N/ (needs matplotlib)",
    )
    # checkpoints and output
    output_dir: str = HfArg(
        default="outputs/run", help="folder of the run: tokenizer, checkpoints, final model, results"
    )
    save_steps: int = HfArg(default=500, help="write a checkpoint every N steps, and at the end")
    save_total_limit: int = HfArg(default=5, help="checkpoints kept; older ones are deleted")
    average_last: int = HfArg(default=5, help="the final model averages this many last checkpoints (§6.1: 5)")
    resume_from_checkpoint: str | None = HfArg(
        default=None,
        help="continue a run: alone (or 'latest'), from the newest checkpoint in OUTPUT_DIR/checkpoints; or from "
        "the checkpoint folder given (one of OUTPUT_DIR's)",
        metadata={"metavar": "PATH"},
    )
    report_to: str | None = HfArg(default=None, help="tracker of the recorded values, e.g. tensorboard")
    push_to_hub: bool = HfArg(
        default=False,
        help="at the end, upload the final folder (model, tokenizer, model card, pipeline) to the Hub model "
        "repository --hub_model_id (needs `hf auth login`)",
    )
    hub_model_id: str | None = HfArg(
        default=None, help="the Hub repository of --push_to_hub, e.g. your-name/vanilla-transformer-en-de"
    )
    hub_private_repo: bool = HfArg(default=False, help="create that repository as a private one")
    use_cpu: bool = HfArg(default=False, help="train on the CPU even when a GPU is present")
    disable_tqdm: bool = HfArg(default=False, help="hide progress bars")

    def __post_init__(self):
        checks = {
            "max_tokens": self.max_tokens >= 1,
            "gradient_accumulation_steps": self.gradient_accumulation_steps >= 1,
            "max_steps": self.max_steps >= 1,
            "warmup_steps": self.warmup_steps >= 1,
            "save_steps": self.save_steps >= 1,
            "eval_steps": self.eval_steps >= 1,
            "logging_steps": self.logging_steps >= 1,
            "save_total_limit": self.save_total_limit >= 1,
            "average_last": self.average_last >= 1,
            "max_length": self.max_length >= 2,
            "vocab_size": self.vocab_size >= 300,
            "bpe_train_pairs": self.bpe_train_pairs >= 0,
            "label_smoothing_factor": 0.0 <= self.label_smoothing_factor < 1.0,
            "lr_factor": self.lr_factor > 0,
            "max_minutes": self.max_minutes is None or self.max_minutes > 0,
            "mixed_precision": self.mixed_precision in MIXED_PRECISIONS,
            "attn_implementation": self.attn_implementation in ATTENTION_IMPLEMENTATIONS,
            "preset": self.preset in PRESETS,
            "attention_pictures": self.attention_pictures is None or self.attention_pictures >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"TrainConfig: {name}={getattr(self, name)!r} is out of range; see `train --help`.")
        check_config_overrides(self.config_overrides, "config_overrides")
        if self.train_file is not None and self.validation_file is None:
            raise ValueError(
                f"TrainConfig: train_file={self.train_file!r} needs validation_file too (the pairs of the validation "
                f"loss and BLEU during training), e.g. --validation_file valid.tsv."
            )
        if self.push_to_hub and self.hub_model_id is None:
            raise ValueError(
                "TrainConfig: push_to_hub needs hub_model_id, the repository to upload to (e.g. your-name/my-model)."
            )
        if self.hub_model_id is not None:
            from huggingface_hub.utils import HFValidationError, validate_repo_id

            try:
                validate_repo_id(self.hub_model_id)
            except HFValidationError as error:
                raise ValueError(
                    f"TrainConfig: hub_model_id={self.hub_model_id!r} is not a Hub repository id: {error}"
                ) from None

    @classmethod
    def from_file(cls, path: str | os.PathLike, **overrides: Any) -> TrainConfig:
        """Read a YAML or JSON file of TrainConfig fields; ``overrides`` win."""
        return cls(**{**options_from_file(path), **overrides})


#: Older names of options (in files and on the command line) -> (today's name, how an old value reads today).
RENAMED_OPTIONS: dict[str, tuple[str, Any]] = {
    "data": ("dataset_name", None),
    "hub_config": ("dataset_config_name", None),
    "src_lang": ("source_lang", None),
    "tgt_lang": ("target_lang", None),
    "valid_split": ("validation_split", None),
    "tokenizer": ("tokenizer_name", None),
    "model": ("config_overrides", None),
    "model_json": ("config_overrides", None),
    "init_from": ("model_name_or_path", None),
    "gradient_accumulation": ("gradient_accumulation_steps", None),
    "label_smoothing": ("label_smoothing_factor", None),
    "log_every": ("logging_steps", None),
    "eval_every": ("eval_steps", None),
    "eval_num_beams": ("generation_num_beams", None),
    "save_every": ("save_steps", None),
    "keep_checkpoints": ("save_total_limit", None),
    "resume": ("resume_from_checkpoint", lambda on: "latest" if on else None),
    "log_with": ("report_to", None),
    "cpu": ("use_cpu", None),
    "progress": ("disable_tqdm", lambda on: not on),
}


def renamed_option_notice(old: str, new: str) -> str:
    return f"vanilla-transformer: '{old}' is an old name of '{new}'; it still works, but use '{new}'."


def options_from_file(path: str | os.PathLike) -> dict[str, Any]:
    """The TrainConfig fields a YAML or JSON file sets, checked: names (older names are translated, with a
    notice), value types, and the settings under ``config_overrides``.

    ``HfArgumentParser.parse_yaml_file`` / ``parse_json_file`` build the dataclass at once, so they leave no
    room for command-line overrides, and their error for a misspelt key names neither the file nor the
    key's kind; hence this reader.

    Raises:
        ValueError: the file cannot be read or parsed (the message names it, with the line), sets something
            that is not a TrainConfig field, or gives a value of the wrong type.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"Cannot read the options file {path}: {error}") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(error, "problem", None) or error
            raise ValueError(f"{path}{where}: not valid YAML ({problem}).") from None
    else:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}, line {error.lineno}, column {error.colno}: not valid JSON ({error.msg})."
            ) from None
    values = {} if values is None else values
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of option names to values, found a {type(values).__name__}.")
    values = translate_renamed_options(values, str(path))
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    unknown = set(values) - set(fields)
    if unknown:
        raise ValueError(
            f"{path}: unknown training option(s) {sorted(unknown)}; `vanilla-transformer train --help` lists them."
        )
    hints = typing.get_type_hints(TrainConfig)
    for name, value in values.items():
        if not _has_type(value, hints[name]):
            raise ValueError(
                f"{path}: {name} = {value!r} is a {type(value).__name__}, but {name} takes {_type_name(hints[name])}."
            )
    check_config_overrides(values.get("config_overrides", {}), f"{path}: config_overrides")
    return values


def translate_renamed_options(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` with older option names replaced by today's (and a notice on standard error for each)."""
    out = dict(values)
    for old, (new, convert) in RENAMED_OPTIONS.items():
        if old not in out:
            continue
        value = out.pop(old)
        if new in out:
            raise ValueError(f"{where}: both '{old}' and its new name '{new}' are set; keep '{new}' only.")
        print(renamed_option_notice(old, new), file=sys.stderr)
        out[new] = convert(value) if convert else value
    if "push_to_hub" in out and out["push_to_hub"] is None:  # the old default: no upload
        out["push_to_hub"] = False
    if isinstance(out.get("push_to_hub"), str):  # once the repository itself; now push_to_hub + hub_model_id
        print(renamed_option_notice("push_to_hub: REPO", "push_to_hub: true + hub_model_id: REPO"), file=sys.stderr)
        out["hub_model_id"], out["push_to_hub"] = out["push_to_hub"], True
    return out


def _has_type(value: Any, annotation: Any) -> bool:
    if annotation is Any:
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_has_type(value, a) for a in args)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin = typing.get_origin(annotation) or annotation
    return isinstance(value, origin)


def _type_name(annotation: Any) -> str:
    names = [getattr(a, "__name__", str(a)) for a in (typing.get_args(annotation) or (annotation,))]
    names = ["null" if n == "NoneType" else "a mapping" if n == "dict" else n for n in names]
    return " or ".join(names)
