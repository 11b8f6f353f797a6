"""Translate with a trained model and score the output with sacreBLEU (the paper's §6.1 evaluation).

The paper reports case-sensitive BLEU on newstest2014. We report sacreBLEU (Post, 2018): corpus BLEU
computed on *detokenised* hypotheses and references with sacreBLEU's own ``13a`` tokeniser, plus chrF,
each with the signature that makes the number reproducible (``nrefs:1|case:mixed|eff:no|tok:13a|...``).
The paper's own numbers were computed on tokenised, compound-split text (``multi-bleu.perl``), so they
are not directly comparable with sacreBLEU scores; the signature says exactly what was measured.

* :class:`Translator` — what evaluation needs of a translation engine: ``translate(texts, *, batch_size,
  num_beams, length_penalty, max_new_tokens, progress) -> list[str]``. Two engines implement it:
  :class:`TransformersTranslator` (a model and its tokenizer, decoding with transformers' ``generate``) and
  :class:`~vanilla_transformer.deployment.CTranslate2Translator` (a CTranslate2 export).
* :func:`translate` — sentences in, detokenised translations out (batched by length, in input order), with
  a transformers model's ``generate``; :func:`translate_with` — the same with any :class:`Translator`.
* :func:`score` — corpus BLEU and chrF, with signatures, from the ``sacrebleu`` package.
* :func:`evaluate_translator` / :func:`evaluate_model` — both, plus an optional hypotheses file and the
  wall-clock time, for any :class:`Translator` / for a transformers model and its tokenizer.
* :func:`perplexity` — the teacher-forced cross-entropy per target token of tokenised pairs (the
  validation loss of training, the perplexity of Table 3), and :func:`loss_sums` for one batch.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from sacrebleu.metrics import BLEU, CHRF

from .checkpoints import write_text_atomically
from .data import TokenBucketBatchSampler, collate_pairs
from .distributed import sum_over_processes
from .modeling_vanilla_transformer import input_values_checked
from .tokenization import check_source_lengths, check_tokenizer_matches_model

__all__ = [
    "TransformersTranslator",
    "Translator",
    "check_texts",
    "evaluate_model",
    "evaluate_translator",
    "loss_sums",
    "perplexity",
    "score",
    "translate",
    "translate_with",
]

# Characters that `str.splitlines()` (and so many text tools) treat as line breaks. A hypothesis that
# contained one would spread over several lines of a hypotheses file; we write a space instead.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_BREAK_TABLE = str.maketrans({c: " " for c in _LINE_BREAKS})

_DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}


# --------------------------------------------------------------------------------------------
# Translation
# --------------------------------------------------------------------------------------------
def check_texts(name: str, texts: Any) -> list[str]:
    """``texts`` as a list of strings; a clear ``ValueError`` (naming the argument ``name``) for a single string,
    a non-list, an empty list or a non-string item."""
    if isinstance(texts, str):
        raise ValueError(f"`{name}` must be a list of strings, not a single string; wrap it: [{texts[:40]!r}].")
    try:
        texts = list(texts)
    except TypeError:
        raise ValueError(f"`{name}` must be a list of strings, got {type(texts).__name__}.") from None
    if not texts:
        raise ValueError(f"`{name}` is empty: give at least one sentence.")
    bad = [(i, type(t).__name__) for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        shown = ", ".join(f"item {i} is {kind}" for i, kind in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise ValueError(f"`{name}` must contain only strings: {shown}{more}.")
    return texts


def _resolve_dtype(dtype: Any) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.lower()]
    raise ValueError(f"dtype={dtype!r} is not understood; use torch.bfloat16, torch.float16, 'bf16', 'fp16' or None.")


def _length_batches(lengths: list[int], batch_size: int | None, max_tokens: int | None) -> list[list[int]]:
    """Indices grouped into batches of similar length, longest first.

    Longest first so that an out-of-memory error shows up in the first batch, not at the end.
    With ``max_tokens`` a batch holds as many sentences as fit in ``max_tokens`` *padded* source
    tokens (a longer sentence gets a batch of its own); otherwise ``batch_size`` sentences.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    if max_tokens is not None:
        current: list[int] = []
        for i in order:
            # Sorted longest first, so the batch's first sentence sets its padded length.
            width = lengths[current[0]] if current else lengths[i]
            if current and (len(current) + 1) * width > max_tokens:
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
    else:
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    return batches


