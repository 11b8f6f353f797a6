"""The benchmark scripts run (tiny sizes, one repeat) so that they cannot rot."""

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bf16_curve  # noqa: E402
import speed  # noqa: E402
import trainer_speed  # noqa: E402


def test_flop_formula_counts_linear_layers_and_attention():
    size = {"vocab_size": 10, "d_model": 4, "layers": 1, "heads": 1, "ffn": 8}
    # per source token: encoder 4d²+2d·f = 128 and cross K/V 2d² = 32 weights; per target token: 6d²+2d·f = 160
    # and the output layer d·V = 40; attention 4·d·(S²+T²+ST), of which half is multiply-adds
    linear = (128 + 32) * 3 + (160 + 40) * 2
    attention = 4 * 4 * (9 + 4 + 6) / 2
    assert speed.model_flops(size, 1, 3, 2) == 6 * (linear + attention)
    assert speed.flop_parts(size, 1, 3, 2) == (6 * linear, 6 * attention)


def test_both_models_get_the_optimizer_their_trainers_use():
    """Ours: the training command's fused Adam. Marian: Seq2SeqTrainer's default optimizer is torch's
    fused AdamW (here without weight decay), the same kernel as the benchmark's fused Adam."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from vanilla_transformer.schedule import make_optimizer_and_schedule

    model = speed.build("ours", speed.SIZES["smoke"])
    optimizer = speed.adam(model)
    ours, _ = make_optimizer_and_schedule(model, model.config.d_model)
    assert type(optimizer) is type(ours) and optimizer.defaults["fused"] and ours.defaults["fused"]
    trainer_class, trainer_kwargs = Seq2SeqTrainer.get_optimizer_cls_and_kwargs(Seq2SeqTrainingArguments(output_dir="unused"))
    assert trainer_class is torch.optim.AdamW and trainer_kwargs.get("fused") is True
    assert Seq2SeqTrainingArguments(output_dir="unused").weight_decay == 0.0


def test_speed_benchmark_smoke_run_writes_its_tables(tmp_path):
    results = speed.main(["--smoke", "--output", str(tmp_path)])
    saved = json.loads((tmp_path / "speed.json").read_text())
    assert saved["environment"]["peak_bf16"] > 0 and saved["environment"]["peak_fp32"] > 0
    assert {r["precision"] for r in saved["train"]} == {"fp32", "bf16"}
    for row in saved["train"]:
        assert row["ours_tokens_per_s"] > 0 and row["marian_tokens_per_s"] > 0
        assert math.isclose(row["ratio"], row["ours_tokens_per_s"] / row["marian_tokens_per_s"], rel_tol=1e-9)
    assert all(r["ours_peak_mb"] > 0 and r["marian_peak_mb"] > 0 for r in saved["memory"])
    assert {(r["beams"], r["batch"]) for r in saved["generate"]} == {(1, 1), (1, 32), (4, 1), (4, 32)}
    assert [r["length"] for r in saved["length"]] == [16, 32]
    shares = [r["attention_flop_share"] for r in saved["length"]]
    assert 0 < shares[0] < shares[1] < 1  # attention's share grows with length
    for row in saved["length"]:
        assert math.isclose(row["ours_train_us_per_token"], 1e3 * row["ours_train_ms"] / (8 * row["length"]), rel_tol=1e-9)
    from PIL import Image

    with Image.open(tmp_path / "speed-length.png") as picture:  # the cost-against-length picture
        assert picture.format == "PNG" and picture.width > 800 and picture.height > 300
    table = (tmp_path / "speed.md").read_text()
    assert "Training step" in table and "Generation" in table and "ours / Marian" in table and "µs per target token" in table
    if results["epoch"]:  # needs Multi30k beside the repository
        batchings = {r["batching"]: r for r in results["epoch"]}
        assert len(batchings) == 2 and all(r["target_tokens"] > 0 for r in batchings.values())


def test_trainer_speed_smoke_run_compares_the_trainer_paths_on_the_same_batches(tmp_path):
    results = trainer_speed.main(["--smoke", "--output", str(tmp_path)])
    saved = json.loads((tmp_path / "trainer-speed.json").read_text())
    assert saved["rows"] == results["rows"]
    rows = {r["row"]: r for r in saved["rows"]}
    assert list(rows) == ["marian", "ours_label_smoother", "ours_fused", "ours_package_step"]
    assert rows["marian"]["ratio_to_marian"] == 1.0
    for row in rows.values():
        assert row["tokens_per_s"] > 0 and row["repeats"] == 1
        assert math.isclose(row["ratio_to_marian"], row["tokens_per_s"] / rows["marian"]["tokens_per_s"], rel_tol=1e-9)
    # the fused row really skipped the logits; the LabelSmoother rows made them
    assert saved["made_logits"] == {"marian": True, "ours_label_smoother": True, "ours_fused": False}
    table = (tmp_path / "trainer-speed.md").read_text()
    assert "TranslationSeq2SeqTrainer (fused loss)" in table and "/ Marian" in table


def test_trainer_speed_batches_are_padded_as_the_seq2seq_collator_pads_them():
    size = trainer_speed.speed.SIZES["smoke"]
    first, second = trainer_speed.make_batches(size, 2, 16, (4, 12))
    assert not torch.equal(first["labels"], second["labels"])
    for batch in (first, second):
        labels, decoder_inputs = batch["labels"], batch["decoder_input_ids"]
        assert (labels == -100).any() and (batch["attention_mask"] == 0).any()  # padding on both sides
        assert torch.equal(decoder_inputs[:, 1:], labels[:, :-1].masked_fill(labels[:, :-1] == -100, 0))
        assert (decoder_inputs[:, 0] == 1).all()


@pytest.mark.parametrize("argv", [["--sizes", "nope"], ["--sections", "nope"]])
def test_speed_benchmark_rejects_unknown_choices(argv):
    with pytest.raises(SystemExit):
        speed.main(argv)


def test_bf16_curve_smoke_run_compares_the_same_run_in_both_precisions(corpus, tmp_path):
    report = bf16_curve.main(["--smoke", "--data", str(corpus), "--src-lang", "en", "--tgt-lang", "de", "--steps", "6",
                              "--log-every", "2", "--eval-every", "3", "--output", str(tmp_path / "out"),
                              "--workdir", str(tmp_path / "work")])  # fmt: skip
    for run in (report["fp32"], report["bf16"]):
        assert [step for step, _ in run["train"]] == [2, 4, 6] and [step for step, _ in run["valid"]] == [3, 6]
    # same start, same batches: the first recorded losses differ only by bf16 rounding
    assert abs(report["fp32"]["train"][0][1] - report["bf16"]["train"][0][1]) / report["fp32"]["train"][0][1] < 0.02
    assert report["fp32"]["train"] != report["bf16"]["train"]  # the precision did change something
    assert 0 <= report["max_relative_gap_train"] < 0.05
    assert (tmp_path / "out" / "bf16-vs-fp32.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_multi30k_benchmark_trains_as_two_processes_and_its_row_makes_the_card(corpus, tmp_path):
    """benchmarks/multi30k.py end to end on a Multi30k-shaped folder cut from the bundled corpus: it starts itself
    again as 2 torchrun processes, both stop at the same step of a 3-second budget (no hang), and the row it
    writes rebuilds the TrainConfig each process trained with, for the model card."""
    import os
    import subprocess

    sys.path.insert(0, str(ROOT / "scripts"))
    import make_model_cards
    import multi30k

    data = tmp_path / "multi30k"
    data.mkdir()
    for split, name, n in (("train", "train", 300), ("valid", "val", 12), ("test", "test_2016_flickr", 6)):
        for lang in ("en", "de"):
            lines = (corpus / f"{split}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)[:n]
            (data / f"{name}.{lang}").write_text("".join(lines), encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, str(ROOT / "benchmarks" / "multi30k.py"), "--minutes", "0.05", "--directions", "de-en",
               "--data", str(data), "--output-root", str(tmp_path / "out"), "--results-dir", str(tmp_path / "results")]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "multi30k-0.05min.json").read_text())
    (row,) = report["results"]
    assert (row["processes"], row["threads_per_process"]) == (2, max(1, (os.cpu_count() or 2) // 2))
    assert row["step"] >= 1 and 0 <= row["test"]["bleu"] <= 100 and row["test"]["n"] == 6
    assert row["command"].startswith("python benchmarks/multi30k.py --minutes 0.05")
    saved = json.loads((tmp_path / "out" / "multi30k-de-en-0.05min" / "train_config.json").read_text())
    rebuilt = multi30k.train_config("de-en", 0.05, row["recipe"], row["mixed_precision"], row["processes"], str(data),
                                    str(tmp_path / "out" / "multi30k-de-en-0.05min"))  # fmt: skip
    assert saved == dataclasses.asdict(rebuilt) and rebuilt.max_tokens == row["recipe"]["max_tokens_per_step"] // 2
    cards = make_model_cards.multi30k_cards(tmp_path / "results" / "multi30k-0.05min.json", root=tmp_path)
    card = cards["vanilla-transformer-multi30k-de-en-0.05min.md"]
    assert "× 2 data-parallel processes" in str(card) and f"| {row['test']['bleu']:.2f} |" in str(card)


def test_deployment_benchmark_smoke_run_compares_the_engines_on_the_same_work(tmp_path):
    """benchmarks/deployment.py on a tiny model: Marian carries our weights (same logits, same tokens), every engine
    translates the same sentences, and the tables are written."""
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    import deployment  # benchmarks/deployment.py
    from conftest import tiny_model

    from vanilla_transformer.tokenization import train_joint_bpe

    de = ["Ein Mann fährt Rad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch.", "Kinder spielen."]
    en = ["A man rides a bike.", "Two dogs play in the snow.", "A woman reads a book.", "Children play."]
    data = tmp_path / "data"
    data.mkdir()
    (data / "test_2016_flickr.de").write_text("\n".join(de) + "\n")
    (data / "test_2016_flickr.en").write_text("\n".join(en) + "\n")
    tokenizer = train_joint_bpe(de + en, vocab_size=300, min_frequency=1)
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.source_length_offset = 4  # an untrained model rarely stops
    model.save_pretrained(tmp_path / "model"), tokenizer.save_pretrained(tmp_path / "model")

    results = deployment.main(["--model", str(tmp_path / "model"), "--data", str(data), "--sentences", "4",
                               "--greedy-sentences", "2", "--repeats", "1", "--no-memory", "--bleu",
                               "--results-dir", str(tmp_path / "results")])  # fmt: skip
    assert results["marian_logit_difference"] < 1e-4  # Marian computes our function
    speed = {(r["setting"], r["engine"]): r for r in results["speed"]}
    assert len(speed) == 2 * len(deployment.ENGINES) and all(r["tokens_per_s"] > 0 for r in speed.values())
    for setting in ("beam 4, batch 32", "greedy, batch 1"):
        assert speed[(setting, "Marian")]["vs_marian"] == 1.0
        # the same work: ours and the float32 export produce the same number of tokens
        assert speed[(setting, "ours")]["target_tokens"] == speed[(setting, "CTranslate2 float32")]["target_tokens"]
    bleu = {r["engine"]: r for r in results["bleu"]}
    assert bleu["CTranslate2 float32"]["same_as_ours"] == 4 and bleu["ours"]["bleu"] == bleu["CTranslate2 float32"]["bleu"]
    table = (tmp_path / "results" / "deployment.md").read_text()
    assert "CTranslate2 int8" in table and "vs MarianMTModel" in table and "sacreBLEU" in table
    assert json.loads((tmp_path / "results" / "deployment.json").read_text())["speed"] == results["speed"]
