"""The settings of a training run: :class:`TrainConfig`, read from YAML/JSON files and the command line."""

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .loading import PRESETS

__all__ = ["TrainConfig"]

MIXED_PRECISIONS = ("no", "bf16", "fp16", "auto")
ATTENTION_IMPLEMENTATIONS = ("auto", "eager", "sdpa")


@dataclass
class TrainConfig:
    """Everything a run needs; readable from YAML/JSON (``TrainConfig.from_file``) and the command line."""

    # data
    data: str = "data/tatoeba_en_de"  # folder of {split}.{lang}[.gz], path prefix, .tsv, .jsonl, or a Hub name
    src_lang: str = "en"
    tgt_lang: str = "de"
    hub_config: str | None = None  # e.g. "de-en" for wmt14
    train_split: str = "train"
    valid_split: str = "validation"
    test_split: str | None = "test"
    max_length: int = 128  # pairs longer than this (in tokens, either side) are dropped and counted
    # tokenizer: an existing folder, or a joint BPE trained on the training data
    tokenizer: str | None = None
    vocab_size: int = 8000
    # model: a preset of Table 3 plus overrides, or a saved model to continue from
    preset: str = "base"
    model: dict[str, Any] = field(default_factory=dict)
    init_from: str | None = None
    # optimisation (§5.3, §5.4)
    max_tokens: int = 4096  # padded tokens per batch and side, per process (paper: ~25,000 per step on 8 GPUs)
    gradient_accumulation: int = 1
    max_steps: int = 1000
    max_minutes: float | None = None  # stop earlier when this wall-clock budget is spent
    warmup_steps: int = 4000
    lr_factor: float = 1.0  # multiplies the paper's schedule
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_epsilon: float = 1e-9
    label_smoothing: float = 0.1
    max_grad_norm: float | None = None
    mixed_precision: str = "no"  # no | bf16 | fp16 | auto (bf16 where the hardware has bf16 units: resolve_mixed_precision)
    # auto: eager attention for bf16 on CPU (torch's CPU flash-attention backward is slow on sentence
    # lengths; measured 1.4x slower per step), sdpa otherwise
    attn_implementation: str = "auto"  # auto | eager | sdpa
    seed: int = 0
    # evaluation
    log_every: int = 50  # training loss, NLL, learning rate and tokens/s are recorded every N steps
    eval_every: int = 500
    eval_bleu_sentences: int = 200  # validation sentences translated (beam search) at each evaluation
    eval_num_beams: int = 4
    # index of a validation sentence whose attention maps are drawn at each evaluation into
    # output_dir/pictures/step-N/ (visualization.draw_attention_maps; needs matplotlib)
    attention_pictures: int | None = None
    # checkpoints and output
    output_dir: str = "outputs/run"
    save_every: int = 500
    keep_checkpoints: int = 5
    average_last: int = 5  # the paper averages the last 5 checkpoints
    resume: bool = False
    log_with: str | None = None  # e.g. "tensorboard"
    push_to_hub: str | None = None  # a Hub model repository ("user/name"): the final folder is uploaded to it
    cpu: bool = False  # train on the CPU even when a GPU is present
    progress: bool = True

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
    def from_file(cls, path: str | os.PathLike, **overrides) -> "TrainConfig":
        """Read a YAML or JSON file of TrainConfig fields; ``overrides`` win."""
        text = Path(path).read_text(encoding="utf-8")
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"{path}: unknown training option(s) {sorted(unknown)}.")
        return cls(**{**values, **overrides})