def translate(
    model: Any,
    tokenizer: Any,
    texts: list[str],
    batch_size: int | None = 32,
    max_tokens: int | None = None,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_new_tokens: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    progress: bool = False,
) -> list[str]:
    """Translate ``texts`` with ``model.generate`` and return detokenised strings in the input order.

    Sentences are sorted by tokenised length and batched, so that a batch holds sentences of
    similar length and little padding; the output is put back in the input order. The model's
    padding-aware generation makes a sentence's translation (essentially) independent of its batch.

    Args:
        model: a ``VanillaTransformerForConditionalGeneration`` (or any seq2seq model with
            ``generate``). It is put in eval mode for the call and restored afterwards. (Another engine,
            such as a :class:`~vanilla_transformer.deployment.CTranslate2Translator`, goes to
            :func:`translate_with`.)
        tokenizer: the tokenizer the model was trained with (``train_joint_bpe``); it must append
            ``</s>`` to sources, as ours does.
        texts: source sentences, one string each; a blank one gives an empty translation.
        batch_size: sentences per batch (ignored when ``max_tokens`` is given).
        max_tokens: if given, batch by size instead: at most this many padded *source* tokens per
            batch (a longer sentence gets a batch of its own). Beam search multiplies the work of a
            batch by ``num_beams``.
        num_beams, length_penalty, max_new_tokens: override the model's ``generation_config``;
            ``None`` keeps it. Our model's defaults are the paper's (§6.1): beam 4, α = 0.6, and at
            most *source length + 50* tokens per sentence when no ``max_new_tokens`` is given.
        device: where to run. ``None``: the model's device. Otherwise the model is moved there
            (``model.to(device)``, in place) and inputs are sent there too.
        dtype: ``torch.bfloat16`` / ``torch.float16`` (or ``"bf16"`` / ``"fp16"``) to decode under
            ``torch.autocast`` with that dtype; ``None`` or float32 decodes in the model's dtype.
        progress: show a tqdm progress bar (in sentences).

    Raises:
        ValueError: ``texts`` is empty or holds a non-string; the tokenizer does not match the model
            (:func:`~vanilla_transformer.tokenization.check_tokenizer_matches_model`); or the model has
            learned positions (``position_embedding_type="learned"``) and a tokenised source is longer
            than ``config.max_position_embeddings``. (With learned positions, an *output* longer than
            that limit is refused by the model during generation; sinusoidal positions have no limit.)
    """
    return _translate_filled(
        texts,
        lambda filled: _generate_translations(
            model,
            tokenizer,
            filled,
            batch_size,
            max_tokens,
            num_beams,
            length_penalty,
            max_new_tokens,
            device,
            dtype,
            progress,
        ),
    )


def _translate_filled(texts: Any, run: Callable[[list[str]], list[str]]) -> list[str]:
    """``run`` on the sentences of ``texts`` that are not blank; a blank one translates to an empty string
    (not to what a model makes of a lone ``</s>``). Checks ``texts`` first."""
    texts = check_texts("texts", texts)
    filled = [i for i, text in enumerate(texts) if text.strip()]
    if len(filled) == len(texts):
        return run(texts)
    outputs = [""] * len(texts)
    if filled:
        for i, text in zip(filled, run([texts[i] for i in filled]), strict=True):
            outputs[i] = text
    return outputs


