"""Fine-tune with transformers' ``Seq2SeqTrainer``, set up as the paper trains (§5.3, §5.4, §6.1).

The package's own loop (:mod:`vanilla_transformer.training`, on Accelerate) batches by tokens, resumes
exactly and averages checkpoints. This module is for people who already work with transformers'
``Seq2SeqTrainer``: it builds the Trainer's arguments, data, collator and metrics so that the Trainer
follows the paper:

    §5.3  Adam(β1 0.9, β2 0.98, ε 1e-9)                     -> adam_beta1, adam_beta2, adam_epsilon
          lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)
                                                             -> lr_scheduler_type="inverse_sqrt", warmup_steps=W,
                                                                learning_rate = d_model^-0.5 · W^-0.5
                                                                (:func:`~vanilla_transformer.schedule.peak_learning_rate`)
    §5.4  label smoothing ε_ls = 0.1                         -> label_smoothing_factor=0.1 (the model's fused loss
                                                                in training; the same as the Trainer's LabelSmoother)
    §6.1  beam 4, α 0.6, at most source length + 50 tokens   -> predict_with_generate, generation_num_beams=4,
                                                                and the model's generation_config

Why ``learning_rate = d_model^-0.5 · W^-0.5``: with it, transformers' ``inverse_sqrt`` schedule is the
paper's formula exactly (:mod:`vanilla_transformer.schedule` says why).

Three details of transformers 5.24 that matter for this model:

* **The training loss is the model's fused one.** With ``label_smoothing_factor > 0``,
  ``Trainer.compute_loss`` pops ``labels`` from the batch, calls the model for its logits and applies
  ``LabelSmoother`` to them. In training, :class:`TranslationSeq2SeqTrainer` instead leaves the labels
  in the batch and calls the model with ``smoothing=label_smoothing_factor, skip_logits=True``: the model
  computes the same label-smoothed loss block by block, without the ``[batch, length, vocabulary]``
  logits, as the package's training command does. Same value and gradients (tested), and faster: the
  speed through the Trainer is measured by ``benchmarks/trainer_speed.py`` and reported in
  ``docs/benchmarks.md`` ("Training through Seq2SeqTrainer"). Evaluation keeps the ``LabelSmoother`` path,
  which computes the logits that prediction needs.
* **Gradient accumulation is exact.** ``LabelSmoother(outputs, labels, num_items_in_batch=N)`` and the
  model's fused loss both *sum* the smoothed per-token losses and divide by ``N``, the number of target
  tokens (labels != -100) in *all* micro-batches of the update. Because the model declares
  ``accepts_loss_kwargs = True``, ``Trainer.training_step`` does not also divide by the number of
  accumulation steps. The accumulated gradient is therefore the gradient of the token-mean loss over
  the whole update, the same as one batch holding all its sentences (tested, for both losses). Without
  label smoothing the model's own loss does the same (sum / ``num_items_in_batch``).
* **The generation config must be protected.** After the first evaluation batch,
  ``Seq2SeqTrainer.prediction_step`` fills the model's ``generation_config`` in place with library
  defaults, ``max_length=20`` among them. Our ``generate`` then sees a length limit and drops the
  paper's per-sentence limit (source length + 50): later batches are cut at 20 tokens, and the saved
  ``generation_config.json`` keeps ``max_length=20``. :class:`TranslationSeq2SeqTrainer` restores the
  generation config after every prediction step.

Under label smoothing, the Trainer's ``eval_loss`` is the *smoothed* loss (a per-batch token mean,
averaged over batches), higher than the NLL; ``compute_metrics`` adds sacreBLEU and chrF of beam
search, computed by the ``sacrebleu`` package (no Hub access needed, online or offline).

* :func:`train_with_seq2seq_trainer` — everything below in one call (what ``examples/finetune_seq2seq_trainer.py``
  runs): it fine-tunes a saved model, or trains a fresh preset from scratch when none is given.
* :func:`build_model_and_tokenizer` — a preset of Table 3 with a joint BPE trained on the training pairs
  (a saved folder: :func:`vanilla_transformer.loading.load_model_and_tokenizer`).
* :func:`prepare_datasets` — tokenised ``input_ids``/``labels`` datasets, over-long pairs dropped.
* :func:`make_training_arguments` — ``Seq2SeqTrainingArguments`` with the paper's settings.
* :func:`make_compute_metrics`, :class:`TranslationSeq2SeqTrainer`, :func:`build_trainer`.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset
from transformers import (
    DataCollatorForSeq2Seq,
    EvalPrediction,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)

from .data import load_parallel_corpus, tokenize_corpus
from .evaluation import score
from .loading import load_model_and_tokenizer, load_tokenizer, new_model
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .schedule import peak_learning_rate
from .tokenization import check_tokenizer_matches_model, drop_load_time_keys, train_joint_bpe

__all__ = [
    "Seq2SeqTrainerResult",
    "TranslationSeq2SeqTrainer",
    "build_model_and_tokenizer",
    "build_trainer",
    "make_compute_metrics",
    "make_training_arguments",
    "prepare_datasets",
    "train_with_seq2seq_trainer",
]

RESULTS_FILE = "finetune_results.json"


# --------------------------------------------------------------------------------------------
# Model and tokenizer
# --------------------------------------------------------------------------------------------
def build_model_and_tokenizer(
    train_pairs: Dataset,
    preset: str = "base",
    vocab_size: int = 8000,
    tokenizer: Any | None = None,
    attn_implementation: str | None = None,
    **overrides: Any,
) -> tuple[VanillaTransformerForConditionalGeneration, Any]:
    """A fresh model of a Table 3 preset, with a joint BPE trained on ``train_pairs`` (§5.1).

    Args:
        train_pairs: a split with ``source``/``target`` text columns (from ``load_parallel_corpus``);
            the BPE is trained on both columns. Unused when ``tokenizer`` is given.
        preset: one of :data:`~vanilla_transformer.loading.PRESETS` (``"base"``, ``"big"``).
        vocab_size: size of the joint BPE vocabulary.
        tokenizer: an existing tokenizer to use instead of training one.
        attn_implementation: ``"sdpa"`` or ``"eager"``; ``None`` keeps the default (sdpa).
        **overrides: config fields replacing the preset's, e.g. ``d_model=256, encoder_layers=3``.
    """
    if tokenizer is None:
        texts = itertools.chain(train_pairs["source"], train_pairs["target"])
        tokenizer = train_joint_bpe(texts, vocab_size=vocab_size)
    model = new_model(preset, tokenizer, **overrides)
    if attn_implementation:
        model.set_attn_implementation(attn_implementation)
    return model, tokenizer


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------
def prepare_datasets(
    train_pairs: Dataset | None,
    eval_pairs: Dataset | None,
    tokenizer: Any,
    max_length: int = 128,
) -> tuple[Dataset | None, Dataset | None, dict[str, int]]:
    """Tokenise text pairs into what ``DataCollatorForSeq2Seq`` pads: ``input_ids`` and ``labels``.

    Pairs that are empty or longer than ``max_length`` tokens on either side are dropped, never
    truncated (:func:`~vanilla_transformer.data.tokenize_corpus`).

    Returns:
        ``(train, eval, dropped)``: the two datasets (``None`` where the input was ``None``) and how
        many pairs each lost, as ``{"train": n, "eval": m}``.
    """
    out, dropped = [], {}
    for name, pairs in (("train", train_pairs), ("eval", eval_pairs)):
        if pairs is None:
            out.append(None)
            continue
        tokenized, dropped[name] = tokenize_corpus(pairs, tokenizer, max_length=max_length)
        if len(tokenized) == 0:
            raise ValueError(f"No {name} pairs left after dropping those longer than max_length={max_length} tokens.")
        out.append(tokenized.select_columns(["input_ids", "labels"]))
    return out[0], out[1], dropped


# --------------------------------------------------------------------------------------------
# Trainer arguments, metrics, trainer
# --------------------------------------------------------------------------------------------
def make_training_arguments(
    output_dir: str | os.PathLike,
    d_model: int,
    *,
    warmup_steps: int = 4000,
    lr_factor: float = 1.0,
    max_steps: int = 1000,
    per_device_train_batch_size: int = 64,
    per_device_eval_batch_size: int | None = None,
    gradient_accumulation_steps: int = 1,
    label_smoothing: float = 0.1,
    num_beams: int = 4,
    generation_max_length: int | None = None,
    bf16: bool = False,
    eval_steps: int | None = None,
    save_steps: int | None = None,
    logging_steps: int = 50,
    seed: int = 0,
    **overrides: Any,
) -> Seq2SeqTrainingArguments:
    """``Seq2SeqTrainingArguments`` with the paper's optimiser, schedule, smoothing and decoding.

    Args:
        output_dir: where the Trainer writes checkpoints (``checkpoint-<step>``) and logs.
        d_model: the model's width, which sets the learning rate (``schedule.peak_learning_rate``).
        warmup_steps: W of §5.3 (the paper: 4000). Must be an integer: transformers reads a float
            below 1 as a fraction of ``max_steps``.
        lr_factor: multiplies the paper's schedule (1 = the paper).
        max_steps: optimizer updates to run.
        per_device_train_batch_size / gradient_accumulation_steps: sentence pairs per micro-batch and
            micro-batches per update; the loss is normalised over the target tokens of the update.
        per_device_eval_batch_size: defaults to the training batch size.
        label_smoothing: ε_ls of §5.4 (``label_smoothing_factor``).
        num_beams: beam size of evaluation (``generation_num_beams``; §6.1: 4).
        generation_max_length: a fixed cap on generated length for evaluation; ``None`` keeps the
            model's per-sentence limit (source length + 50, §6.1).
        bf16: bf16 autocast. Without a bf16-capable GPU it runs on the CPU (``use_cpu=True``).
        eval_steps / save_steps: evaluate / write a checkpoint every so many updates (``None``: never
            during training).
        logging_steps: log loss and learning rate every so many updates.
        seed: seed of the model-independent randomness (data order, dropout).
        **overrides: any other ``Seq2SeqTrainingArguments`` field; these win over everything above.

    Gradient clipping is off (``max_grad_norm=0``), as in the paper; pass ``max_grad_norm=1.0`` to
    restore transformers' default. The optimizer is transformers' AdamW with ``weight_decay=0``,
    which is Adam.
    """
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_cuda_available

    if int(warmup_steps) != warmup_steps or warmup_steps < 1:
        raise ValueError(f"warmup_steps must be a positive integer, got {warmup_steps!r}.")
    values = dict(
        output_dir=str(output_dir),
        # §5.3
        learning_rate=peak_learning_rate(d_model, int(warmup_steps), lr_factor),
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=int(warmup_steps),
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        weight_decay=0.0,
        max_grad_norm=0.0,
        max_steps=max_steps,
        per_device_train_batch_size=per_device_train_batch_size,
        per_device_eval_batch_size=per_device_eval_batch_size or per_device_train_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        # §5.4
        label_smoothing_factor=label_smoothing,
        label_names=["labels"],
        # §6.1
        predict_with_generate=True,
        generation_num_beams=num_beams,
        generation_max_length=generation_max_length,
        # bookkeeping
        bf16=bf16,
        use_cpu=bool(bf16) and not is_torch_bf16_gpu_available(),
        eval_strategy="steps" if eval_steps else "no",
        eval_steps=eval_steps,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps,
        logging_strategy="steps",
        logging_steps=logging_steps,
        seed=seed,
        dataloader_pin_memory=is_torch_cuda_available(),
        report_to="none",
    )
    return Seq2SeqTrainingArguments(**{**values, **overrides})


def make_compute_metrics(tokenizer: Any) -> Callable[[EvalPrediction], dict]:
    """A ``compute_metrics`` for ``predict_with_generate``: sacreBLEU and chrF of the decoded beams.

    Hypotheses and references are decoded from token ids (``-100`` and padding removed, special
    tokens skipped). With the package's byte-level BPE that gives back the detokenised text exactly
    (up to Unicode NFC), which is what sacreBLEU expects. Scores come from
    :func:`vanilla_transformer.evaluation.score`, i.e. the ``sacrebleu`` package itself, so they need
    no network and are the same online and offline (``evaluate.load("sacrebleu")`` gives the same
    BLEU when the Hub is reachable).

    The returned function gives ``bleu``, ``chrf`` (0–100), their signatures ``bleu_signature`` /
    ``chrf_signature`` and ``gen_len`` (mean generated tokens); the Trainer prefixes them with ``eval_``.
    """
    pad_id = tokenizer.pad_token_id

    def compute_metrics(prediction: EvalPrediction) -> dict:
        predictions, labels = prediction.predictions, prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        # -100 pads batches of different widths (and the labels); generate pads with pad_id.
        predictions = np.where(predictions < 0, pad_id, predictions)
        labels = np.where(labels < 0, pad_id, labels)
        hypotheses = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = tokenizer.batch_decode(labels, skip_special_tokens=True)
        result = score(hypotheses, references)
        return {
            "bleu": result["bleu"],
            "chrf": result["chrf"],
            "bleu_signature": result["bleu_signature"],
            "chrf_signature": result["chrf_signature"],
            "gen_len": float(np.mean(np.count_nonzero(predictions != pad_id, axis=1))),
        }

    return compute_metrics


class TranslationSeq2SeqTrainer(Seq2SeqTrainer):
    """``Seq2SeqTrainer`` with this model's fused training loss, that leaves the model's
    ``generation_config`` as it found it.

    * **Training loss.** With ``label_smoothing_factor=ε``, ``Seq2SeqTrainer`` computes the logits and
      applies ``LabelSmoother`` to them. For this package's model in training mode,
      :meth:`compute_loss` instead passes the labels to the model with ``smoothing=ε`` and
      ``skip_logits=True`` (and the Trainer's ``num_items_in_batch``): the model computes the same
      label-smoothed loss block by block, without the logits (``linear_cross_entropy_sums``), as the
      package's training command does. Same loss, same gradients (tested, gradient accumulation
      included), faster and in less memory. ``LabelSmoother`` computes, over the target tokens t
      (labels != -100) and the vocabulary of size V,
      ``(1 − ε) · Σ_t −log p_t(y_t) / N + ε · Σ_t Σ_v −log p_t(v) / (N · V)``, with ``N`` =
      ``num_items_in_batch`` or the batch's target tokens; the model's loss is
      ``Σ_t [(1 − ε) · −log p_t(y_t) + (ε / V) · Σ_v −log p_t(v)] / N``, the same sum. The outputs
      then have ``loss`` and ``nll_loss`` but ``logits=None``. Evaluation and prediction (model in eval
      mode) keep transformers' path, which computes the logits they need; so do other models, and a
      ``compute_loss_func``.
    * **Generation config.** ``Seq2SeqTrainer.prediction_step`` fills ``model.generation_config`` in
      place with transformers' defaults (``max_length=20``, ...) after generating. For this model that
      silently replaces the paper's per-sentence length limit (source length + 50) by a 20-token cap
      from the second evaluation batch on, and the cap is then saved with the model. Here the
      generation config is put back after every prediction step.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        fused = (
            self.label_smoother is not None
            and self.compute_loss_func is None
            and model.training
            and "labels" in inputs
            and isinstance(self.accelerator.unwrap_model(model), VanillaTransformerForConditionalGeneration)
        )
        if not fused:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        # The trainer, not the model, keeps the loss's workspace: its logits from forward to backward, in memory
        # reused at every step.
        workspace = self.__dict__.setdefault("loss_workspace", {})
        inputs = {**inputs, "smoothing": self.label_smoother.epsilon, "skip_logits": True, "loss_workspace": workspace}
        if num_items_in_batch is not None:  # LabelSmoother divides by it whenever it is given
            inputs["num_items_in_batch"] = num_items_in_batch
        # Without a label smoother, Trainer.compute_loss leaves `labels` in the batch and returns the
        # model's loss; everything else it does (num_items_in_batch to the model, the scaling for
        # average_tokens_across_devices, return_outputs) applies unchanged.
        smoother, self.label_smoother = self.label_smoother, None
        try:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        finally:
            self.label_smoother = smoother

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        saved = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = saved


