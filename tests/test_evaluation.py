"""Translation, sacreBLEU scoring and the hypotheses file (vanilla_transformer.evaluation)."""

import gzip
import itertools
from pathlib import Path

import huggingface_hub.constants
import pytest
import sacrebleu
import torch
from conftest import EOS, PAD, tiny_model
from transformers import LogitsProcessor, LogitsProcessorList

from vanilla_transformer.evaluation import (
    LocalSacrebleuMetric,
    evaluate_model,
    load_sacrebleu_metric,
    score,
    translate,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "tatoeba_en_de"

HYPS = ["The cat sat on the mat.", "It is raining today!", "I don't know what you mean."]
REFS = ["The cat sat on a mat.", "It's raining today!", "I do not know what you mean."]


def _lines(name: str, n: int) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, n)]


@pytest.fixture(scope="module")
def corpus():
    return {"en": _lines("valid.en.gz", 200), "de": _lines("valid.de.gz", 200)}


@pytest.fixture(scope="module")
def tokenizer(corpus):
    from vanilla_transformer.tokenization import train_joint_bpe

    return train_joint_bpe(corpus["en"] + corpus["de"], vocab_size=400)


@pytest.fixture(scope="module")
def mt_model(tokenizer):
    return tiny_model(seed=0, vocab_size=len(tokenizer))