def _generate_translations(
    model, tokenizer, texts, batch_size, max_tokens, num_beams, length_penalty, max_new_tokens, device, dtype, progress
) -> list[str]:
    """:func:`translate` for sentences already checked, none of them blank."""
    config = model.config
    check_tokenizer_matches_model(tokenizer, config)
    if max_tokens is None:
        if batch_size is None or int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive integer (or give max_tokens), got {batch_size!r}.")
        batch_size = int(batch_size)
    elif int(max_tokens) < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}.")
    autocast_dtype = _resolve_dtype(dtype)

    encoded = tokenizer(texts, add_special_tokens=True)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    if getattr(config, "position_embedding_type", None) == "learned":
        check_source_lengths(
            lengths,
            config.max_position_embeddings,
            table=f"this model's learned position table (max_position_embeddings={config.max_position_embeddings})",
            fix="sinusoidal positions, the paper's default, have no such limit",
        )

    if device is not None:
        model.to(device)
    run_device = torch.device(device) if device is not None else next(model.parameters()).device
    if autocast_dtype is not None and autocast_dtype != torch.float32:
        autocast = torch.autocast(device_type=run_device.type, dtype=autocast_dtype)
    else:
        autocast = contextlib.nullcontext()

    overrides = {"num_beams": num_beams, "length_penalty": length_penalty, "max_new_tokens": max_new_tokens}
    generate_kwargs = {name: value for name, value in overrides.items() if value is not None}
    pad_id = config.pad_token_id if config.pad_token_id is not None else tokenizer.pad_token_id

    batches = _length_batches(lengths, batch_size, max_tokens)
    outputs: list[str | None] = [None] * len(texts)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(texts), unit="sent", desc="translating")
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            width = max(lengths[i] for i in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):  # right padding, as the tokenizer and the model expect
                input_ids[row, : lengths[i]] = torch.tensor(encoded[i], dtype=torch.long)
                attention_mask[row, : lengths[i]] = 1
            with torch.inference_mode(), autocast:
                generated = model.generate(
                    input_ids.to(run_device), attention_mask=attention_mask.to(run_device), **generate_kwargs
                )
            decoded = tokenizer.batch_decode(generated.cpu(), skip_special_tokens=True)
            for i, text in zip(batch, decoded):
                outputs[i] = text
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
        model.train(was_training)
    return outputs  # type: ignore[return-value]


class Translator(Protocol):
    """A translation engine, as evaluation uses it: sentences in, detokenised translations out, in the input order.

    ``num_beams``, ``length_penalty`` and ``max_new_tokens`` override the engine's decoding defaults (``None``:
    the model's ``generation_config``, the paper's beam 4, α = 0.6, source length + 50); ``batch_size`` is how
    many sentences are translated together; ``progress`` shows a progress bar. Settings that only one engine
    has (the device, the dtype, CTranslate2's threads) are given when the engine is made.
    :class:`TransformersTranslator` and :class:`~vanilla_transformer.deployment.CTranslate2Translator`
    implement it; :func:`translate_with` and :func:`evaluate_translator` accept any of them.
    """

    def translate(
        self,
        texts: list[str],
        *,
        batch_size: int = 32,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        max_new_tokens: int | None = None,
        progress: bool = False,
    ) -> list[str]: ...


