"""Fast beam search for the model, beside the paper's model file.

``VanillaTransformerGenerationMixin`` is the ``GenerationMixin`` the model class inherits. Its beam search
is transformers' own loop (``GenerationMixin._beam_search``, 5.24) with each step's vocabulary-sized work
done in place, and with three changes of layout; it returns exactly transformers' tokens (tested by
``tests/test_generation.py::test_in_place_beam_search_gives_transformers_beam_search_tokens``):

* the log-softmax is written into one buffer kept across steps (bf16 logits are converted into it), the
  min-length and source-length masks are applied in place, and the top-k of log-probabilities plus beam
  scores over beams × vocabulary is found through chunk maxima (``top_k``), the beam scores added to
  the few candidates only;
* the decoder gets each sentence's encoder output once, not once per beam: encoder-decoder attention
  projects, keeps and reads its keys and values once per sentence (``attention_for_grouped_beams``, the
  one hook in the model file's attention);
* the self-attention caches are reordered as they grow (``BeamSearchSelfAttentionLayer``): one copy of
  the cache per step instead of two.

**It fails safe.** The loop calls private transformers helpers, whose names and signatures may change in
any release. It runs only on the transformers versions in ``TESTED_TRANSFORMERS_VERSIONS`` and only when
every private name it uses exists; otherwise transformers' own beam search runs (one info-level log line
says why). Sampling, returned scores / logits / attentions, other logits processors, several GPUs and
generation without a cache go to transformers' loop too.

This file travels to the Hub with every checkpoint (``trust_remote_code=True``): it imports only torch and
transformers. Measurements are in the project's ``docs/performance-log.md``.
"""

import math
from collections.abc import Callable

import torch
import transformers
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation.logits_process import (
    LogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
)
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import logging

logger = logging.get_logger(__name__)

#: The transformers releases the in-place beam search was tested with (the whole test suite passed on each).
#: On any other release transformers' own beam search runs. Add a release only after the suite passed on it.
TESTED_TRANSFORMERS_VERSIONS = ("5.24.0", "5.25.0")

#: Every private ``GenerationMixin`` name the in-place loop calls, or overrides (``_beam_search``).
PRIVATE_GENERATION_METHODS = (
    "_beam_search",
    "_prefill",
    "_has_unfinished_sequences",
    "_update_model_kwargs_for_generation",
    "_flatten_beam_dim",
    "_unflatten_beam_dim",
    "_gather_beams",
    "_get_running_beams_for_next_iteration",
    "_update_finished_beams",
    "_check_early_stop_heuristic",
    "_beam_search_has_unfinished_sequences",
)
#: Private attributes ``generate`` sets on the generation config before beam search, which the loop reads.
PRIVATE_GENERATION_CONFIG_ATTRIBUTES = ("_pad_token_tensor", "_eos_token_tensor")

