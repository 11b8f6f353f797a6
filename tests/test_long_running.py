"""Long-running behaviour: repeated generation does not leak memory, and a very long input is bounded.

* Memory: ``generate`` on a tiny model, and ``evaluation.translate`` with a real (joint BPE) tokenizer,
  are each called 500 times after a warm-up of 50 calls, with beam 4 and greedy search, varying batch
  sizes, source lengths, padding and output limits. Resident memory (``/proc/self/statm``, read after
  ``gc.collect()`` and glibc's ``malloc_trim(0)``, so that freed-but-cached heap pages do not count)
  and the number of objects the garbage collector tracks must grow by less than 4 MiB and 50 objects.
  Measured (2-core CPU, 5 runs): +0.09 to +0.21 MiB and +0 objects (about the same without
  ``malloc_trim``); a real leak, keeping each ``generate`` call's ``scores``, reads +11.4 MiB and +5,522
  objects and fails. The whole file takes about 30 s.
* Long input: the main job trains on pairs of at most ``TrainConfig.max_length`` = 128 tokens. A source
  10x as long (1,280 tokens) to a model whose ``max_position_embeddings`` is 128 is translated, within
  the paper's bound (source length + 50 tokens, §6.1), under a wall-clock guard, when the positions are
  sinusoidal (computed past the table); with learned positions it is refused with a ``ValueError``
  naming ``max_position_embeddings``, and a shorter source's output limit is capped at the table's size.

Linux only: resident memory is read from ``/proc`` and the wall-clock guard is a ``SIGALRM`` timer.
"""

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import math
import os
import signal
import sys
import time

import pytest
import torch
from conftest import EOS, PAD, random_ids, tiny_model
from transformers import LogitsProcessor, LogitsProcessorList

from vanilla_transformer.evaluation import translate
from vanilla_transformer.training_config import TrainConfig

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.path.exists("/proc/self/statm") and hasattr(signal, "setitimer")),
    reason="Linux only: resident memory comes from /proc/self/statm and the wall-clock guard from SIGALRM",
)


WARMUP_CALLS, CALLS = 50, 500
RSS_BOUND = 4 * 2**20  # resident-memory growth allowed over the 500 calls: 8 KiB a call (measured: < 0.3 MiB)
OBJECT_BOUND = 50  # new tracked objects allowed over the 500 calls: one every 10 calls (measured: 0)

TRAIN_MAX_LENGTH = TrainConfig.max_length  # 128: the main job drops longer training pairs
LONG = 10 * TRAIN_MAX_LENGTH  # 1,280 source tokens
GUARD_S = 60  # wall-clock guard for one long translation (each takes a few seconds; see the tests)


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _malloc_trim() -> None:
    """Give freed heap pages back to the system (glibc), so that resident memory counts live data only."""
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(name).malloc_trim(0)


def _resident_bytes() -> int:
    gc.collect()
    _malloc_trim()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _tracked_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


def _growth(run, start: int, stop: int) -> tuple[int, int]:
    """Resident bytes and tracked objects gained by ``run(k)`` for k in [start, stop)."""
    rss, objects = _resident_bytes(), _tracked_objects()
    for k in range(start, stop):
        run(k)
    return _resident_bytes() - rss, _tracked_objects() - objects


def _check_growth(what: str, rss: int, objects: int) -> None:
    mib, bound = rss / 2**20, RSS_BOUND >> 20
    assert rss < RSS_BOUND, f"{what}: resident memory grew {mib:.1f} MiB over {CALLS} calls (bound {bound} MiB)"
    assert objects < OBJECT_BOUND, f"{what}: {objects} more tracked objects after {CALLS} calls (bound {OBJECT_BOUND})"


