"""Translate with a trained model and score the output with sacreBLEU (the paper's §6.1 evaluation).

The paper reports case-sensitive BLEU on newstest2014. We report sacreBLEU (Post, 2018): corpus BLEU
computed on *detokenised* hypotheses and references with sacreBLEU's own ``13a`` tokeniser, plus chrF,
each with the signature that makes the number reproducible (``nrefs:1|case:mixed|eff:no|tok:13a|...``).
The paper's own numbers were computed on tokenised, compound-split text (``multi-bleu.perl``), so they
are not directly comparable with sacreBLEU scores; the signature says exactly what was measured.

* :func:`translate` — sentences in, detokenised translations out (batched by length, in input order), with
  transformers' ``generate`` or with a CTranslate2 export (:mod:`vanilla_transformer.deployment`).
* :func:`score` — corpus BLEU and chrF, with signatures, from the ``sacrebleu`` package.
* :func:`evaluate_model` — both, plus an optional hypotheses file and the wall-clock time.
* :func:`load_sacrebleu_metric` — ``evaluate.load("sacrebleu")`` when the Hub (or its cache) has it,
  else an offline stand-in with the same ``compute`` interface.
* :func:`translate_candidates` — one sentence's best beam-search candidates, best first, with the scores
  that ranked them and each token's log-probability.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from sacrebleu.metrics import BLEU, CHRF

from .deployment import CTranslate2Translator
from .tokenization import check_tokenizer_matches_model

__all__ = ["evaluate_model", "load_sacrebleu_metric", "score", "translate", "translate_candidates"]

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
def _check_texts(name: str, texts: Any) -> list[str]:
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
            ``generate``). It is put in eval mode for the call and restored afterwards. Or a
            :class:`~vanilla_transformer.deployment.CTranslate2Translator`, which translates with its
            own tokenizer (``tokenizer`` is then ignored) and batches by itself (``max_tokens``, ``device``
            and ``dtype`` are chosen when it is exported and loaded).
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
    texts = _check_texts("texts", texts)
    filled = [i for i, text in enumerate(texts) if text.strip()]
    if len(filled) < len(texts):  # a blank line translates to a blank line, not to what the model makes of "</s>"
        outputs = [""] * len(texts)
        if filled:
            done = translate(model, tokenizer, [texts[i] for i in filled], batch_size=batch_size, max_tokens=max_tokens,
                             num_beams=num_beams, length_penalty=length_penalty, max_new_tokens=max_new_tokens,
                             device=device, dtype=dtype, progress=progress)  # fmt: skip
            for i, text in zip(filled, done, strict=True):
                outputs[i] = text
        return outputs
    if isinstance(model, CTranslate2Translator):
        unused = {"max_tokens": max_tokens, "device": device, "dtype": dtype}
        given = [name for name, value in unused.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: not options of the CTranslate2 engine (set them when exporting or loading it).")
        return model.translate(texts, batch_size=batch_size, num_beams=num_beams, length_penalty=length_penalty,
                               max_new_tokens=max_new_tokens, progress=progress)  # fmt: skip
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
        limit = config.max_position_embeddings
        too_long = [i for i, n in enumerate(lengths) if n > limit]
        if too_long:
            shown = ", ".join(f"text {i} has {lengths[i]} tokens" for i in too_long[:5])
            raise ValueError(
                f"{len(too_long)} source sentence(s) are longer than this model supports: {shown}, but the "
                f"model's learned positions stop at max_position_embeddings={limit}. Shorten or split them "
                f"(sinusoidal positions, the paper's default, have no such limit)."
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


def translate_candidates(
    model: Any,
    tokenizer: Any,
    text: str,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    num_return_sequences: int | None = None,
    max_new_tokens: int | None = None,
) -> list[dict[str, Any]]:
    """The best candidates that beam search finished for one sentence, best first, with their scores.

    One ``model.generate`` call with ``num_return_sequences``, ``output_scores`` and
    ``return_dict_in_generate``: the candidates are transformers' own finished hypotheses, ranked by
    its ``sequences_scores``. With the same settings the first candidate is :func:`translate`'s output.

    Args:
        text: one source sentence.
        num_beams, length_penalty, max_new_tokens: as in :func:`translate`; ``None`` keeps the model's
            generation config (the paper's beam 4, α = 0.6, source length + 50). ``num_beams=1`` is greedy
            decoding, which has one candidate.
        num_return_sequences: how many candidates, at most ``num_beams``; ``None``: ``num_beams``.

    Returns:
        One dict per candidate, best first: ``text`` (detokenised), ``score`` (what ranked it:
        transformers' ``sequences_scores``, the sum of the token log-probabilities divided by
        ``length ** length_penalty``; for greedy decoding, which has no length penalty, the sum itself),
        ``log_probability`` (the sum of the token log-probabilities under the model), ``length`` (tokens
        generated, ``</s>`` included), ``token_ids`` and ``tokens`` (those tokens, as
        ``tokenizer.convert_ids_to_tokens`` gives them) and ``token_log_probabilities`` (one per token).

    Raises:
        ValueError: ``text`` is not a non-empty string; ``num_beams`` or ``num_return_sequences`` is not a
            positive integer, or more candidates are asked for than there are beams; the tokenizer does not
            match the model.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"`text` must be one non-empty sentence (a string), got {text!r}.")
    config = model.config
    check_tokenizer_matches_model(tokenizer, config)
    beams = model.generation_config.num_beams if num_beams is None else num_beams
    if not isinstance(beams, int) or isinstance(beams, bool) or beams < 1:
        raise ValueError(f"num_beams must be a positive integer (1: greedy decoding), got {beams!r}.")
    count = beams if num_return_sequences is None else num_return_sequences
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= beams:
        raise ValueError(
            f"num_return_sequences must be an integer from 1 to num_beams={beams} (beam search finishes at most "
            f"one candidate per beam), got {count!r}. Ask for fewer candidates or use more beams."
        )
    overrides = {"length_penalty": length_penalty, "max_new_tokens": max_new_tokens}
    generate_kwargs = {name: value for name, value in overrides.items() if value is not None}
    device = next(model.parameters()).device
    input_ids = tokenizer([text], return_tensors="pt")["input_ids"].to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            output = model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), num_beams=beams, num_return_sequences=count,
                output_scores=True, output_logits=True, return_dict_in_generate=True, **generate_kwargs,
            )  # fmt: skip
            # Log-probabilities of the chosen tokens under the model: log-softmax of its raw logits. (Beam
            # search's `scores` are these before the logits processors; greedy search's are processed logits.)
            token_scores = model.compute_transition_scores(
                output.sequences, output.logits, getattr(output, "beam_indices", None), normalize_logits=True
            ).float().cpu()
    finally:
        model.train(was_training)
    sequences = output.sequences[:, 1:].cpu()  # without the decoder start token
    eos = config.eos_token_id
    candidates = []
    for row, ids in enumerate(sequences.tolist()):
        length = ids.index(eos) + 1 if eos in ids else len(ids)  # after </s> comes padding
        ids = ids[:length]
        log_probabilities = token_scores[row, :length]
        log_probability = float(log_probabilities.sum())
        if beams > 1:
            score = float(output.sequences_scores[row])
        else:
            score = log_probability
        candidates.append({
            "text": tokenizer.decode(ids, skip_special_tokens=True),
            "score": score,
            "log_probability": log_probability,
            "length": length,
            "token_ids": ids,
            "tokens": tokenizer.convert_ids_to_tokens(ids),
            "token_log_probabilities": log_probabilities.tolist(),
        })  # fmt: skip
    return candidates


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------
def _check_pair(hypotheses: Any, references: Any) -> tuple[list[str], list[str]]:
    hypotheses = _check_texts("hypotheses", hypotheses)
    references = _check_texts("references", references)
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