class TransformersTranslator:
    """A transformers model and its tokenizer as a :class:`Translator`: :func:`translate` with these settings.

    Args:
        model: a ``VanillaTransformerForConditionalGeneration`` (or any seq2seq model with ``generate``).
        tokenizer: the tokenizer the model was trained with.
        max_tokens, device, dtype: as in :func:`translate`.

    Raises:
        ValueError: ``model`` has no ``generate`` (for instance an engine that translates by itself, which
            :func:`translate_with` and :func:`evaluate_translator` take as it is).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_tokens: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
    ):
        if not callable(getattr(model, "generate", None)) or not hasattr(model, "config"):
            raise ValueError(
                f"{type(model).__name__} is not a transformers model (it has no generate() and config): give a saved "
                f"model and its tokenizer, or pass an engine that translates by itself (such as CTranslate2Translator) "
                f"to translate_with / evaluate_translator, without a tokenizer."
            )
        self.model, self.tokenizer = model, tokenizer
        self.max_tokens, self.device, self.dtype = max_tokens, device, dtype

    def translate(
        self,
        texts: list[str],
        *,
        batch_size: int | None = 32,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        max_new_tokens: int | None = None,
        progress: bool = False,
    ) -> list[str]:
        return translate(
            self.model,
            self.tokenizer,
            texts,
            batch_size=batch_size,
            max_tokens=self.max_tokens,
            num_beams=num_beams,
            length_penalty=length_penalty,
            max_new_tokens=max_new_tokens,
            device=self.device,
            dtype=self.dtype,
            progress=progress,
        )


def translate_with(translator: Translator, texts: list[str], **options: Any) -> list[str]:
    """``translator.translate(texts, **options)`` for any :class:`Translator`, with the same checks of ``texts``
    and the same handling of blank sentences (each gives an empty translation) as :func:`translate`.

    Raises:
        ValueError: ``texts`` is empty or holds a non-string.
        TypeError: ``translator`` has no ``translate`` method, or an option is not one of the interface's.
    """
    run = getattr(translator, "translate", None)
    if not callable(run):
        raise TypeError(
            f"{type(translator).__name__} has no translate(texts, ...) method; wrap a transformers model and its "
            f"tokenizer in TransformersTranslator(model, tokenizer)."
        )
    return _translate_filled(texts, lambda filled: run(filled, **options))


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------
def _check_pair(hypotheses: Any, references: Any) -> tuple[list[str], list[str]]:
    hypotheses = check_texts("hypotheses", hypotheses)
    references = check_texts("references", references)
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: there must be exactly one "
            f"reference per hypothesis, in the same order."
        )
    return hypotheses, references


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF of detokenised ``hypotheses`` against one reference each.

    Uses the ``sacrebleu`` package with its defaults: BLEU with the ``13a`` tokeniser, mixed case,
    exponential smoothing; chrF with character 6-grams, β = 2. Scores are on a 0–100 scale.

    Returns:
        ``{"bleu", "bleu_signature", "chrf", "chrf_signature", "n"}``; a signature reads like
        ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``.

    Raises:
        ValueError: a list is empty, holds a non-string, or the two differ in length.
    """
    hypotheses, references = _check_pair(hypotheses, references)
    bleu, chrf = BLEU(), CHRF()
    bleu_result = bleu.corpus_score(hypotheses, [references])
    chrf_result = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": float(bleu_result.score),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": float(chrf_result.score),
        "chrf_signature": str(chrf.get_signature()),
        "n": len(hypotheses),
    }


# --------------------------------------------------------------------------------------------
# Translate + score + write
# --------------------------------------------------------------------------------------------
def evaluate_translator(
    translator: Translator,
    sources: list[str],
    references: list[str],
    hypotheses_path: str | os.PathLike | None = None,
    **translate_options: Any,
) -> dict:
    """Translate ``sources`` with any :class:`Translator`, score against ``references`` and optionally save the
    hypotheses.

    Args:
        sources, references: parallel lists of sentences (detokenised text).
        hypotheses_path: if given, the translations are written there, one per line, UTF-8, atomically
            (:func:`~vanilla_transformer.checkpoints.write_text_atomically`). Characters that text tools read
            as line breaks inside a translation are written as spaces, so the file has exactly one line per
            source sentence.
        **translate_options: passed to ``translator.translate`` (``batch_size``, ``num_beams``, ...).

    Returns:
        :func:`score`'s dict plus ``"seconds"``: the wall-clock time of translation and scoring.
    """
    sources, references = check_texts("sources", sources), check_texts("references", references)
    if len(sources) != len(references):
        raise ValueError(
            f"{len(sources)} sources but {len(references)} references: they must be parallel "
            f"(one reference per source)."
        )
    start = time.perf_counter()
    hypotheses = translate_with(translator, sources, **translate_options)
    result = score(hypotheses, references)
    result["seconds"] = time.perf_counter() - start
    if hypotheses_path is not None:
        write_text_atomically(hypotheses_path, "".join(line.translate(_LINE_BREAK_TABLE) + "\n" for line in hypotheses))
    return result


