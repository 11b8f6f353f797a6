"""Translation, sacreBLEU scoring and the hypotheses file (vanilla_transformer.evaluation)."""

import math

import huggingface_hub.constants
import pytest
import sacrebleu
import torch
from conftest import EOS, PAD, tiny_model
from helpers.sacrebleu_metric import LocalSacrebleuMetric, load_sacrebleu_metric
from transformers import LogitsProcessor, LogitsProcessorList

from vanilla_transformer.evaluation import (
    TransformersTranslator,
    evaluate_model,
    evaluate_translator,
    perplexity,
    score,
    translate,
    translate_with,
)

HYPS = ["The cat sat on the mat.", "It is raining today!", "I don't know what you mean."]
REFS = ["The cat sat on a mat.", "It's raining today!", "I do not know what you mean."]


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
        calls.append(
            {
                "input_ids": input_ids,
                "kwargs": dict(kwargs),
                "autocast": torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None,
            }
        )
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
# score, and evaluate's sacrebleu metric (tests/helpers/sacrebleu_metric.py offline)
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
def test_translate_is_order_preserving_and_padding_invariant(mt_model, tokenizer, valid_sentences):
    # Sentences of different lengths, so that length sorting reorders them and batches need padding.
    texts = [valid_sentences["en"][i] for i in (0, 5, 17, 23, 42, 60)]
    assert len({len(tokenizer(t)["input_ids"]) for t in texts}) > 2
    kwargs = dict(num_beams=1, max_new_tokens=8)
    alone = [translate(mt_model, tokenizer, [t], **kwargs)[0] for t in texts]
    batched = translate(mt_model, tokenizer, texts, batch_size=4, **kwargs)  # 2 batches, the last one short
    assert batched == alone
    assert all(isinstance(t, str) for t in batched)
    by_tokens = translate(mt_model, tokenizer, texts, max_tokens=40, **kwargs)  # batches of 1-2 sentences
    assert by_tokens == alone


def test_translate_uses_paper_defaults(mt_model, tokenizer, valid_sentences, monkeypatch):
    """No overrides: beam 4, length penalty 0.6, and at most source length + 50 tokens per sentence (§6.1).
    ``</s>`` is forbidden, so that each sentence runs into its own limit."""
    texts = [valid_sentences["en"][0], valid_sentences["en"][17]]
    lengths = [len(tokenizer(text)["input_ids"]) for text in texts]
    assert lengths[0] != lengths[1]
    calls = spy_on_generate(monkeypatch, mt_model, logits_processor=LogitsProcessorList([NeverStop()]))
    out = translate(mt_model, tokenizer, texts, progress=True)
    assert len(out) == 2 and all(isinstance(t, str) and t for t in out)
    (call,) = calls  # one batch
    assert (
        not {"num_beams", "length_penalty", "max_new_tokens", "max_length"} & call["kwargs"].keys()
    )  # the model decides
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
    with pytest.raises(ValueError, match=r"max_position_embeddings=8\): text 1 has \d+ tokens"):
        translate(model, tokenizer, ["Hi.", "This sentence is clearly longer than eight tokens, is it not?"])


def test_translate_under_bf16_autocast_decodes_as_fp32_does_up_to_rounding(
    mt_model, tokenizer, valid_sentences, monkeypatch
):
    """Greedy decoding of 20 sentences with ``dtype="bf16"`` runs under bf16 autocast. Where it picks another token
    than fp32 would (bf16 keeps 8 significant bits), fp32 rates bf16's token within 0.05 nats of its own choice.
    Measured: 1 of 160 steps differs, by 0.007 nats, and 19 of the 20 translations are the same text."""
    texts, kwargs = valid_sentences["en"][:20], dict(num_beams=1, max_new_tokens=8)
    calls = spy_on_generate(monkeypatch, mt_model)
    bf16 = translate(mt_model, tokenizer, texts, dtype="bf16", **kwargs)
    fp32 = translate(mt_model, tokenizer, texts, **kwargs)
    (call, fp32_call) = calls
    assert call["autocast"] == torch.bfloat16 and fp32_call["autocast"] is None
    generated, source = call["output"], call["input_ids"]
    with torch.no_grad():  # fp32's log-probabilities along bf16's translations
        log_probs = mt_model(
            input_ids=source, attention_mask=(source != PAD).long(), decoder_input_ids=generated[:, :-1]
        ).logits.log_softmax(-1)
    chosen = log_probs.gather(-1, generated[:, 1:, None])[..., 0]
    ended = (generated[:, 1:] == EOS).long()
    decoded = ended.cumsum(-1) - ended == 0  # up to and including each row's </s>; padding after it
    gaps = (log_probs.max(-1).values - chosen)[decoded]
    assert gaps.max().item() < 0.05, gaps.max().item()
    assert sum(a == b for a, b in zip(bf16, fp32)) >= len(texts) // 2


