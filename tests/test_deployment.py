"""The CTranslate2 export and engine (vanilla_transformer.deployment): same numbers, same tokens, same limits."""

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import EOS, PAD, bundled_lines, tiny_model

from vanilla_transformer import deployment
from vanilla_transformer.cli import main
from vanilla_transformer.evaluation import (
    TransformersTranslator,
    evaluate_model,
    evaluate_translator,
    translate,
    translate_with,
)
from vanilla_transformer.tokenization import train_joint_bpe

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason="the ctranslate2 extra is not installed (pip install '.[ctranslate2]')"
)
from vanilla_transformer.deployment import CTranslate2Translator, export_ctranslate2  # noqa: E402


@pytest.fixture(scope="module")
def pairs():
    return {"de": bundled_lines("train.de.gz", 1500), "en": bundled_lines("train.en.gz", 1500)}


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_joint_bpe(pairs["de"] + pairs["en"], vocab_size=500)


@pytest.fixture(scope="module")
def trained(tokenizer, pairs):
    """A tiny model trained for a few seconds: it has learnt to end its sentences, so they end before the limit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # matrices this small gain nothing from a second thread
    torch.manual_seed(0)
    model = tiny_model(seed=0, vocab_size=len(tokenizer), d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(150):
        rows = slice((step * 32) % 1472, (step * 32) % 1472 + 32)
        source = tokenizer(pairs["de"][rows], padding=True, return_tensors="pt")
        labels = tokenizer(text_target=pairs["en"][rows], padding=True, return_tensors="pt")["input_ids"]
        loss = model(**source, labels=labels.masked_fill(labels == PAD, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.set_num_threads(threads)
    return model.eval()


def save(model, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def exported(trained, tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    export_ctranslate2(save(trained, tokenizer, root / "model"), root / "float32")
    return CTranslate2Translator(root / "float32")


def generated_ids(model, tokenizer, texts: list[str], **kwargs) -> list[list[int]]:
    """``generate``'s tokens for a padded batch, without the start token, and up to the first </s>."""
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        sequences = model.generate(**batch, **kwargs)
    return [
        row[1:].tolist()[: row[1:].tolist().index(EOS)] if EOS in row[1:] else row[1:].tolist() for row in sequences
    ]


def test_the_export_computes_the_models_log_probabilities(trained, tokenizer, exported):
    """Every weight, the positions (interleaved sinusoids), × √d_model, post-LN and its epsilon: CTranslate2 scores a
    translation with the same per-token log-probabilities as the model."""
    sources, targets = bundled_lines("valid.de.gz", 6), bundled_lines("valid.en.gz", 6)
    results = exported.translator.score_batch(
        [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(sources)["input_ids"]],
        [tokenizer.tokenize(text) for text in targets],
    )
    for source, target, result in zip(sources, targets, results):
        labels = tokenizer(text_target=[target], return_tensors="pt")["input_ids"]  # ends with </s>
        with torch.no_grad():
            logits = trained(**tokenizer([source], return_tensors="pt"), labels=labels).logits
        expected = logits.log_softmax(-1)[0].gather(-1, labels[0, :, None])[:, 0]
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "flags",
    [
        {"norm_first": True},
        {"position_embedding_type": "learned"},
        {"scale_embedding": False},
        {"tie_word_embeddings": False},
        {"encoder_layers": 1, "decoder_attention_heads": 2, "layer_norm_eps": 1e-3},
        {"head_dim": 4},
        {"head_dim": 16},
        {"encoder_attention_heads": 3, "decoder_attention_heads": 5, "head_dim": 12},
        {"attention_bias": True},
    ],
    ids=[
        "pre-LN",
        "learned positions",
        "no embedding scale",
        "untied embeddings",
        "uneven sizes",
        "4 heads of 4",
        "4 heads of 16",
        "3 and 5 heads of 12",
        "attention biases",
    ],
)
def test_every_configuration_flag_exports_exactly(flags, tokenizer, tmp_path):
    model = tiny_model(seed=1, vocab_size=len(tokenizer), **flags)
    torch.nn.init.normal_(model.lm_head.weight, std=0.3)  # untied: differs from the embedding (tied: the same tensor)
    for norm in (m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)):
        torch.nn.init.normal_(norm.weight, 1.0, 0.2), torch.nn.init.normal_(norm.bias, 0.0, 0.2)
    for name, linear in model.named_modules():  # attention biases start at zero: make them count
        if name.endswith("_proj") and linear.bias is not None:
            torch.nn.init.normal_(linear.bias, 0.0, 0.2)
    engine = CTranslate2Translator(export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "export"))
    source, target = "Ich habe Hunger.", "I am hungry."
    result = engine.translator.score_batch(
        [tokenizer.convert_ids_to_tokens(tokenizer(source)["input_ids"])], [tokenizer.tokenize(target)]
    )[0]
    labels = tokenizer(text_target=[target], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(**tokenizer([source], return_tensors="pt"), labels=labels).logits
    expected = logits.log_softmax(-1)[0].gather(-1, labels[0, :, None])[:, 0]
    torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=2e-4, rtol=1e-4)