def build_trainer(
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: Any,
    args: Seq2SeqTrainingArguments,
    train_dataset: Dataset | None = None,
    eval_dataset: Dataset | None = None,
    callbacks: list[TrainerCallback] | None = None,
) -> TranslationSeq2SeqTrainer:
    """The Trainer: ``DataCollatorForSeq2Seq(tokenizer, model=model)`` pads sources with the pad id,
    labels with -100 and adds ``decoder_input_ids`` (the labels shifted right), which the model needs
    in evaluation, where the label smoother removes ``labels`` from the batch; ``compute_metrics`` scores beam
    search when ``args.predict_with_generate`` is set. The Trainer saves the tokenizer with the model,
    without the keys that only say how it was loaded (:func:`~vanilla_transformer.tokenization.drop_load_time_keys`)."""
    check_tokenizer_matches_model(tokenizer, model.config)
    drop_load_time_keys(tokenizer)
    return TranslationSeq2SeqTrainer(
        model=model,
        args=args,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=make_compute_metrics(tokenizer) if args.predict_with_generate else None,
        callbacks=callbacks,
    )


# --------------------------------------------------------------------------------------------
# Everything in one call
# --------------------------------------------------------------------------------------------
@dataclass
class Seq2SeqTrainerResult:
    """What :func:`train_with_seq2seq_trainer` produced. ``eval_before`` / ``eval_after`` are ``Trainer.evaluate()``
    metrics (``eval_loss``, ``eval_bleu``, ``eval_chrf``, ...), ``None`` when not run."""

    trainer: TranslationSeq2SeqTrainer
    model: VanillaTransformerForConditionalGeneration
    tokenizer: Any
    train_metrics: dict
    eval_before: dict | None
    eval_after: dict | None
    output_dir: Path
    dropped: dict[str, int]


