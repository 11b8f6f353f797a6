"""The settings of a training run: :class:`TrainConfig`, read from YAML/JSON files and the command line.

Each field carries its meaning in ``metadata={"help": ...}`` (written with transformers' ``HfArg``),
which transformers' ``HfArgumentParser`` turns into the options of ``vanilla-transformer train``:
``train --help`` lists every field with its meaning and default.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers.hf_argparser import HfArg

from .loading import PRESETS

__all__ = ["TrainConfig", "options_from_file"]

MIXED_PRECISIONS = ("no", "bf16", "fp16", "auto")
ATTENTION_IMPLEMENTATIONS = ("auto", "eager", "sdpa")


@dataclass
class TrainConfig:
    """Everything a training run needs (``vanilla_transformer.training.train``)."""

    # data
    data: str = HfArg(
        default="data/tatoeba_en_de",
        help="the corpus: a folder of {split}.{lang}[.gz] files, a path prefix, a .tsv or .jsonl file, or a Hub dataset",
    )
    src_lang: str = HfArg(default="en", help="source language, as in the corpus's file names or columns")
    tgt_lang: str = HfArg(default="de", help="target language")
    hub_config: str | None = HfArg(default=None, help="configuration of a Hub dataset, e.g. de-en for wmt14")
    train_split: str = HfArg(default="train", help="split to train on")
    valid_split: str = HfArg(default="validation", help="split of the validation loss and BLEU during training")
    test_split: str | None = HfArg(default="test", help="split translated and scored at the end (null in a file: none)")
    max_length: int = HfArg(
        default=128, help="pairs longer than this many tokens on either side are dropped (and counted), never cut"
    )
    # tokenizer: an existing folder, or a joint BPE trained on the training data
    tokenizer: str | None = HfArg(default=None, help="a saved tokenizer folder; none: a joint BPE trained on the data")
    vocab_size: int = HfArg(default=8000, help="size of the joint BPE vocabulary trained without --tokenizer")
    # model: a preset of Table 3 plus overrides, or a saved model to continue from
    preset: str = HfArg(default="base", help="model sizes of Table 3", metadata={"choices": PRESETS})
    model: dict[str, Any] = HfArg(
        default_factory=dict,
        aliases=["--model-json"],
        metadata={"metavar": "JSON"},
        help='model settings in place of the preset\'s, as JSON, e.g. \'{"d_model": 256, "dropout": 0.3}\'',
    )
    init_from: str | None = HfArg(default=None, help="a saved model folder to start from instead of a new preset")
    # optimisation (§5.3, §5.4)
    max_tokens: int = HfArg(
        default=4096, help="padded tokens per batch and side, per process (the paper: ~25,000 per step on 8 GPUs)"
    )
    gradient_accumulation: int = HfArg(default=1, help="batches per optimizer step")
    max_steps: int = HfArg(default=1000, help="optimizer steps to train")
    max_minutes: float | None = HfArg(default=None, help="stop earlier when this wall-clock budget is spent")
    warmup_steps: int = HfArg(default=4000, help="warm-up steps of the paper's learning rate (§5.3)")
    lr_factor: float = HfArg(default=1.0, help="multiplies the paper's learning-rate schedule")
    adam_beta1: float = HfArg(default=0.9, help="Adam's β1 (§5.3)")
    adam_beta2: float = HfArg(default=0.98, help="Adam's β2 (§5.3)")
    adam_epsilon: float = HfArg(default=1e-9, help="Adam's ε (§5.3)")
    label_smoothing: float = HfArg(default=0.1, help="ε_ls of the label-smoothed loss (§5.4)")
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
    log_every: int = HfArg(default=50, help="record training loss, NLL, learning rate and tokens/s every N steps")
    eval_every: int = HfArg(default=500, help="validation loss and BLEU every N steps")
    eval_bleu_sentences: int = HfArg(default=200, help="validation sentences translated (beam search) at each evaluation")
    eval_num_beams: int = HfArg(default=4, help="beam size of those translations")
    attention_pictures: int | None = HfArg(
        default=None,
        help="index of a validation sentence whose attention maps are drawn at each evaluation, into "
        "OUTPUT_DIR/pictures/step-N/ (needs matplotlib)",
    )
    # checkpoints and output
    output_dir: str = HfArg(default="outputs/run", help="folder of the run: tokenizer, checkpoints, final model, results")
    save_every: int = HfArg(default=500, help="write a checkpoint every N steps, and at the end")
    keep_checkpoints: int = HfArg(default=5, help="checkpoints kept; older ones are deleted")
    average_last: int = HfArg(default=5, help="the final model averages this many last checkpoints (§6.1: 5)")
    resume: bool = HfArg(default=False, help="continue from the newest checkpoint in OUTPUT_DIR")
    log_with: str | None = HfArg(default=None, help="tracker of the recorded values, e.g. tensorboard")
    push_to_hub: str | None = HfArg(
        default=None,
        help="at the end, upload the final folder (model, tokenizer, model card, pipeline) to this Hub model "
        "repository, e.g. your-name/vanilla-transformer-en-de (needs `hf auth login`)",
        metadata={"metavar": "REPO"},
    )
    cpu: bool = HfArg(default=False, help="train on the CPU even when a GPU is present")
    progress: bool = HfArg(default=True, help="show progress bars")

    def __post_init__(self):
        checks = {
            "max_tokens": self.max_tokens >= 1,
            "gradient_accumulation": self.gradient_accumulation >= 1,
            "max_steps": self.max_steps >= 1,
            "warmup_steps": self.warmup_steps >= 1,
            "save_every": self.save_every >= 1,
            "eval_every": self.eval_every >= 1,
            "log_every": self.log_every >= 1,
            "keep_checkpoints": self.keep_checkpoints >= 1,
            "average_last": self.average_last >= 1,
            "max_length": self.max_length >= 2,
            "vocab_size": self.vocab_size >= 300,
            "label_smoothing": 0.0 <= self.label_smoothing < 1.0,
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
        if self.push_to_hub is not None:
            from huggingface_hub.utils import HFValidationError, validate_repo_id

            try:
                validate_repo_id(self.push_to_hub)
            except HFValidationError as error:
                raise ValueError(f"TrainConfig: push_to_hub={self.push_to_hub!r} is not a Hub repository id: {error}") from None

    @classmethod
    def from_file(cls, path: str | os.PathLike, **overrides: Any) -> TrainConfig:
        """Read a YAML or JSON file of TrainConfig fields; ``overrides`` win."""
        return cls(**{**options_from_file(path), **overrides})


def options_from_file(path: str | os.PathLike) -> dict[str, Any]:
    """The TrainConfig fields a YAML or JSON file sets.

    ``HfArgumentParser.parse_yaml_file`` / ``parse_json_file`` build the dataclass at once, so they leave no
    room for command-line overrides, and their error for a misspelt key names neither the file nor the
    key's kind; hence this reader.

    Raises:
        ValueError: the file sets something that is not a TrainConfig field.
    """
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        values = yaml.safe_load(text) or {}
    else:
        values = json.loads(text)
    unknown = set(values) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise ValueError(f"{path}: unknown training option(s) {sorted(unknown)}.")
    return values