class LocalSacrebleuMetric:
    """Offline stand-in for ``evaluate.load("sacrebleu")``, computed by the ``sacrebleu`` package.

    ``compute(predictions=[...], references=[...])`` takes one reference string per prediction, or a
    list of references per prediction (the same number for each), and returns the keys of evaluate's
    metric: ``score``, ``counts``, ``totals``, ``precisions``, ``bp``, ``sys_len``, ``ref_len``.
    Keyword options are those of evaluate's metric (``smooth_method``, ``smooth_value``, ``force``,
    ``lowercase``, ``tokenize``, ``use_effective_order``).
    """

    name = "sacrebleu"

    def compute(
        self,
        *,
        predictions: Sequence[str],
        references: Sequence[str] | Sequence[Sequence[str]],
        smooth_method: str = "exp",
        smooth_value: float | None = None,
        force: bool = False,
        lowercase: bool = False,
        tokenize: str | None = None,
        use_effective_order: bool = False,
    ) -> dict:
        predictions = _check_texts("predictions", predictions)
        references = list(references)
        if not references:
            raise ValueError("`references` is empty: give one reference (or list of references) per prediction.")
        if len(predictions) != len(references):
            raise ValueError(
                f"{len(predictions)} predictions but {len(references)} references: give one per prediction."
            )
        if isinstance(references[0], str):
            references = [[ref] for ref in references]
        per_prediction = len(references[0])
        if any(len(refs) != per_prediction for refs in references):
            raise ValueError("Sacrebleu requires the same number of references for each prediction")
        streams = [[refs[i] for refs in references] for i in range(per_prediction)]
        output = sacrebleu.corpus_bleu(
            predictions,
            streams,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            force=force,
            lowercase=lowercase,
            use_effective_order=use_effective_order,
            **({"tokenize": tokenize} if tokenize else {}),
        )
        return {
            "score": output.score,
            "counts": output.counts,
            "totals": output.totals,
            "precisions": output.precisions,
            "bp": output.bp,
            "sys_len": output.sys_len,
            "ref_len": output.ref_len,
        }