def _take(split: Dataset, n: int | None) -> Dataset:
    return split if n is None or n >= len(split) else split.select(range(n))


def train_with_seq2seq_trainer(
    data: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    model: str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
    preset: str = "base",
    model_overrides: Mapping[str, Any] | None = None,
    vocab_size: int = 8000,
    src_lang: str = "en",
    tgt_lang: str = "de",
    hub_config: str | None = None,
    train_split: str = "train",
    eval_split: str | None = "validation",
    max_length: int = 128,
    max_train_pairs: int | None = None,
    max_eval_pairs: int | None = 200,
    attn_implementation: str | None = None,
    eval_before: bool = False,
    callbacks: list[TrainerCallback] | None = None,
    **training_options: Any,
) -> Seq2SeqTrainerResult:
    """Train with ``Seq2SeqTrainer`` on a parallel corpus: fine-tune the saved model ``model``, or, when ``model``
    is ``None``, train a fresh model of ``preset`` from scratch (with a new joint BPE unless ``tokenizer`` is given).

    Steps: load the corpus (:func:`~vanilla_transformer.data.load_parallel_corpus`); load the model
    folder and its tokenizer, or build ``preset`` with a joint BPE trained on the training pairs;
    tokenise; train with the paper's settings (:func:`make_training_arguments`); evaluate (loss, and
    sacreBLEU/chrF of beam search on the first ``max_eval_pairs`` pairs of ``eval_split``); save
    model, tokenizer and generation config to ``output_dir`` (loadable with ``from_pretrained``) and
    the metrics to ``output_dir/finetune_results.json``.

    Args:
        data: anything ``load_parallel_corpus`` reads (folder of ``{split}.{lang}``, TSV, JSONL, Hub name).
        output_dir: where checkpoints and the final model go.
        model: a saved model folder to continue from; ``None`` builds ``preset``.
        tokenizer: tokenizer folder (default: the model folder; for a preset, a new joint BPE).
        preset, model_overrides, vocab_size: for a fresh model (:func:`build_model_and_tokenizer`).
        src_lang, tgt_lang, hub_config: the language pair (and Hub configuration, e.g. ``"de-en"``).
        train_split, eval_split: split names (``eval_split=None``: no evaluation).
        max_length: pairs longer than this many tokens (either side) are dropped.
        max_train_pairs, max_eval_pairs: use only the first so many pairs of each split.
        attn_implementation: ``"sdpa"`` or ``"eager"`` (``None``: the model's).
        eval_before: also evaluate before training (the starting point of a fine-tuning run).
        callbacks: extra ``TrainerCallback`` objects.
        **training_options: passed to :func:`make_training_arguments` (``max_steps``, ``warmup_steps``,
            ``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``bf16``, ...).
    """
    output_dir = Path(output_dir)
    corpus = load_parallel_corpus(data, src_lang, tgt_lang, hub_config=hub_config)
    for needed in (train_split, eval_split):
        if needed is not None and needed not in corpus:
            raise ValueError(f"The corpus {str(data)!r} has splits {sorted(corpus)}, not {needed!r}.")
    train_pairs = _take(corpus[train_split], max_train_pairs)
    eval_pairs = _take(corpus[eval_split], max_eval_pairs) if eval_split is not None else None

    if model is not None:
        if model_overrides:
            raise ValueError(
                "model_overrides (sizes) only apply to a fresh preset, not to a saved --model_name_or_path."
            )
        net, tok = load_model_and_tokenizer(model, tokenizer, attn_implementation=attn_implementation)
    else:
        tok = load_tokenizer(tokenizer) if tokenizer is not None else None
        net, tok = build_model_and_tokenizer(
            train_pairs, preset, vocab_size, tok, attn_implementation, **dict(model_overrides or {})
        )
    train_set, eval_set, dropped = prepare_datasets(train_pairs, eval_pairs, tok, max_length=max_length)

    args = make_training_arguments(output_dir, net.config.d_model, **training_options)
    trainer = build_trainer(net, tok, args, train_set, eval_set, callbacks=callbacks)
    before = trainer.evaluate() if eval_before and eval_set is not None else None
    train_metrics = trainer.train().metrics
    after = trainer.evaluate() if eval_set is not None else None

    trainer.save_model(str(output_dir))  # model, generation_config.json and tokenizer
    if trainer.is_world_process_zero():
        results = {
            "train": train_metrics,
            "eval_before": before,
            "eval_after": after,
            "dropped_pairs": dropped,
            "learning_rate": args.learning_rate,
            "warmup_steps": args.warmup_steps,
        }
        (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2, default=_jsonable), encoding="utf-8")
    return Seq2SeqTrainerResult(trainer, net, tok, train_metrics, before, after, output_dir, dropped)


def _jsonable(value: Any) -> Any:
    """``json.dumps`` fallback: numpy scalars as numbers, anything else as its string."""
    return value.item() if isinstance(value, (np.floating, np.integer)) else str(value)