def evaluate_model(
    model: Any,
    tokenizer: Any,
    sources: list[str],
    references: list[str],
    hypotheses_path: str | os.PathLike | None = None,
    *,
    max_tokens: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    **translate_options: Any,
) -> dict:
    """:func:`evaluate_translator` for a transformers model and its tokenizer (:class:`TransformersTranslator`
    with ``max_tokens``, ``device`` and ``dtype``, as in :func:`translate`)."""
    translator = TransformersTranslator(model, tokenizer, max_tokens=max_tokens, device=device, dtype=dtype)
    return evaluate_translator(translator, sources, references, hypotheses_path, **translate_options)


# --------------------------------------------------------------------------------------------
# Teacher-forced loss and perplexity
# --------------------------------------------------------------------------------------------
def loss_sums(
    model: Any, batch: dict, label_smoothing: float, workspace: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over the batch's target tokens of the label-smoothed cross-entropy (§5.4; with gradients when
    enabled) and of the plain NLL. ``skip_logits``: the model computes them block by block from its last hidden
    states instead of materialising [batch, length, vocab] logits (same values; faster on CPUs). ``workspace``:
    the training loop's dict in which the loss keeps its logits from forward to backward (``loss_workspace``)."""
    with input_values_checked():  # the ids come from a tokenizer checked against the model: no range check
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch.get("attention_mask"),
            labels=batch["labels"],
            smoothing=label_smoothing,
            skip_logits=True,
            num_items_in_batch=1,  # 1: sums, not means
            loss_workspace=workspace,
        )
    return out.loss, out.nll_loss


@torch.no_grad()
def perplexity(
    model: Any,
    input_ids: Sequence[Sequence[int]],
    labels: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    max_tokens: int,
    label_smoothing: float = 0.0,
    accelerator: Any = None,
) -> dict:
    """The teacher-forced cross-entropy per target token of every pair (source ids, target ids), none dropped.

    Pairs are batched by length (:class:`~vanilla_transformer.data.TokenBucketBatchSampler`, at most
    ``max_tokens`` padded tokens per side). With an Accelerate ``accelerator``, each process takes its share
    and the sums are added over the processes (under its autocast); without, the model runs where it is.
    The model is in eval mode for the call and put back as it was.

    Returns:
        ``{"loss": the label-smoothed cross-entropy (= "nll" when label_smoothing is 0), "nll", "ppl": exp(nll),
        "target_tokens"}``, per target token (``</s>`` included).
    """
    if accelerator is not None:
        replicas, rank, device, autocast = (
            accelerator.num_processes,
            accelerator.process_index,
            accelerator.device,
            accelerator.autocast,
        )
    else:
        replicas, rank, device, autocast = 1, 0, next(model.parameters()).device, contextlib.nullcontext
    sampler = TokenBucketBatchSampler(
        list(zip(map(len, input_ids), map(len, labels))),
        max_tokens=max_tokens,
        shuffle=False,
        num_replicas=replicas,
        rank=rank,
        drop_last=False,
    )
    totals = torch.zeros(3, device=device, dtype=torch.float64)  # smoothed, nll, tokens
    was_training = model.training
    model.eval()
    try:
        for indices in sampler:
            batch = {k: v.to(device) for k, v in collate_pairs(input_ids, labels, indices, pad_token_id).items()}
            with autocast():
                smoothed, nll = loss_sums(model, batch, label_smoothing)
            totals[:2] += torch.stack([smoothed.detach(), nll.detach()]).double()
            totals[2] += sum(len(labels[i]) for i in indices)
        if accelerator is not None:  # (padding batches repeated on some ranks count twice: negligible)
            totals = sum_over_processes(accelerator, totals)
    finally:
        model.train(was_training)
    loss, nll = (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()
    return {"loss": loss, "nll": nll, "ppl": math.exp(min(nll, 50)), "target_tokens": int(totals[2].item())}