def test_the_engine_reads_the_tokens_of_the_ids_whatever_the_tokenizer_did_before(exported):
    """translate_ids takes the tokens from the fast tokenizer's encodings: those of the ids, unpadded even right
    after a padded call (which leaves padding switched on in the Rust tokenizer)."""
    texts = [*bundled_lines("test.de.gz", 50), "", "  zwei  Leerzeichen ", "Größe: 5 €, naïve ½ 😀", "a\tb"]
    tokenizer = exported.tokenizer
    expected = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]
    assert all(tokens[-1] == tokenizer.eos_token for tokens in expected)
    tokenizer(texts, padding=True)
    assert tokenizer.backend_tokenizer.padding is not None  # what reading the Rust tokenizer directly would pad
    assert [e.tokens for e in tokenizer(texts, add_special_tokens=True).encodings] == expected
    tokenizer(texts, padding=True)
    assert exported.translate_ids(texts[:8], num_beams=1) == exported.translate_ids(
        texts[:8], num_beams=1, batch_size=1
    )


def test_greedy_and_beam_search_give_generates_tokens_on_a_padded_batch(trained, tokenizer, exported):
    texts = bundled_lines("test.de.gz", 24)  # lengths differ: generate pads, the engine groups
    assert len({len(ids) for ids in tokenizer(texts)["input_ids"]}) > 5
    assert exported.translate_ids(texts, num_beams=1) == generated_ids(trained, tokenizer, texts, num_beams=1)
    # Beam 4 with the paper's α = 0.6: the same formula, and the same stopping rule when transformers stops
    # a sentence once num_beams hypotheses have finished (early_stopping=True), as CTranslate2 does.
    assert exported.translate_ids(texts, num_beams=4, length_penalty=0.6) == generated_ids(
        trained, tokenizer, texts, num_beams=4, length_penalty=0.6, early_stopping=True
    )
    # Without a length penalty, transformers' default stopping rule finds the same best hypothesis.
    assert exported.translate_ids(texts, num_beams=4, length_penalty=0.0) == generated_ids(
        trained, tokenizer, texts, num_beams=4, length_penalty=0.0
    )
    # Text out: the same strings as the default engine, through the same interface.
    ours = TransformersTranslator(trained, tokenizer)
    assert translate_with(exported, texts[:6], num_beams=1) == translate_with(ours, texts[:6], num_beams=1)
    assert translate_with(exported, texts[:6], num_beams=1) == translate(trained, tokenizer, texts[:6], num_beams=1)