#: How beam search normalises a finished hypothesis's log-probability by its length |Y| (the tokens generated,
#: </s> included), the generation config's ``length_penalty_form``, with α its ``length_penalty``:
#: ``"power"``: log P(Y|X) / |Y|^α, transformers', CTranslate2's and fairseq's;
#: ``"gnmt"``: log P(Y|X) / ((5 + |Y|) / 6)^α, GNMT's lp(Y) (Wu et al. 2016), which the paper cites with
#: α = 0.6 (§6.1) and tensor2tensor decodes with. Only the in-place beam search computes it; see ``_beam_search``.
LENGTH_PENALTY_FORMS = ("power", "gnmt")


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / (5 + 1))^α."""
    return ((5 + length) / 6) ** alpha


def checked_length_penalty_form(form: str | None) -> str:
    """A ``length_penalty_form`` checked, ``"power"`` for None (generation configs saved before the field existed)."""
    form = form or "power"
    if form not in LENGTH_PENALTY_FORMS:
        raise ValueError(
            f"length_penalty_form={form!r} is not one of {', '.join(map(repr, LENGTH_PENALTY_FORMS))}: 'power' divides "
            f"a hypothesis's log-probability by |Y|^α (transformers'), "
            f"'gnmt' by ((5 + |Y|) / 6)^α (GNMT's, the paper's)."
        )
    return form


def in_place_beam_search_unavailable(generation_config=None) -> str | None:
    """Why the in-place beam search cannot run with this transformers, or None when it can."""
    version = transformers.__version__
    if version not in TESTED_TRANSFORMERS_VERSIONS:
        return f"transformers {version} is not among the tested releases {', '.join(TESTED_TRANSFORMERS_VERSIONS)}"
    missing = [name for name in PRIVATE_GENERATION_METHODS if not hasattr(GenerationMixin, name)]
    if generation_config is not None:
        missing += [name for name in PRIVATE_GENERATION_CONFIG_ATTRIBUTES if not hasattr(generation_config, name)]
    if missing:
        return f"transformers {version} has no {', '.join(missing)}"
    return None


# --------------------------------------------------------------------------------------------
# One encoder row per sentence: the hook in the model's attention
# --------------------------------------------------------------------------------------------
def attention_for_grouped_beams(
    attention_interface: Callable, group: int, module, query, key, value, attention_mask, **kwargs
):
    """``attention_interface(module, query, key, value, attention_mask, **kwargs)`` where ``group``
    consecutive query rows (a sentence's beams) share one key/value row (the sentence's encoder output).
    The model's encoder–decoder attention calls it when given ``beams_per_encoder_row`` > 1, which only the
    in-place beam search passes.

    The group's queries become one row's ``group × T_q`` queries, so the keys and values are read once per
    sentence. Equal to repeating each key/value row ``group`` times (tested by ``tests/test_generation.py::
    test_decoder_rows_sharing_one_encoder_row_equal_rows_with_repeated_encoder_outputs``).

    Shapes: ``query`` [B, H, T_q, d_k], ``key``/``value`` [B/g, H, T_k, d], ``attention_mask`` None or
    [B/g, 1, T_q or 1, T_k]. Returns ``[B, T_q, H, d_v]`` and the weights as ``[B, H, T_q, T_k]`` (or None).
    """
    rows, heads, q_len, _ = query.shape
    if rows != key.shape[0] * group:
        raise ValueError(
            f"beams_per_encoder_row={group} needs {group} decoder rows per encoder row, "
            f"but the decoder has {rows} rows and the encoder output {key.shape[0]}: "
            f"give one encoder row per group of {group} consecutive decoder rows "
            f"(the beams of a sentence), or leave beams_per_encoder_row at 1."
        )
    query = query.unflatten(0, (-1, group)).transpose(1, 2).flatten(2, 3)  # [B/g, H, g·T_q, d_k]
    if attention_mask is not None and attention_mask.shape[-2] != 1:
        attention_mask = attention_mask.repeat(1, 1, group, 1)  # [B/g, 1, g·T_q, T_k]
    output, weights = attention_interface(module, query, key, value, attention_mask, **kwargs)
    output = output.reshape(rows, q_len, *output.shape[2:])  # [B/g, g·T_q, H, d_v] → [B, T_q, H, d_v]
    if weights is not None:
        weights = weights.unflatten(2, (group, q_len)).transpose(1, 2).flatten(0, 1)  # [B, H, T_q, T_k]
    return output, weights


# --------------------------------------------------------------------------------------------
# The pieces of the loop
# --------------------------------------------------------------------------------------------
class BeamSearchSelfAttentionLayer(DynamicLayer):
    """One decoder layer's self-attention keys and values in beam search, reordered as they grow.

    transformers' ``DynamicLayer`` concatenates each step's keys and values into a new tensor, and beam
    search then reorders that into another: two copies of the cache per step. Here a reordering only
    records which rows to take, and the next step's concatenation copies the rows in that order.
    Equal to ``DynamicLayer`` (tested by ``tests/test_generation.py::
    test_beam_search_cache_layer_reordering_as_it_grows_equals_transformers_layer``). Only the in-place
    loop uses it, which reads the keys and values through ``update`` alone.
    """

    def __init__(self):
        super().__init__()
        self.order = None  # rows to take at the next update, when a reordering is pending

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized or self.keys.numel() == 0:
            self.order = None
            return super().update(key_states, value_states)
        self.keys, self.values = self._grow(self.keys, key_states), self._grow(self.values, value_states)
        self.order = None
        return self.keys, self.values

    def _grow(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        length = old.shape[-2]
        grown = old.new_empty(*old.shape[:-2], length + new.shape[-2], old.shape[-1])
        if self.order is None:
            grown[..., :length, :].copy_(old)
        else:
            torch.index_select(old, 0, self.order, out=grown[..., :length, :])
        grown[..., length:, :].copy_(new)
        return grown

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized and self.keys.numel():
            beam_idx = beam_idx.to(self.keys.device)
            self.order = beam_idx if self.order is None else self.order[beam_idx]


def top_k(scores: torch.Tensor, k: int, offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk((scores + offsets[..., None]).flatten(1), k)`` for ``scores`` [rows, groups, n] and
    ``offsets`` [rows, groups] (None: 0), found among few candidates and without the sum's full tensor.

    Each group's n values are cut into about √n chunks of √n; the k chunks of a row with the largest
    offset maxima (plus each group's last, shorter chunk) hold the row's k largest sums: the k-th largest
    sum is at least the k-th largest chunk maximum m, since those k chunks each hold a sum ≥ m, and every
    sum above m lies in a chunk whose maximum is above m. Rounding keeps this exact: x ≤ y gives
    x + b ≤ y + b in floating point too. Only which of several equal values is returned can differ from
    ``torch.topk``, whose choice among ties is unspecified too. Tested against ``torch.topk`` by
    ``tests/test_generation.py::test_top_k_*``.
    """
    rows, groups, n = scores.shape
    width = math.isqrt(n)
    count = n // width
    shift = offsets[..., None] if offsets is not None else 0.0
    if groups * count <= k:
        return torch.topk((scores + shift).flatten(1), k)
    body = scores[..., : count * width].unflatten(-1, (count, width))  # [rows, groups, count, width]
    maxima = body.amax(-1) + shift  # [rows, groups, count]
    best = torch.topk(maxima.flatten(1), k).indices  # [rows, k]: the chunks with the largest maxima
    group, chunk = best // count, best % count
    row = torch.arange(rows, device=scores.device)[:, None]
    candidates = body[row, group, chunk]  # [rows, k, width]
    if offsets is not None:
        candidates = candidates + offsets[row, group][..., None]
    positions = (group * n + chunk * width)[..., None] + torch.arange(width, device=scores.device)
    candidates, positions = candidates.flatten(1), positions.flatten(1)
    if count * width < n:  # each group's last, shorter chunk is always a candidate
        tail = (scores[..., count * width :] + shift).flatten(1)
        tail_positions = torch.arange(groups, device=scores.device)[:, None] * n + torch.arange(
            count * width, n, device=scores.device
        )
        candidates = torch.cat([candidates, tail], dim=1)
        positions = torch.cat([positions, tail_positions.flatten().expand(rows, -1)], dim=1)
    values, picked = torch.topk(candidates, k)
    return values, positions.gather(1, picked)


