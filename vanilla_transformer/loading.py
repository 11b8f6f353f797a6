"""Models and tokenizers: a saved folder, or a fresh model of one of the paper's presets (Table 3).

* :func:`load_model_and_tokenizer` — a saved folder (``RUN/final`` of ``vanilla-transformer train``,
  or anything ``save_pretrained`` wrote) and its tokenizer, checked to fit each other.
* :func:`preset_config` / :func:`new_model` — the sizes of Table 3 with overrides, and an untrained
  model of them whose vocabulary and special ids are its tokenizer's. The names of the presets
  (:data:`PRESETS`) and the check of overrides are those of the run settings
  (:mod:`vanilla_transformer.training_config`), which name a preset without loading anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .modeling_vanilla_transformer import PAPER_DECODING, VanillaTransformerForConditionalGeneration
from .tokenization import check_tokenizer_matches_model, config_ids_from_tokenizer, drop_load_time_keys
from .training_config import PRESETS, check_config_overrides

__all__ = ["load_model", "load_model_and_tokenizer", "load_tokenizer", "new_model", "preset_config"]


def preset_config(preset: str, **overrides: Any) -> VanillaTransformerConfig:
    """The configuration of a Table 3 preset, with ``overrides`` (e.g. ``d_model=256``) in place of its values.

    Raises:
        ValueError: ``preset`` is not one of :data:`PRESETS`, or an override is not a setting of the model.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(map(repr, PRESETS))}, got {preset!r}.")
    check_config_overrides(overrides)
    return getattr(VanillaTransformerConfig, preset)(**overrides)


def new_model(preset: str, tokenizer: Any, **overrides: Any) -> VanillaTransformerForConditionalGeneration:
    """An untrained model of a preset whose vocabulary size and special token ids are ``tokenizer``'s."""
    config = preset_config(preset, **{**config_ids_from_tokenizer(tokenizer), **overrides})
    model = VanillaTransformerForConditionalGeneration(config)
    # The paper's decoding (§6.1) travels with the checkpoint, in its generation_config.json, as transformers'
    # checkpoints carry theirs (the class itself keeps transformers' defaults, plus the per-sentence length limit).
    model.generation_config.update(**PAPER_DECODING)
    check_tokenizer_matches_model(tokenizer, model.config)
    return model


def load_model(
    folder: str | os.PathLike,
    *,
    attn_implementation: str | None = None,
    device: str | torch.device | None = None,
) -> VanillaTransformerForConditionalGeneration:
    """A saved model, in eval mode, on ``device`` (``None``: the CPU).

    Raises:
        ValueError: ``folder`` holds no ``config.json``, or one of another model type.
    """
    if not (Path(folder) / "config.json").is_file():
        raise ValueError(f"{str(folder)!r} is not a saved model folder (no config.json in it).")
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = VanillaTransformerForConditionalGeneration.from_pretrained(folder, **kwargs).eval()
    return model if device is None else model.to(device)


def load_tokenizer(folder: str | os.PathLike) -> Any:
    """A saved tokenizer (a folder holding ``tokenizer.json``), without the keys that only say how it was
    loaded (:func:`~vanilla_transformer.tokenization.drop_load_time_keys`), so that saving it again writes
    the ``tokenizer_config.json`` it came with.

    Raises:
        ValueError: ``folder`` holds no ``tokenizer.json``.
    """
    if not (Path(folder) / "tokenizer.json").is_file():
        raise ValueError(
            f"No tokenizer.json in {str(folder)!r}: give a folder that tokenizer.save_pretrained wrote (for a "
            f"saved model, the tokenizer it was trained with)."
        )
    return drop_load_time_keys(AutoTokenizer.from_pretrained(folder))


def load_model_and_tokenizer(
    folder: str | os.PathLike,
    tokenizer: str | os.PathLike | None = None,
    *,
    attn_implementation: str | None = None,
    device: str | torch.device | None = None,
) -> tuple[VanillaTransformerForConditionalGeneration, Any]:
    """A saved model folder and its tokenizer, checked to fit each other.

    Args:
        folder: what ``save_pretrained`` wrote, e.g. ``RUN/final`` of ``vanilla-transformer train``.
        tokenizer: the tokenizer's folder; ``None``: ``folder`` itself.
        attn_implementation: ``"sdpa"`` or ``"eager"``; ``None`` keeps the saved choice.
        device: where to put the model; ``None``: the CPU.

    Raises:
        ValueError: no model or no tokenizer in the folders, or a tokenizer that does not fit the model.
    """
    model = load_model(folder, attn_implementation=attn_implementation, device=device)
    tok = load_tokenizer(folder if tokenizer is None else tokenizer)
    check_tokenizer_matches_model(tok, model.config)
    return model, tok