def load_sacrebleu_metric(use_hub: bool = True) -> Any:
    """``evaluate.load("sacrebleu")`` if it loads, else :class:`LocalSacrebleuMetric` (offline).

    ``evaluate.load`` fetches the metric's *script* from the Hugging Face Hub (or finds it in the
    local cache, ``~/.cache/huggingface``); it fails without network access or with
    ``HF_HUB_OFFLINE=1`` and no cached copy. Either way the returned object has
    ``compute(predictions=..., references=...)`` returning evaluate's keys (``"score"``, ...).
    ``use_hub=False`` skips ``evaluate`` (and so any network access) altogether. For scores with
    signatures, prefer :func:`score`.
    """
    if use_hub:
        try:
            import evaluate

            return evaluate.load("sacrebleu")
        except Exception:  # no network, offline mode, no cached script, a broken install...
            pass
    return LocalSacrebleuMetric()


# --------------------------------------------------------------------------------------------
# Translate + score + write
# --------------------------------------------------------------------------------------------
def _write_lines_atomically(path: str | os.PathLike, lines: list[str]) -> None:
    """Write ``lines`` (one per line, UTF-8, ``\\n`` endings) so that readers never see a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with open(fd, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(line.translate(_LINE_BREAK_TABLE) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def evaluate_model(
    model: Any,
    tokenizer: Any,
    sources: list[str],
    references: list[str],
    hypotheses_path: str | os.PathLike | None = None,
    **translate_kwargs: Any,
) -> dict:
    """Translate ``sources``, score against ``references`` and optionally save the hypotheses.

    Args:
        sources, references: parallel lists of sentences (detokenised text).
        hypotheses_path: if given, the translations are written there, one per line, UTF-8,
            atomically (a temporary file in the same folder, then ``os.replace``). Characters that
            text tools read as line breaks inside a translation are written as spaces, so the file
            has exactly one line per source sentence.
        **translate_kwargs: passed to :func:`translate` (``batch_size``, ``num_beams``, ``dtype``...).

    Returns:
        :func:`score`'s dict plus ``"seconds"``: the wall-clock time of translation and scoring.
    """
    sources, references = _check_texts("sources", sources), _check_texts("references", references)
    if len(sources) != len(references):
        raise ValueError(
            f"{len(sources)} sources but {len(references)} references: they must be parallel "
            f"(one reference per source)."
        )
    start = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, **translate_kwargs)
    result = score(hypotheses, references)
    result["seconds"] = time.perf_counter() - start
    if hypotheses_path is not None:
        _write_lines_atomically(hypotheses_path, hypotheses)
    return result