@contextlib.contextmanager
def _deadline(seconds: float, what: str):
    """Raise ``TimeoutError`` in the main thread if the block runs past ``seconds`` (a hang fails the test).

    The alarm is delivered between Python bytecodes, so it interrupts the generation loop (Python) at
    the next step; a single native operation that never returned would not be interrupted.
    """

    def expire(signum, frame):
        raise TimeoutError(f"{what} ran past its {seconds:.0f} s wall-clock guard: a hang, or no length limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class NeverStop(LogitsProcessor):
    """Forbid ``</s>`` and ``<pad>``, so that every sentence runs into its length limit (the worst case)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        scores[:, [EOS, PAD]] = -1e9
        return scores


def _new_tokens(row: torch.Tensor) -> int:
    """Tokens generated for one output row (after the start token), up to and including the first ``</s>``.

    What follows is ``<pad>``, after beam search too (see test_modeling's test of the filler).
    """
    new = row[1:]
    ends = (new == EOS).nonzero()
    assert len(ends) > 0, "no </s>: the output was cut, not ended"
    n = int(ends[0]) + 1
    assert not torch.isin(new[: n - 1], torch.tensor([PAD, EOS])).any()
    assert (new[n:] == PAD).all(), "tokens other than <pad> after </s>"
    return n


# ------------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------------
def test_the_memory_probe_sees_a_leak_of_the_bound():
    """The probe is sensitive enough: keeping 16 KiB a call for 500 calls (7.8 MiB, twice the bound) shows,
    and so does keeping one object a call. Measured (5 runs): +9.36 to +9.44 MiB, +500 objects."""
    kept = []
    rss, objects = _growth(lambda k: kept.append(torch.full((4096,), float(k))), 0, CALLS)
    print(f"probe: a 7.8 MiB leak of {CALLS} tensors reads {rss / 2**20:+.2f} MiB, {objects:+d} tracked objects")
    assert rss >= 1.5 * RSS_BOUND, f"the probe saw only {rss / 2**20:.1f} MiB of a 7.8 MiB leak"
    # other objects may come and go meanwhile (once measured: +499), so the margin is the bound itself
    assert objects >= CALLS - OBJECT_BOUND > OBJECT_BOUND, f"the probe saw only {objects} of {CALLS} leaked objects"
    assert len(kept) == CALLS


def _generate_once(model, k: int) -> None:
    batch, length = 1 + k % 4, 3 + (5 * k) % 17
    input_ids = random_ids(batch, length, seed=k)
    mask = torch.ones_like(input_ids)
    if batch > 1:  # the last row is shorter: right padding, as the tokenizer gives it
        cut = max(1, length - 1 - k % 3)
        input_ids[-1, cut:] = PAD
        mask[-1, cut:] = 0
    kwargs = {"num_beams": 4 if k % 2 else 1}
    if k % 3:  # else the per-sentence limit, source length + offset (the model's offset is cut to 6)
        kwargs["max_new_tokens"] = 2 + k % 9
    out = model.generate(input_ids, attention_mask=mask, **kwargs)
    assert out.shape[0] == batch and out.shape[1] >= 2


def test_repeated_generate_does_not_leak():
    """500 ``generate`` calls (beam 4 and greedy, batch 1-4, sources of 3-19 tokens, padded rows, explicit
    and per-sentence limits) after 50 warm-up calls: resident memory must grow < 4 MiB and tracked
    objects < 50. Measured (5 runs, 2-core CPU, OMP_NUM_THREADS=1): +0.20 to +0.21 MiB and +0 objects;
    further 500-call windows in the same process: +0.00 to +0.01 MiB. About 7 s.
    """
    model = tiny_model()
    model.generation_config.source_length_offset = 6  # keep the calls without max_new_tokens short
    run = functools.partial(_generate_once, model)
    _growth(run, 0, WARMUP_CALLS)
    rss, objects = _growth(run, WARMUP_CALLS, WARMUP_CALLS + CALLS)
    print(f"generate x{CALLS}: resident memory {rss / 2**20:+.2f} MiB, tracked objects {objects:+d}")
    _check_growth("generate", rss, objects)


def test_repeated_translate_does_not_leak(valid_sentences, tokenizer):
    """500 ``evaluation.translate`` calls with the joint BPE tokenizer (1-4 sentences, batch size 1-3,
    beam 4 and greedy, explicit and per-sentence limits) after 50 warm-up calls: resident memory must
    grow < 4 MiB and tracked objects < 50. Measured (5 runs): +0.09 to +0.14 MiB and +0
    objects; further 500-call windows: +0.00 to +0.02 MiB. About 12 s.
    """
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.source_length_offset = 6
    sentences = [s for s in valid_sentences["en"] if len(tokenizer(s)["input_ids"]) <= 16][:50]
    assert len(sentences) >= 20

    def run(k: int) -> None:
        n = 1 + k % 4
        texts = [sentences[(7 * k + j) % len(sentences)] for j in range(n)]
        kwargs = {"num_beams": 4 if k % 2 else 1, "batch_size": 1 + k % 3}
        if k % 3:
            kwargs["max_new_tokens"] = 2 + k % 7
        out = translate(model, tokenizer, texts, **kwargs)
        assert len(out) == n and all(isinstance(t, str) for t in out)

    _growth(run, 0, WARMUP_CALLS)
    rss, objects = _growth(run, WARMUP_CALLS, WARMUP_CALLS + CALLS)
    print(f"translate x{CALLS}: resident memory {rss / 2**20:+.2f} MiB, tracked objects {objects:+d}")
    _check_growth("translate", rss, objects)


# ------------------------------------------------------------------------------------------------
# a source 10x the training length
# ------------------------------------------------------------------------------------------------
def test_long_source_with_sinusoidal_positions_stops_at_source_length_plus_50():
    """1,280 source tokens, ``max_position_embeddings=128``, the paper's defaults (beam 4, no length
    given: at most source length + 50 tokens), ``</s>`` forbidden so that the limit must stop it:
    exactly 1,330 new tokens, the last one ``</s>``. Measured: 3.2-3.4 s (guard 60 s).
    """
    model = tiny_model(max_position_embeddings=TRAIN_MAX_LENGTH)
    assert model.config.position_embedding_type == "sinusoidal"
    offset = model.generation_config.source_length_offset
    assert (offset, model.generation_config.num_beams) == (50, 4)
    source = random_ids(1, LONG)
    start = time.perf_counter()
    with _deadline(GUARD_S, f"generate on {LONG} tokens"):
        out = model.generate(source, logits_processor=LogitsProcessorList([NeverStop()]))
    seconds = time.perf_counter() - start
    print(f"{LONG} source tokens -> {out.shape[1] - 1} new tokens in {seconds:.1f} s")
    assert out.shape == (1, 1 + LONG + offset)
    assert _new_tokens(out[0]) == LONG + offset
    assert torch.isfinite(model(input_ids=source, decoder_input_ids=out[:, :-1]).logits).all()


def test_long_source_with_learned_positions_is_refused_and_the_output_limit_capped(caplog):
    """Learned positions stop at ``max_position_embeddings``: a 1,280-token source raises at once. A source
    that fits (100 tokens) but whose default limit (source + 50 = 150 tokens) needs more decoder positions
    than the table's 128 is capped at 128 new tokens, ending with ``</s>``, with a warning naming the limit
    (not a failure in the middle of a batch); an explicit ``max_new_tokens`` past the table still raises."""
    model = tiny_model(max_position_embeddings=TRAIN_MAX_LENGTH, position_embedding_type="learned")
    processors = LogitsProcessorList([NeverStop()])
    source = random_ids(1, 100)
    with _deadline(GUARD_S, "generate with learned positions"):
        with pytest.raises(ValueError, match=rf"{LONG} positions .*max_position_embeddings={TRAIN_MAX_LENGTH}"):
            model.generate(random_ids(1, LONG))
        with caplog.at_level("WARNING"):
            capped = model.generate(source, num_beams=1, logits_processor=processors)
        past = TRAIN_MAX_LENGTH + 1
        with pytest.raises(ValueError, match=rf"{past} positions .*max_position_embeddings={TRAIN_MAX_LENGTH}"):
            model.generate(source, num_beams=1, max_new_tokens=past, logits_processor=processors)
    assert capped.shape == (1, 1 + TRAIN_MAX_LENGTH) and capped[0, -1].item() == EOS
    assert f"max_position_embeddings={TRAIN_MAX_LENGTH}" in caplog.text


def _long_text(tokenizer, sentence: str) -> tuple[str, int]:
    """``sentence`` repeated until the text has at least ``LONG`` tokens; the text and its length."""
    per_copy = len(tokenizer(sentence, add_special_tokens=False)["input_ids"])
    text = " ".join([sentence] * math.ceil(LONG / per_copy))
    return text, len(tokenizer(text)["input_ids"])


def test_translate_a_long_repeated_sentence_within_its_bound(valid_sentences, tokenizer, monkeypatch):
    """``translate`` (paper defaults: beam 4, source length + 50) of [a 1,297-token source made by repeating
    a sentence, that sentence alone] with ``</s>`` forbidden: each sentence gets exactly its own source
    length + 50 tokens, in one padded batch, under the 60 s guard. Measured: 1,297 + 19 source
    tokens, 4.7-5.0 s.
    """
    model = tiny_model(vocab_size=len(tokenizer), max_position_embeddings=TRAIN_MAX_LENGTH)
    sentence = valid_sentences["en"][0]
    text, n_long = _long_text(tokenizer, sentence)
    n_short = len(tokenizer(sentence)["input_ids"])
    assert LONG <= n_long < LONG + 2 * n_short

    outputs = []
    generate = model.generate

    def spy(*args, **kwargs):
        kwargs["logits_processor"] = LogitsProcessorList([NeverStop()])
        outputs.append(generate(*args, **kwargs))
        return outputs[-1]

    monkeypatch.setattr(model, "generate", spy)
    start = time.perf_counter()
    with _deadline(GUARD_S, f"translate of {n_long} tokens"):
        translations = translate(model, tokenizer, [sentence, text])
    seconds = time.perf_counter() - start
    print(f"translate: {n_long} + {n_short} source tokens in {seconds:.1f} s")
    assert len(outputs) == 1  # one batch, longest first
    (generated,) = outputs
    assert generated.shape == (2, 1 + n_long + 50)
    assert [_new_tokens(row) for row in generated] == [n_long + 50, n_short + 50]
    assert len(translations) == 2 and all(isinstance(t, str) and t for t in translations)
    assert len(translations[1]) > len(translations[0])


def test_translate_refuses_a_long_source_for_learned_positions(valid_sentences, tokenizer):
    model = tiny_model(
        vocab_size=len(tokenizer), max_position_embeddings=TRAIN_MAX_LENGTH, position_embedding_type="learned"
    )
    text, n_long = _long_text(tokenizer, valid_sentences["en"][0])
    with _deadline(GUARD_S, "translate with learned positions"):
        message = rf"max_position_embeddings={TRAIN_MAX_LENGTH}\): text 1 has {n_long} tokens"
        with pytest.raises(ValueError, match=message):
            translate(model, tokenizer, ["Hello.", text])
