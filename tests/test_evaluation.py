"""Translation, sacreBLEU scoring and the hypotheses file (vanilla_transformer.evaluation)."""

import gzip
import itertools
from pathlib import Path

import huggingface_hub.constants
import pytest
import sacrebleu
from conftest import tiny_model

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


def test_translate_uses_paper_defaults(mt_model, tokenizer, corpus):
    """No overrides: beam 4, alpha 0.6, source length + 50 (the random model rarely stops early)."""
    texts = corpus["en"][:2]
    out = translate(mt_model, tokenizer, texts, progress=True)
    assert len(out) == 2 and all(isinstance(t, str) for t in out)


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


def test_translate_bf16_autocast(mt_model, tokenizer):
    out = translate(mt_model, tokenizer, ["Hello there.", "Tom is here."], num_beams=1, max_new_tokens=4, dtype="bf16")
    assert len(out) == 2


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