# ------------------------------------------------------------------------------------------------
# evaluate_model
# ------------------------------------------------------------------------------------------------
def test_evaluate_model_writes_one_line_per_sentence(mt_model, tokenizer, valid_sentences, tmp_path):
    sources, references = valid_sentences["en"][:7], valid_sentences["de"][:7]
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


class Scripted:
    """A translation engine that is not a transformers model: it implements only ``translate``, and records calls."""

    def __init__(self, outputs: dict[str, str]):
        self.outputs, self.calls = outputs, []

    def translate(
        self, texts, *, batch_size=32, num_beams=None, length_penalty=None, max_new_tokens=None, progress=False
    ):
        self.calls.append({"texts": list(texts), "batch_size": batch_size, "num_beams": num_beams})
        return [self.outputs[text] for text in texts]


def test_hypotheses_file_keeps_one_line_per_sentence_despite_line_breaks(tmp_path):
    """An engine can emit '\r' or other line-break characters; the file must still have one line per sentence."""
    outputs = {"1": "a\rb", "2": "c\nd", "3": "e\u2028f", "4": "Grüße"}
    path = tmp_path / "hyps.txt"
    evaluate_translator(Scripted(outputs), ["1", "2", "3", " ", "4"], ["x"] * 5, hypotheses_path=path)
    text = path.read_text(encoding="utf-8")
    assert text.splitlines() == ["a b", "c d", "e f", "", "Grüße"]
    with open(path, encoding="utf-8") as f:
        assert len(f.readlines()) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["hyps.txt"]  # no temporary file left behind


# ------------------------------------------------------------------------------------------------
# the translation interface: any engine with translate(texts, ...)
# ------------------------------------------------------------------------------------------------
def test_evaluation_takes_any_engine_that_implements_translate():
    engine = Scripted({"Hallo.": "Hello.", "Ja.": "Yes."})
    result = evaluate_translator(engine, ["Hallo.", "", "Ja."], ["Hello.", "", "No."], batch_size=2, num_beams=3)
    assert result["bleu"] == pytest.approx(score(["Hello.", "", "Yes."], ["Hello.", "", "No."])["bleu"])
    # the blank sentence never reaches the engine and gives an empty translation; options reach it unchanged
    assert engine.calls == [{"texts": ["Hallo.", "Ja."], "batch_size": 2, "num_beams": 3}]
    assert translate_with(engine, [" ", "Ja."]) == ["", "Yes."]
    with pytest.raises(ValueError, match="`texts` is empty"):
        translate_with(engine, [])
    with pytest.raises(TypeError, match="has no translate"):
        translate_with(object(), ["Ja."])


def test_the_transformers_engine_translates_as_translate_does(mt_model, tokenizer, valid_sentences):
    texts = valid_sentences["en"][:5]
    engine = TransformersTranslator(mt_model, tokenizer, max_tokens=30)
    expected = translate(mt_model, tokenizer, texts, max_tokens=30, num_beams=2, max_new_tokens=6)
    assert engine.translate(texts, num_beams=2, max_new_tokens=6) == expected
    assert translate_with(engine, texts, num_beams=2, max_new_tokens=6) == expected
    with pytest.raises(ValueError, match="is not a transformers model"):
        TransformersTranslator(Scripted({}), None)


# ------------------------------------------------------------------------------------------------
# perplexity
# ------------------------------------------------------------------------------------------------
def test_perplexity_is_the_token_mean_of_the_teacher_forced_cross_entropy(mt_model, tokenizer, valid_sentences):
    """Batched by length with padding, it equals the per-pair losses summed one by one, divided by the tokens."""
    sources = tokenizer(valid_sentences["en"][:9])["input_ids"]
    targets = tokenizer(text_target=valid_sentences["de"][:9])["input_ids"]
    result = perplexity(mt_model, sources, targets, pad_token_id=tokenizer.pad_token_id, max_tokens=60)
    nll = smoothed = 0.0
    with torch.no_grad():
        for source, target in zip(sources, targets):
            out = mt_model(input_ids=torch.tensor([source]), labels=torch.tensor([target]), smoothing=0.1)
            nll += float(out.nll_loss) * len(target)
            smoothed += float(out.loss) * len(target)
    tokens = sum(map(len, targets))
    assert result["target_tokens"] == tokens
    assert result["nll"] == pytest.approx(nll / tokens, rel=1e-5) == pytest.approx(result["loss"], rel=1e-6)
    assert result["ppl"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)
    smoothed_result = perplexity(
        mt_model, sources, targets, pad_token_id=tokenizer.pad_token_id, max_tokens=60, label_smoothing=0.1
    )
    assert smoothed_result["loss"] == pytest.approx(smoothed / tokens, rel=1e-5)
    assert smoothed_result["nll"] == pytest.approx(result["nll"], rel=1e-6)
    assert not mt_model.training