class NeverStop(LogitsProcessor):
    """Forbid ``</s>`` and ``<pad>``, so that every sentence runs into its length limit."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        scores[:, [EOS, PAD]] = -1e9
        return scores


def spy_on_generate(monkeypatch, model, **extra) -> list[dict]:
    """Record each ``model.generate`` call's inputs, keyword arguments and output (calling it with ``extra`` too),
    and the generation config transformers decoded with, as ``config``."""
    calls, generate, prepare = [], model.generate, model._prepare_generation_config

    def recorded_generate(input_ids, **kwargs):
        calls.append({"input_ids": input_ids, "kwargs": dict(kwargs), "autocast": torch.get_autocast_dtype("cpu")
                      if torch.is_autocast_enabled("cpu") else None})  # fmt: skip
        calls[-1]["output"] = generate(input_ids, **kwargs, **extra)
        return calls[-1]["output"]

    def recorded_prepare(*args, **kwargs):
        config, model_kwargs = prepare(*args, **kwargs)
        calls[-1]["config"] = config
        return config, model_kwargs

    monkeypatch.setattr(model, "generate", recorded_generate)
    monkeypatch.setattr(model, "_prepare_generation_config", recorded_prepare)
    return calls


# ------------------------------------------------------------------------------------------------
# score / load_sacrebleu_metric
# ------------------------------------------------------------------------------------------------
def test_score_equals_sacrebleu():
    result = score(HYPS, REFS)
    assert result["n"] == 3
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score, abs=1e-9)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score, abs=1e-9)
    assert 0 < result["bleu"] < 100
    assert "nrefs:1" in result["bleu_signature"] and "tok:13a" in result["bleu_signature"]
    assert "nrefs:1" in result["chrf_signature"]


def test_perfect_hypotheses_score_100():
    result = score(REFS, REFS)
    assert result["bleu"] == pytest.approx(100.0)
    assert result["chrf"] == pytest.approx(100.0)


def test_score_errors():
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        score(HYPS[:2], REFS)
    with pytest.raises(ValueError, match="`hypotheses` is empty"):
        score([], [])
    with pytest.raises(ValueError, match="item 1 is int"):
        score(["a", 3], ["a", "b"])


def test_local_sacrebleu_metric_matches_score():
    metric = load_sacrebleu_metric(use_hub=False)
    assert isinstance(metric, LocalSacrebleuMetric)
    result = metric.compute(predictions=HYPS, references=REFS)
    assert set(result) == {"score", "counts", "totals", "precisions", "bp", "sys_len", "ref_len"}
    assert result["score"] == pytest.approx(score(HYPS, REFS)["bleu"], abs=1e-9)
    # evaluate's list-of-references form gives the same number.
    nested = metric.compute(predictions=HYPS, references=[[r] for r in REFS])
    assert nested["score"] == pytest.approx(result["score"], abs=1e-9)


@pytest.mark.skipif(
    not huggingface_hub.constants.HF_HUB_OFFLINE, reason="would contact the Hub; run with HF_HUB_OFFLINE=1"
)
def test_load_sacrebleu_metric_offline():
    metric = load_sacrebleu_metric()  # evaluate.load fails offline (unless cached): the local fallback
    result = metric.compute(predictions=HYPS, references=REFS)
    assert result["score"] == pytest.approx(score(HYPS, REFS)["bleu"], abs=1e-9)


# ------------------------------------------------------------------------------------------------
# translate
# ------------------------------------------------------------------------------------------------
def test_translate_is_order_preserving_and_padding_invariant(mt_model, tokenizer, corpus):
    # Sentences of different lengths, so that length sorting reorders them and batches need padding.
    texts = [corpus["en"][i] for i in (0, 5, 17, 23, 42, 60)]
    assert len({len(tokenizer(t)["input_ids"]) for t in texts}) > 2
    kwargs = dict(num_beams=1, max_new_tokens=8)
    alone = [translate(mt_model, tokenizer, [t], **kwargs)[0] for t in texts]
    batched = translate(mt_model, tokenizer, texts, batch_size=4, **kwargs)  # 2 batches, the last one short
    assert batched == alone
    assert all(isinstance(t, str) for t in batched)
    by_tokens = translate(mt_model, tokenizer, texts, max_tokens=40, **kwargs)  # batches of 1-2 sentences
    assert by_tokens == alone


def test_translate_uses_paper_defaults(mt_model, tokenizer, corpus, monkeypatch):
    """No overrides: beam 4, length penalty 0.6, and at most source length + 50 tokens per sentence (§6.1).
    ``</s>`` is forbidden, so that each sentence runs into its own limit."""
    texts = [corpus["en"][0], corpus["en"][17]]
    lengths = [len(tokenizer(text)["input_ids"]) for text in texts]
    assert lengths[0] != lengths[1]
    calls = spy_on_generate(monkeypatch, mt_model, logits_processor=LogitsProcessorList([NeverStop()]))
    out = translate(mt_model, tokenizer, texts, progress=True)
    assert len(out) == 2 and all(isinstance(t, str) and t for t in out)
    (call,) = calls  # one batch
    assert not {"num_beams", "length_penalty", "max_new_tokens", "max_length"} & call["kwargs"].keys()  # the model decides
    config = call["config"]
    assert (config.num_beams, config.length_penalty, config.max_new_tokens) == (4, 0.6, max(lengths) + 50)
    generated = call["output"][:, 1:]  # after the decoder start token; the batch is longest first
    for row, length in zip(generated, sorted(lengths, reverse=True)):
        ends = (row == EOS).nonzero()
        assert len(ends) and int(ends[0]) + 1 == length + 50, "each sentence ends at its source length + 50"


def test_translate_errors(mt_model, tokenizer):
    with pytest.raises(ValueError, match="`texts` is empty"):
        translate(mt_model, tokenizer, [])
    with pytest.raises(ValueError, match="only strings: item 1 is NoneType"):
        translate(mt_model, tokenizer, ["Hello.", None])
    with pytest.raises(ValueError, match="not a single string"):
        translate(mt_model, tokenizer, "Hello.")
    with pytest.raises(ValueError, match="Tokenizer and model config do not match"):
        translate(tiny_model(), tokenizer, ["Hello."])  # vocab_size=61 < len(tokenizer)


def test_translate_rejects_sources_longer_than_learned_positions(tokenizer):
    model = tiny_model(vocab_size=len(tokenizer), position_embedding_type="learned", max_position_embeddings=8)
    with pytest.raises(ValueError, match=r"text 1 has \d+ tokens.*max_position_embeddings=8"):
        translate(model, tokenizer, ["Hi.", "This sentence is clearly longer than eight tokens, is it not?"])


def test_translate_under_bf16_autocast_decodes_as_fp32_does_up_to_rounding(mt_model, tokenizer, corpus, monkeypatch):
    """Greedy decoding of 20 sentences with ``dtype="bf16"`` runs under bf16 autocast. Where it picks another token
    than fp32 would (bf16 keeps 8 significant bits), fp32 rates bf16's token within 0.05 nats of its own choice.
    Measured: 1 of 160 steps differs, by 0.007 nats, and 19 of the 20 translations are the same text."""
    texts, kwargs = corpus["en"][:20], dict(num_beams=1, max_new_tokens=8)
    calls = spy_on_generate(monkeypatch, mt_model)
    bf16 = translate(mt_model, tokenizer, texts, dtype="bf16", **kwargs)
    fp32 = translate(mt_model, tokenizer, texts, **kwargs)
    (call, fp32_call) = calls
    assert call["autocast"] == torch.bfloat16 and fp32_call["autocast"] is None
    generated, source = call["output"], call["input_ids"]
    with torch.no_grad():  # fp32's log-probabilities along bf16's translations
        log_probs = mt_model(input_ids=source, attention_mask=(source != PAD).long(),
                             decoder_input_ids=generated[:, :-1]).logits.log_softmax(-1)  # fmt: skip
    chosen = log_probs.gather(-1, generated[:, 1:, None])[..., 0]
    ended = (generated[:, 1:] == EOS).long()
    decoded = ended.cumsum(-1) - ended == 0  # up to and including each row's </s>; padding after it
    gaps = (log_probs.max(-1).values - chosen)[decoded]
    assert gaps.max().item() < 0.05, gaps.max().item()
    assert sum(a == b for a, b in zip(bf16, fp32)) >= len(texts) // 2


# ------------------------------------------------------------------------------------------------
# evaluate_model
# ------------------------------------------------------------------------------------------------
def test_evaluate_model_writes_one_line_per_sentence(mt_model, tokenizer, corpus, tmp_path):
    sources, references = corpus["en"][:7], corpus["de"][:7]
    path = tmp_path / "out" / "hyps.de"
    result = evaluate_model(
        mt_model, tokenizer, sources, references, hypotheses_path=path, batch_size=3, num_beams=1, max_new_tokens=6
    )
    assert {"bleu", "bleu_signature", "chrf", "chrf_signature", "n", "seconds"} <= result.keys()
    assert result["n"] == 7 and result["seconds"] > 0
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and len(text.splitlines()) == 7
    assert [p.name for p in path.parent.iterdir()] == ["hyps.de"]  # no temporary file left behind
    hyps = translate(mt_model, tokenizer, sources, num_beams=1, max_new_tokens=6)
    assert result["bleu"] == pytest.approx(score(hyps, references)["bleu"])
    with pytest.raises(ValueError, match="7 sources but 6 references"):
        evaluate_model(mt_model, tokenizer, sources, references[:6])


def test_hypotheses_file_keeps_one_line_per_sentence_despite_line_breaks(tmp_path):
    """A random model can emit '\r' or other line-break bytes; the file must still have n lines."""
    from vanilla_transformer.evaluation import _write_lines_atomically

    path = tmp_path / "hyps.txt"
    _write_lines_atomically(path, ["a\rb", "c\nd", "e\u2028f", "", "Grüße"])
    text = path.read_text(encoding="utf-8")
    assert text.splitlines() == ["a b", "c d", "e f", "", "Grüße"]
    with open(path, encoding="utf-8") as f:
        assert len(f.readlines()) == 5


# ------------------------------------------------------------------------------------------------
# translate_candidates
# ------------------------------------------------------------------------------------------------
from vanilla_transformer.evaluation import translate_candidates  # noqa: E402


def teacher_forced_log_probabilities(model, tokenizer, source: str, ids: list[int]) -> torch.Tensor:
    """log p(y_t | y_<t, x) of each token of ``ids`` under the model, from one forward pass."""
    input_ids = tokenizer([source], return_tensors="pt")["input_ids"]
    decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, *ids[:-1]]])
    with torch.no_grad():
        log_probs = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits[0].log_softmax(-1)
    return log_probs[torch.arange(len(ids)), ids]


def test_translate_candidates_are_the_beams_hypotheses_ranked_by_length_normalised_log_probability(tokenizer, corpus):
    model, source = tiny_model(seed=0, vocab_size=len(tokenizer)), corpus["en"][3]
    # An untrained model repeats one token and never stops: give </s> almost that token's embedding (tied to the
    # output layer), so that beam search finishes candidates of several lengths.
    greedy = translate_candidates(model, tokenizer, source, num_beams=1, max_new_tokens=12)[0]
    repeated = max(set(greedy["token_ids"]), key=greedy["token_ids"].count)
    with torch.no_grad():
        model.model.shared.weight[EOS] = 0.999 * model.model.shared.weight[repeated]

    best_lengths = {}
    for alpha in (0.0, 0.6, 2.0):
        candidates = translate_candidates(model, tokenizer, source, num_beams=4, length_penalty=alpha, max_new_tokens=12)
        assert len(candidates) == 4
        assert candidates[0]["text"] == translate(model, tokenizer, [source], num_beams=4, length_penalty=alpha,
                                                  max_new_tokens=12)[0]  # fmt: skip
        scores = [c["score"] for c in candidates]
        assert scores == sorted(scores, reverse=True)
        for c in candidates:
            assert c["length"] == len(c["token_ids"]) == len(c["tokens"]) == len(c["token_log_probabilities"])
            assert c["tokens"] == tokenizer.convert_ids_to_tokens(c["token_ids"])
            assert c["text"] == tokenizer.decode(c["token_ids"], skip_special_tokens=True)
            # transformers' score: the summed log-probabilities over length ** alpha (</s> counted, <s> not)
            assert c["score"] == pytest.approx(c["log_probability"] / c["length"] ** alpha, rel=1e-5)
            expected = teacher_forced_log_probabilities(model, tokenizer, source, c["token_ids"])
            torch.testing.assert_close(torch.tensor(c["token_log_probabilities"]), expected, rtol=0, atol=1e-4)
            assert c["log_probability"] == pytest.approx(float(expected.sum()), abs=1e-3)
        if alpha == 0.6:
            assert len({c["length"] for c in candidates}) > 1 and candidates[0]["token_ids"][-1] == EOS
            two = translate_candidates(model, tokenizer, source, num_beams=4, length_penalty=alpha,
                                       num_return_sequences=2, max_new_tokens=12)  # fmt: skip
            assert [c["token_ids"] for c in two] == [c["token_ids"] for c in candidates[:2]]
        best_lengths[alpha] = candidates[0]["length"]
    assert best_lengths[2.0] > best_lengths[0.0]  # a larger α favours longer candidates

    (only,) = translate_candidates(model, tokenizer, source, num_beams=1, max_new_tokens=12)
    assert only["text"] == translate(model, tokenizer, [source], num_beams=1, max_new_tokens=12)[0]
    assert only["score"] == only["log_probability"]  # greedy decoding has no length penalty


def test_translate_candidates_errors(mt_model, tokenizer):
    with pytest.raises(ValueError, match="one non-empty sentence"):
        translate_candidates(mt_model, tokenizer, "  ")
    with pytest.raises(ValueError, match="one non-empty sentence"):
        translate_candidates(mt_model, tokenizer, ["Hello."])
    with pytest.raises(ValueError, match=r"num_return_sequences must be an integer from 1 to num_beams=4.*got 5"):
        translate_candidates(mt_model, tokenizer, "Hello.", num_return_sequences=5)
    with pytest.raises(ValueError, match="num_beams must be a positive integer"):
        translate_candidates(mt_model, tokenizer, "Hello.", num_beams=0)
    with pytest.raises(ValueError, match="Tokenizer and model config do not match"):
        translate_candidates(tiny_model(), tokenizer, "Hello.")