def test_each_sentence_keeps_its_own_length_limit(tokenizer, tmp_path):
    """An untrained model never stops: each output must end at its own source length + offset (</s> included)."""
    model = tiny_model(seed=2, vocab_size=len(tokenizer))
    model.generation_config.source_length_offset = 3
    engine = CTranslate2Translator(export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "export"))
    texts = bundled_lines("test.de.gz", 16)
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    assert len(set(lengths)) > 5
    for num_beams in (1, 4):
        ids = engine.translate_ids(texts, num_beams=num_beams, length_penalty=0.0, batch_size=16)
        assert [len(row) for row in ids] == [n + 3 - 1 for n in lengths]  # and then the </s>
        assert ids == generated_ids(model, tokenizer, texts, num_beams=num_beams, length_penalty=0.0)
        # Alone or in a batch of other lengths, a sentence gets the same translation (with α = 0.6 too).
        batched = engine.translate_ids(texts, num_beams=num_beams, length_penalty=0.6, batch_size=16)
        assert batched == [engine.translate_ids([text], num_beams=num_beams, length_penalty=0.6)[0] for text in texts]
        if num_beams > 1:  # every search ran into its limit: each sentence was decoded again with its own,
            # except those whose limit the batch ran with (the most common one): their search was already exact
            engine.translate_ids(texts, num_beams=num_beams, length_penalty=0.6, batch_size=16)
            assert engine.redecoded == len(texts) - max(Counter(lengths).values()) > 0
            assert batched == engine.translate_ids(texts, num_beams=num_beams, length_penalty=0.6, group_by_limit=True)
    assert [len(row) for row in engine.translate_ids(texts, max_new_tokens=5)] == [4] * len(texts)


def test_batches_decoded_at_once_give_the_tokens_of_one_batch_at_a_time(tokenizer, tmp_path):
    """On a CPU, ``threads // threads_per_batch`` workers decode queued batches in parallel; the tokens are those
    of one worker, for greedy and beam search, the second decoding of sentences near their limit included."""
    model = tiny_model(seed=2, vocab_size=len(tokenizer))
    model.generation_config.source_length_offset = 3  # an untrained model runs into every limit
    folder = export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "export")
    texts = bundled_lines("test.de.gz", 24)
    engines = {
        (1, 1): CTranslate2Translator(folder, threads=1),
        (2, 1): CTranslate2Translator(folder, threads=2),
        (2, 2): CTranslate2Translator(folder, threads=2, threads_per_batch=2),
    }
    assert {layout: engine.translator.num_translators for layout, engine in engines.items()} == {
        (1, 1): 1,
        (2, 1): 2,
        (2, 2): 1,
    }
    for num_beams in (1, 4):
        ids = {
            layout: engine.translate_ids(texts, num_beams=num_beams, length_penalty=0.6, batch_size=4)
            for layout, engine in engines.items()
        }
        assert ids[(2, 1)] == ids[(1, 1)] == ids[(2, 2)]
        assert engines[(2, 1)].redecoded == engines[(1, 1)].redecoded == engines[(2, 2)].redecoded
        assert (engines[(2, 1)].redecoded > 0) == (num_beams > 1)
    for bad in ({"threads": -1}, {"threads": True}, {"threads_per_batch": 0}, {"threads_per_batch": 1.5}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be an integer of at least"):
            CTranslate2Translator(folder, **bad)


def test_beam_batches_mix_source_lengths_and_give_the_one_limit_paths_tokens(trained, tokenizer, tmp_path):
    """Beam batches are formed whatever the source lengths; a sentence whose search came near its own limit is
    decoded again with it. A small length offset makes some sentences reach their limit and others not: the
    tokens are those of batches that hold one limit each, and only the sentences near their limit ran twice."""
    model = save(trained, tokenizer, tmp_path / "model")
    generation = json.loads((model / "generation_config.json").read_text())
    texts = bundled_lines("test.de.gz", 64)
    # the largest offset at which some outputs, not all, reach their limit (it depends on the CPU's arithmetic)
    for offset in (4, 3, 2, 1):
        (model / "generation_config.json").write_text(json.dumps({**generation, "source_length_offset": offset}))
        engine = CTranslate2Translator(export_ctranslate2(model, tmp_path / f"export-{offset}"))
        exact = engine.translate_ids(texts, num_beams=4, length_penalty=0.6, batch_size=16, group_by_limit=True)
        limits = [len(ids) + offset for ids in tokenizer(texts)["input_ids"]]
        reached = sum(len(row) == limit - 1 for row, limit in zip(exact, limits))
        if 0 < reached < len(texts):
            break
    else:
        pytest.fail("no length offset of 1-4 makes some outputs, and not all, reach their limit")
    fast = engine.translate_ids(texts, num_beams=4, length_penalty=0.6, batch_size=16)
    assert 0 < engine.redecoded < len(texts)
    assert fast == exact
    assert all(len(row) <= limit - 1 for row, limit in zip(fast, limits))


def test_the_position_table_has_the_chosen_length_and_longer_inputs_are_refused(trained, tokenizer, tmp_path):
    folder = save(trained, tokenizer, tmp_path / "model")
    engine = CTranslate2Translator(export_ctranslate2(folder, tmp_path / "export", max_positions=20))
    assert engine.translator  # loads
    short, long = "Ja.", "Tom hat das Buch gestern in der Bibliothek gelassen, weil er es nicht mehr lesen wollte."
    assert len(tokenizer(long)["input_ids"]) > 20
    with pytest.raises(ValueError, match=r"longer than this export's position table \(20 positions\).*--max-positions"):
        engine.translate([short, long])
    with pytest.raises(ValueError, match=r"source length \+ 50.*--max-positions"):
        engine.translate([short])  # 3 tokens + 50 may run past the 20 positions
    assert len(engine.translate_ids([short], max_new_tokens=10)) == 1
    with pytest.raises(ValueError, match="at least 2"):
        export_ctranslate2(folder, tmp_path / "other", max_positions=1)


def test_a_learned_table_cannot_be_made_longer(tokenizer, tmp_path):
    model = tiny_model(vocab_size=len(tokenizer), position_embedding_type="learned")  # 64 learned positions
    with pytest.raises(ValueError, match="learned position table"):
        export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "export", max_positions=100)
    assert not (tmp_path / "export").exists()