class InPlaceLogitsProcessor(LogitsProcessor):
    """A logits processor that can also write its change into the scores it is given (``mask_``), which the
    in-place beam search then calls instead of ``__call__``. Subclassing it is the opt-in: the loop takes no
    other processor of the model's own into the fast path."""

    def mask_(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """``self(input_ids, scores)``, written into ``scores``."""
        raise NotImplementedError


def _masks_in_place(processor) -> bool:
    """Whether the loop can apply this logits processor to its scores in place (see ``_mask_in_place``)."""
    return type(processor) in (MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor) or isinstance(
        processor, InPlaceLogitsProcessor
    )


def _mask_in_place(processor, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> None:
    """``scores = processor(input_ids, scores)`` without the copy. A processor of the model's own offers
    ``mask_(input_ids, scores)`` (the §6.1 source-length limit); transformers' two min-length processors
    mask the end-of-sentence ids while too few tokens exist."""
    if type(processor) is MinNewTokensLengthLogitsProcessor:
        if input_ids.shape[-1] - processor.prompt_length_to_skip < processor.min_new_tokens:
            scores[:, processor.eos_token_id] = -math.inf
    elif type(processor) is MinLengthLogitsProcessor:
        if input_ids.shape[-1] < processor.min_length:
            scores[:, processor.eos_token_id] = -math.inf
    else:
        processor.mask_(input_ids, scores)


def in_place_beam_search_applies(
    logits_processor, config, synced_gpus: bool, model_kwargs: dict, attn_implementation: str
) -> bool:
    """Whether this call's options are all the in-place loop handles (the rest goes to transformers' loop):
    eager or SDPA attention (the beam grouping reshapes their masks), dynamic caches (a static cache is
    transformers' compiled route), no sampling, no returned scores."""
    cache = model_kwargs.get("cache")
    return (
        not (synced_gpus or config.do_sample or config.return_dict_in_generate or getattr(config, "low_memory", False))
        and bool(model_kwargs.get("use_cache"))
        and attn_implementation in ("eager", "sdpa")
        and isinstance(cache, EncoderDecoderCache)
        and type(cache.self_attention_cache) is DynamicCache
        and type(cache.cross_attention_cache) is DynamicCache
        and all(_masks_in_place(processor) for processor in logits_processor)
    )


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------
class VanillaTransformerGenerationMixin(GenerationMixin):
    """transformers' ``GenerationMixin`` with the in-place beam search (see the module docstring), and a
    returned beam-search cache that continues the returned sequences (``_cache_of_sequences``)."""

    def _cache_of_sequences(
        self, sequences: torch.Tensor, cache: EncoderDecoderCache, num_beams: int, source: dict
    ) -> EncoderDecoderCache:
        """The cache a next ``generate(decoder_input_ids=sequences, cache=..., num_beams=num_beams)`` continues from.

        Beam search returns its best finished hypotheses, but transformers' loop leaves in its cache the keys and
        values of the beams still running at the last step: other hypotheses, in another order. Continuing from
        that cache feeds each returned sequence's last token on top of another hypothesis's past. Here the cache is
        recomputed for the returned sequences, but their last token (which the next call feeds), each row repeated
        for the ``num_beams`` rows the next call expands it to; the cache object is reused when its rows match.
        One encoder and one decoder pass, run only when a beam search returns its cache
        (``return_dict_in_generate=True``). ``source``: ``input_ids`` and ``attention_mask``, or ``encoder_outputs``.
        """
        if sequences.shape[1] < 2:
            return cache
        encoder_outputs, mask = source.get("encoder_outputs"), source.get("attention_mask")
        if encoder_outputs is None:
            input_ids = source["input_ids"]
            if mask is None and bool((input_ids == self.config.pad_token_id).any()):  # as generate infers it
                mask = (input_ids != self.config.pad_token_id).long()
            encoder_outputs = self.get_encoder()(input_ids=input_ids, attention_mask=mask)
        encoder_hidden = encoder_outputs[0]
        repeat = sequences.shape[0] * num_beams // encoder_hidden.shape[0]
        layer = cache.self_attention_cache.layers[0]
        if getattr(layer, "keys", None) is not None and layer.keys.shape[0] == sequences.shape[0] * num_beams:
            cache.reset()
        else:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        self.get_decoder()(
            input_ids=sequences[:, :-1].repeat_interleave(num_beams, dim=0),
            encoder_hidden_states=encoder_hidden.repeat_interleave(repeat, dim=0),
            encoder_attention_mask=None if mask is None else mask.repeat_interleave(repeat, dim=0),
            cache=cache,
            use_cache=True,
        )
        return cache

    def _beam_search(self, *args, **kwargs):
        reason = in_place_beam_search_unavailable()
        if reason is None:
            return self._in_place_beam_search(*args, **kwargs)
        logger.info_once(f"In-place beam search off ({reason}): transformers' own beam search runs.")
        return self._transformers_beam_search(reason, *args, **kwargs)

    def _transformers_beam_search(
        self, reason: str, input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs
    ):
        """transformers' own beam search, which knows only the |Y|^α length penalty: with ``length_penalty_form="gnmt"``
        it runs anyway (refusing would make flex attention, static caches and returned scores unusable with beams),
        and one warning says that the ranking uses |Y|^α instead, and why."""
        if (
            checked_length_penalty_form(getattr(generation_config, "length_penalty_form", None)) == "gnmt"
            and generation_config.length_penalty
        ):
            logger.warning_once(
                f"length_penalty_form='gnmt' is computed by the package's beam search only, which does not run here "
                f"({reason}): transformers' beam search ranks by log P / |Y|^α instead. "
                f"For GNMT's penalty use eager or "
                f"sdpa attention, a dynamic cache and no returned scores; or set length_penalty_form='power'."
            )
        return super()._beam_search(input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs)

    def _in_place_beam_search(
        self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False, **model_kwargs
    ):
        """transformers' ``GenerationMixin._beam_search`` (5.24), step for step, with the changes above."""
        config = generation_config
        reason = in_place_beam_search_unavailable(config)
        applies = in_place_beam_search_applies(
            logits_processor, config, synced_gpus, model_kwargs, self.config._attn_implementation
        )
        if reason is not None or not applies:
            if reason is not None:
                logger.info_once(f"In-place beam search off ({reason}): transformers' own beam search runs.")
            reason = reason or "sampling, returned scores, flex attention, a static cache or another logits processor"
            return self._transformers_beam_search(
                reason, input_ids, logits_processor, stopping_criteria, config, synced_gpus, **model_kwargs
            )
        pad_token_id, eos_token_id = config._pad_token_tensor, config._eos_token_tensor
        early_stopping, length_penalty, max_length = config.early_stopping, config.length_penalty, config.max_length
        # GNMT's penalty: the scores transformers' helpers would divide by length^α are divided here by lp(Y), and
        # the helpers get α = 0 (their divisor is then 1)
        gnmt = checked_length_penalty_form(getattr(config, "length_penalty_form", None)) == "gnmt"
        helpers_length_penalty = 0.0 if gnmt else length_penalty
        num_beams, num_return_sequences = config.num_beams, config.num_return_sequences
        batch_size, cur_len = input_ids.shape[0] // num_beams, input_ids.shape[1]
        # generate() repeated each sentence's encoder output and source mask for its beams: keep one row
        # per sentence; the decoder's attention groups the beams' queries (attention_for_grouped_beams).
        encoder_hidden = model_kwargs["encoder_outputs"].last_hidden_state
        if encoder_hidden.shape[0] == batch_size * num_beams and num_beams > 1:
            model_kwargs["encoder_outputs"] = BaseModelOutput(
                last_hidden_state=encoder_hidden[::num_beams].contiguous()
            )
            if model_kwargs.get("attention_mask") is not None:
                model_kwargs["attention_mask"] = model_kwargs["attention_mask"][::num_beams].contiguous()
            model_kwargs["beams_per_encoder_row"] = num_beams  # generate() passes it on to every model call
        decoder_prompt_len, device = cur_len, input_ids.device
        beams_to_keep = max(2, 1 + (eos_token_id.shape[0] if eos_token_id is not None else 0)) * num_beams
        top_num_beam_mask = torch.arange(beams_to_keep, device=device) < num_beams
        # Rows that end early are filled with padding (transformers' loop fills with `pad_token_id or eos_token_id`,
        # </s> when the pad id is 0, which generate() then replaces with padding).
        fill = pad_token_id if pad_token_id is not None else (eos_token_id[0] if eos_token_id is not None else -1)
        running_sequences = torch.full(
            (batch_size, num_beams, max_length), fill_value=fill, dtype=torch.int64, device=device
        )
        running_sequences[:, :, :cur_len] = self._unflatten_beam_dim(input_ids, batch_size, num_beams)
        sequences = running_sequences.detach().clone()
        running_beam_scores = torch.zeros((batch_size, num_beams), dtype=torch.float, device=device)
        running_beam_scores[:, 1:] = -1e9
        beam_scores = torch.full((batch_size, num_beams), fill_value=-1e9, dtype=torch.float, device=device)
        is_sent_finished = torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device)
        is_early_stop_heuristic_unsatisfied = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
        running_beam_indices = torch.full(
            (batch_size, num_beams, max_length - cur_len), fill_value=-1, dtype=torch.int32, device=device
        )
        beam_indices = running_beam_indices.detach().clone()
        flat_running_sequences = input_ids
        log_probs = None  # the [batch × beams, vocab] buffer, reused at every step
        beam_offset = torch.arange(batch_size, device=device).view(-1, 1) * num_beams  # first flat row of each sentence

        cache = model_kwargs["cache"]
        if cache.get_seq_length() == 0:  # self-attention layers reordered as they grow
            layers = [BeamSearchSelfAttentionLayer() for _ in range(self.config.decoder_layers)]
            model_kwargs["cache"] = EncoderDecoderCache(Cache(layers=layers), cache.cross_attention_cache)
        model_outputs = self._prefill(
            input_ids, config, model_kwargs, is_first_iteration=not getattr(config, "is_assistant", False)
        )
        prefill_consumed = False
        this_peer_finished = False
        while self._has_unfinished_sequences(this_peer_finished, synced_gpus, device=device):
            if prefill_consumed:
                flat_running_sequences = self._flatten_beam_dim(running_sequences[:, :, :cur_len])
                model_inputs = self.prepare_inputs_for_generation(
                    flat_running_sequences, next_sequence_length=1, **model_kwargs
                )
                model_outputs = self(**model_inputs, return_dict=True)
            prefill_consumed = True
            model_kwargs = self._update_model_kwargs_for_generation(
                model_outputs, model_kwargs, is_encoder_decoder=True
            )
            logits = model_outputs.logits[:, -1, :]
            if log_probs is None:
                log_probs = torch.empty(logits.shape, dtype=torch.float32, device=device)
            if logits.dtype == torch.float32:
                torch.log_softmax(logits, dim=-1, out=log_probs)
            else:  # converted into the buffer, not into a fresh float32 copy, then normalised there
                torch.log_softmax(log_probs.copy_(logits), dim=-1, out=log_probs)
            for processor in logits_processor:  # only the kinds in_place_beam_search_applies admits
                _mask_in_place(processor, flat_running_sequences, log_probs)
            del model_outputs
            # transformers' _get_top_k_continuations: the top-k of log-probabilities + beam scores over
            # beams × vocabulary, the beam scores added to few candidates (top_k)
            topk_log_probs, topk_indices = top_k(
                self._unflatten_beam_dim(log_probs, batch_size, num_beams), beams_to_keep, offsets=running_beam_scores
            )
            topk_current_beam_indices = topk_indices // log_probs.shape[-1]
            topk_running_beam_indices = self._gather_beams(running_beam_indices, topk_current_beam_indices)
            topk_running_sequences = self._gather_beams(running_sequences, topk_current_beam_indices)
            topk_running_sequences[:, :, cur_len] = topk_indices % log_probs.shape[-1]
            topk_running_beam_indices[:, :, cur_len - decoder_prompt_len] = topk_current_beam_indices + beam_offset
            next_token_hits_stopping_criteria = stopping_criteria(
                self._flatten_beam_dim(topk_running_sequences[:, :, : cur_len + 1]), None
            )
            next_token_hits_stopping_criteria = self._unflatten_beam_dim(
                next_token_hits_stopping_criteria, batch_size, beams_to_keep
            )
            running_sequences, running_beam_scores, running_beam_indices = self._get_running_beams_for_next_iteration(
                topk_log_probs=topk_log_probs,
                topk_running_sequences=topk_running_sequences,
                topk_running_beam_indices=topk_running_beam_indices,
                next_token_hits_stopping_criteria=next_token_hits_stopping_criteria,
                num_beams=num_beams,
            )
            if gnmt:  # the hypotheses that end here have |Y| = cur_len + 1 - decoder_prompt_len
                topk_log_probs = topk_log_probs / gnmt_length_penalty(cur_len + 1 - decoder_prompt_len, length_penalty)
            sequences, beam_scores, beam_indices, is_sent_finished = self._update_finished_beams(
                sequences=sequences,
                topk_running_sequences=topk_running_sequences,
                beam_scores=beam_scores,
                topk_log_probs=topk_log_probs,
                beam_indices=beam_indices,
                topk_running_beam_indices=topk_running_beam_indices,
                is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied,
                is_sent_finished=is_sent_finished,
                next_token_hits_stopping_criteria=next_token_hits_stopping_criteria,
                top_num_beam_mask=top_num_beam_mask,
                num_beams=num_beams,
                cur_len=cur_len,
                decoder_prompt_len=decoder_prompt_len,
                length_penalty=helpers_length_penalty,
                early_stopping=early_stopping,
            )
            # Only the self-attention caches move: the cross-attention ones hold one row per sentence.
            beam_idx = self._flatten_beam_dim(running_beam_indices[..., cur_len - decoder_prompt_len])
            model_kwargs["cache"].self_attention_cache.reorder_cache(beam_idx)
            cur_len = cur_len + 1
            best_running = running_beam_scores
            if gnmt:  # the best score a running beam could still reach, at the length transformers' heuristic assumes
                longest = early_stopping == "never" and length_penalty > 0.0
                best_running = running_beam_scores / gnmt_length_penalty(
                    (max_length if longest else cur_len) - decoder_prompt_len, length_penalty
                )
            is_early_stop_heuristic_unsatisfied = self._check_early_stop_heuristic(
                is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied,
                running_beam_scores=best_running,
                beam_scores=beam_scores,
                is_sent_finished=is_sent_finished,
                cur_len=cur_len,
                max_length=max_length,
                decoder_prompt_len=decoder_prompt_len,
                early_stopping=early_stopping,
                length_penalty=helpers_length_penalty,
            )
            this_peer_finished = not self._beam_search_has_unfinished_sequences(
                is_early_stop_heuristic_unsatisfied, is_sent_finished, next_token_hits_stopping_criteria, early_stopping
            )

        sequences = self._flatten_beam_dim(sequences[:, :num_return_sequences, :])
        beam_indices = self._flatten_beam_dim(beam_indices[:, :num_return_sequences, :])
        max_generated_length = ((beam_indices + 1).bool()).sum(dim=1).max()
        return sequences[:, : decoder_prompt_len + max_generated_length]


__all__ = [
    "LENGTH_PENALTY_FORMS",
    "TESTED_TRANSFORMERS_VERSIONS",
    "VanillaTransformerGenerationMixin",
    "InPlaceLogitsProcessor",
    "attention_for_grouped_beams",
    "checked_length_penalty_form",
    "gnmt_length_penalty",
    "in_place_beam_search_unavailable",
    "top_k",
]