def test_a_setting_the_export_does_not_know_is_refused_by_name(tokenizer, tmp_path):
    model = tiny_model(vocab_size=len(tokenizer))
    model.config.rotary_positions = True  # as a newer version of the model might add
    with pytest.raises(ValueError, match=r"rotary_positions=True.*default engine"):
        export_ctranslate2(save(model, tokenizer, tmp_path / "model"), tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_an_existing_export_is_replaced_only_when_asked(trained, tokenizer, tmp_path):
    folder = save(trained, tokenizer, tmp_path / "model")
    export_ctranslate2(folder, tmp_path / "export")
    with pytest.raises(ValueError, match="--force"):
        export_ctranslate2(folder, tmp_path / "export", quantization="int8")
    export_ctranslate2(folder, tmp_path / "export", quantization="int8", force=True)
    assert json.loads((tmp_path / "export" / deployment.EXPORT_FILE).read_text())["quantization"] == "int8"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left


def test_int8_export_is_smaller_close_to_float32_and_translates(trained, tokenizer, exported, tmp_path):
    folder = save(trained, tokenizer, tmp_path / "model")
    engine = CTranslate2Translator(export_ctranslate2(folder, tmp_path / "int8", quantization="int8"))
    assert (tmp_path / "int8" / "model.bin").stat().st_size < 0.5 * (exported.folder / "model.bin").stat().st_size
    sources, targets = bundled_lines("valid.de.gz", 8), bundled_lines("valid.en.gz", 8)
    batch = (
        [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(sources)["input_ids"]],
        [tokenizer.tokenize(text) for text in targets],
    )
    float32 = torch.cat([torch.tensor(r.log_probs) for r in exported.translator.score_batch(*batch)])
    int8 = torch.cat([torch.tensor(r.log_probs) for r in engine.translator.score_batch(*batch)])
    assert not torch.equal(int8, float32) and (int8 - float32).abs().mean() < 0.05 * float32.abs().mean()
    assert all(engine.translate(bundled_lines("test.de.gz", 4)))


def test_the_command_line_exports_and_translates_with_either_engine(trained, tokenizer, tmp_path, capsys):
    folder = save(trained, tokenizer, tmp_path / "model")
    assert main(["export", "--model_name_or_path", str(folder), "--output-dir", str(tmp_path / "export")]) == 0
    texts = bundled_lines("test.de.gz", 4)
    outputs = {}
    for engine, model in (("transformers", folder), ("ctranslate2", tmp_path / "export")):
        capsys.readouterr()
        assert (
            main(["translate", "--model_name_or_path", str(model), "--engine", engine, "--num_beams", "1", *texts]) == 0
        )
        outputs[engine] = capsys.readouterr().out
    assert outputs["ctranslate2"] == outputs["transformers"] and len(outputs["transformers"].splitlines()) == 4

    source, reference = tmp_path / "src.de", tmp_path / "ref.en"
    source.write_text("\n".join(texts) + "\n"), reference.write_text("\n".join(bundled_lines("test.en.gz", 4)) + "\n")
    for engine, model in (("transformers", folder), ("ctranslate2", tmp_path / "export")):
        args = [
            "evaluate",
            "--model_name_or_path",
            str(model),
            "--engine",
            engine,
            "--source",
            str(source),
            "--reference",
            str(reference),
        ]
        assert main([*args, "--output", str(tmp_path / f"{engine}.txt"), "--length_penalty", "0"]) == 0
    assert (tmp_path / "ctranslate2.txt").read_text() == (tmp_path / "transformers.txt").read_text()


def test_the_engine_refuses_a_model_folder_that_was_not_exported(trained, tokenizer, tmp_path, capsys):
    folder = save(trained, tokenizer, tmp_path / "model")
    with pytest.raises(ValueError, match="export it first with `vanilla-transformer export"):
        CTranslate2Translator(folder)
    engine = CTranslate2Translator(export_ctranslate2(folder, tmp_path / "e"))
    with pytest.raises(ValueError, match="is not a transformers model.*translate_with / evaluate_translator"):
        evaluate_model(engine, None, ["Ja."], ["Yes."])  # an engine is evaluated as it is, without a tokenizer
    with pytest.raises(TypeError, match="dtype"):  # set when exporting and loading, not an option of translate
        evaluate_translator(engine, ["Ja."], ["Yes."], dtype="bf16")


def test_without_ctranslate2_the_commands_say_how_to_install_it(trained, tokenizer, tmp_path, monkeypatch, capsys):
    folder = save(trained, tokenizer, tmp_path / "model")
    monkeypatch.setattr(deployment, "ctranslate2", None)
    assert main(["export", "--model_name_or_path", str(folder), "--output_dir", str(tmp_path / "export")]) == 1
    err = capsys.readouterr().err
    assert "[ctranslate2]'" in err and "Traceback" not in err
    assert main(["translate", "--model_name_or_path", str(folder), "--engine", "ctranslate2", "Ja."]) == 1
    assert "[ctranslate2]'" in capsys.readouterr().err


def test_gnmt_length_penalty_in_an_export_is_named_as_what_the_engine_does_not_compute(exported, monkeypatch):
    """CTranslate2 ranks beams by log P / |Y|^α only: an export whose generation_config.json asks for GNMT's penalty
    says so once, for beam search with α ≠ 0, and decodes as with |Y|^α."""
    texts = bundled_lines("test.de.gz", 6)
    expected = exported.translate_ids(texts, num_beams=4)
    lines = []
    monkeypatch.setattr(deployment.logger, "warning_once", lambda message: lines.append(message))
    monkeypatch.setattr(exported.generation_config, "length_penalty_form", "gnmt", raising=False)
    exported.translate_ids(texts, num_beams=1)
    exported.translate_ids(texts, num_beams=4, length_penalty=0.0)
    assert lines == []
    assert exported.translate_ids(texts, num_beams=4) == expected
    assert len(lines) == 1 and "GNMT's length penalty" in lines[0] and "--engine transformers" in lines[0]
