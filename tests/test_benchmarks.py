"""The benchmark scripts run (tiny sizes, one repeat) so that they cannot rot."""

import argparse
import dataclasses
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bf16_curve  # noqa: E402
import lr_sweep  # noqa: E402
import marian_baseline  # noqa: E402
import speed  # noqa: E402
import table3  # noqa: E402
import trainer_speed  # noqa: E402


def _multi30k_shaped(corpus: Path, folder: Path, train: int, val: int, test: int, test_name: str = "test_2016_flickr"):
    """A folder with Multi30k's file names ({train,val,TEST}.{en,de}), the first lines of the ``corpus`` fixture's."""
    folder.mkdir()
    for split, name, n in (("train", "train", train), ("valid", "val", val), ("test", test_name, test)):
        for lang in ("en", "de"):
            lines = (corpus / f"{split}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)[:n]
            (folder / f"{name}.{lang}").write_text("".join(lines), encoding="utf-8")
    return folder


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
    trainer_class, trainer_kwargs = Seq2SeqTrainer.get_optimizer_cls_and_kwargs(
        Seq2SeqTrainingArguments(output_dir="unused")
    )
    assert trainer_class is torch.optim.AdamW and trainer_kwargs.get("fused") is True
    assert Seq2SeqTrainingArguments(output_dir="unused").weight_decay == 0.0


@pytest.mark.slow
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
        assert math.isclose(
            row["ours_train_us_per_token"], 1e3 * row["ours_train_ms"] / (8 * row["length"]), rel_tol=1e-9
        )
    from PIL import Image

    with Image.open(tmp_path / "speed-length.png") as picture:  # the cost-against-length picture
        assert picture.format == "PNG" and picture.width > 800 and picture.height > 300
    table = (tmp_path / "speed.md").read_text()
    assert (
        "Training step" in table
        and "Generation" in table
        and "ours / Marian" in table
        and "µs per target token" in table
    )
    if results["epoch"]:  # needs Multi30k beside the repository
        batchings = {r["batching"]: r for r in results["epoch"]}
        assert len(batchings) == 2 and all(r["target_tokens"] > 0 for r in batchings.values())


@pytest.mark.slow
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


@pytest.mark.slow
def test_bf16_curve_smoke_run_compares_the_same_run_in_both_precisions(corpus, tmp_path):
    report = bf16_curve.main(
        [
            "--smoke",
            "--data",
            str(corpus),
            "--src-lang",
            "en",
            "--tgt-lang",
            "de",
            "--steps",
            "6",
            "--log-every",
            "2",
            "--eval-every",
            "3",
            "--output",
            str(tmp_path / "out"),
            "--workdir",
            str(tmp_path / "work"),
            "--name",
            "smoke",
        ]
    )
    for run in (report["fp32"], report["bf16"]):
        assert [step for step, _ in run["train"]] == [2, 4, 6] and [step for step, _ in run["valid"]] == [3, 6]
        assert run["seconds_per_step"] > 0
    # same start, same batches: the first recorded losses differ only by bf16 rounding
    assert abs(report["fp32"]["train"][0][1] - report["bf16"]["train"][0][1]) / report["fp32"]["train"][0][1] < 0.02
    assert report["fp32"]["train"] != report["bf16"]["train"]  # the precision did change something
    assert 0 <= report["max_relative_gap_train"] < 0.05
    assert (tmp_path / "out" / "bf16-vs-fp32-smoke.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads((tmp_path / "out" / "bf16-vs-fp32-smoke.json").read_text())
    assert written["environment"]["machine"] and written["speedup_bf16"] == report["speedup_bf16"]


@pytest.mark.parametrize("script", ["multi30k.py", "deployment.py", "bf16_curve.py"])
def test_multi30k_scripts_without_the_data_say_how_to_get_it(tmp_path, script):
    (tmp_path / "train.en").write_text("A dog.\n")  # one file of six: not Multi30k
    extra = ["--model", str(tmp_path)] if script == "deployment.py" else []
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--data", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (
        f"Multi30k is not in {tmp_path} (missing: " in done.stderr and "python scripts/get_multi30k.py" in done.stderr
    )
    assert "train.en," not in done.stderr  # the file that is there is not listed


def test_multi30k_benchmark_refuses_to_train_over_an_earlier_run(tmp_path):
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            (tmp_path / "data" / f"{split}.{lang}").parent.mkdir(exist_ok=True)
            (tmp_path / "data" / f"{split}.{lang}").write_text("A dog.\n")
    (tmp_path / "out" / "multi30k-en-de-60min" / "checkpoints" / "checkpoint-250").mkdir(parents=True)
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "multi30k.py"),
        "--data",
        str(tmp_path / "data"),
        "--output-root",
        str(tmp_path / "out"),
        "--results-dir",
        str(tmp_path / "results"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "multi30k-en-de-60min holds an earlier run of this budget: move or delete it" in done.stderr
    assert (tmp_path / "out" / "multi30k-en-de-60min" / "checkpoints" / "checkpoint-250").is_dir()  # untouched


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_multi30k_benchmark_trains_as_two_processes_and_its_row_makes_the_card(corpus, tmp_path):
    """benchmarks/multi30k.py end to end on a Multi30k-shaped folder cut from the bundled corpus: it starts itself
    again as 2 torchrun processes, both stop at the same step of a 3-second budget (no hang), and the row it
    writes rebuilds the TrainConfig each process trained with, for the model card."""
    import os

    from conftest import run_processes

    sys.path.insert(0, str(ROOT / "scripts"))
    import make_model_cards
    import multi30k

    data = _multi30k_shaped(corpus, tmp_path / "multi30k", train=300, val=12, test=6)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "multi30k.py"),
        "--minutes",
        "0.05",
        "--directions",
        "de-en",
        "--data",
        str(data),
        "--output-root",
        str(tmp_path / "out"),
        "--results-dir",
        str(tmp_path / "results"),
    ]
    done = run_processes(command, env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "multi30k-0.05min.json").read_text())
    (row,) = report["results"]
    assert (row["processes"], row["threads_per_process"]) == (2, max(1, (os.cpu_count() or 2) // 2))
    assert row["step"] >= 1 and 0 <= row["test"]["bleu"] <= 100 and row["test"]["n"] == 6
    assert row["command"].startswith("python benchmarks/multi30k.py --minutes 0.05")
    saved = json.loads((tmp_path / "out" / "multi30k-de-en-0.05min" / "train_config.json").read_text())
    rebuilt = multi30k.train_config(
        "de-en",
        0.05,
        row["recipe"],
        row["mixed_precision"],
        row["processes"],
        str(data),
        str(tmp_path / "out" / "multi30k-de-en-0.05min"),
    )
    assert saved == dataclasses.asdict(rebuilt) and rebuilt.max_tokens == row["recipe"]["max_tokens_per_step"] // 2
    cards = make_model_cards.multi30k_cards(tmp_path / "results" / "multi30k-0.05min.json", root=tmp_path)
    card = cards["vanilla-transformer-multi30k-de-en-0.05min.md"]
    assert "× 2 data-parallel processes" in str(card) and f"| {row['test']['bleu']:.2f} |" in str(card)
    # the paper's bias-free attention, recorded in the row, the table and the card; rows from before say biases
    assert row["recipe"]["attention_bias"] is False and "attention_bias=False" in str(card)
    assert "| de-en | 0.05 min | no |" in (tmp_path / "results" / "multi30k-0.05min.md").read_text()
    old_row = {k: v for k, v in row.items() if k != "recipe"} | {
        "recipe": {k: v for k, v in row["recipe"].items() if k != "attention_bias"}
    }
    assert "| de-en | 0.05 min | yes |" in multi30k.results_table([old_row])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_marian_baseline_trains_scores_and_goes_on_after_a_stop(corpus, tmp_path):
    """Seq2SeqTrainer trains MarianMTModel for whole epochs of the given batch size, every test sentence gets a
    hypothesis scored by sacreBLEU; a second start refuses the earlier run unless --resume, which goes on to more
    epochs from its checkpoint."""
    data = _multi30k_shaped(corpus, tmp_path / "multi30k", train=100, val=4, test=6)
    common = ["--smoke", "--batch-size", "16", "--data", str(data), "--output-root", str(tmp_path / "out")]
    common += ["--results-dir", str(tmp_path / "results")]
    first = marian_baseline.main(["--epochs", "1", *common])
    assert first["training"]["steps"] == math.ceil(100 / 16) and first["model"]["d_model"] == 32
    assert first["test"]["sentences"] == 6 and 0 <= first["test"]["bleu"] <= 100
    assert "nrefs:1" in first["test"]["bleu_signature"] and first["model"]["tie_word_embeddings"]
    hypotheses = (tmp_path / "out" / "marian-baseline-de-en" / "test_2016_flickr.hyp.en").read_text().splitlines()
    assert len(hypotheses) == 6
    with pytest.raises(SystemExit) as refused:
        marian_baseline.main(["--epochs", "2", *common])
    assert refused.value.code == 2
    resumed = marian_baseline.main(["--epochs", "2", "--resume", *common])
    assert resumed["training"]["steps"] == 2 * math.ceil(100 / 16) and resumed["training"]["resumed"]
    saved = json.loads((tmp_path / "results" / "marian-baseline.json").read_text())
    assert saved["training"] == resumed["training"]
    # the resumed run is the run without a stop: the same weights after the same steps
    straight = ["--smoke", "--batch-size", "16", "--data", str(data), "--output-root", str(tmp_path / "straight")]
    marian_baseline.main(["--epochs", "2", *straight, "--results-dir", str(tmp_path / "results2")])
    from safetensors.torch import load_file

    step = f"checkpoint-{2 * math.ceil(100 / 16)}"
    a = load_file(tmp_path / "out" / "marian-baseline-de-en" / step / "model.safetensors")
    b = load_file(tmp_path / "straight" / "marian-baseline-de-en" / step / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert f"| {resumed['test']['bleu']:.2f} |" in (tmp_path / "results" / "marian-baseline.md").read_text()


@pytest.mark.timeout(300)
def test_lr_sweep_records_both_evaluations_of_each_factor_and_keeps_earlier_factors(corpus, tmp_path):
    """Each factor trains from scratch and is evaluated halfway and at the end (NLL and sacreBLEU); a factor
    already in the results is kept, not trained again; the table is the results file's."""
    data = _multi30k_shaped(corpus, tmp_path / "multi30k", train=200, val=8, test=4)
    results = tmp_path / "results"
    common = ["--data", str(data), "--steps", "4", "--bleu-sentences", "3", "--mixed-precision", "no"]
    common += ["--output-root", str(tmp_path / "out"), "--results-dir", str(results)]
    lr_sweep.main(["--factors", "0.3", *common])
    first = json.loads((results / "lr-sweep.json").read_text())["runs"]
    lr_sweep.main(["--factors", "0.8", "0.3", *common])
    runs = json.loads((results / "lr-sweep.json").read_text())["runs"]
    assert [r["lr_factor"] for r in runs] == [0.3, 0.8] and runs[0] == first[0]
    for run in runs:
        assert [e["step"] for e in run["evaluations"]] == [2, 4], run["evaluations"]
        assert all(math.isfinite(e["valid_nll"]) and 0 <= e["valid_bleu"] <= 100 for e in run["evaluations"])
        assert run["peak_lr"] == pytest.approx(run["lr_factor"] * 256**-0.5 * 300**-0.5)
    assert runs[0]["evaluations"][-1]["valid_nll"] != runs[1]["evaluations"][-1]["valid_nll"]
    table = (results / "lr-sweep.md").read_text()
    last = runs[1]["evaluations"]
    assert f"| 0.8 | 2.9e-03 | {last[0]['valid_nll']:.2f} | {last[1]['valid_nll']:.2f} |" in table


@pytest.mark.timeout(400)
def test_multi30k_benchmark_trains_to_a_step_count_and_goes_on_after_a_stop(corpus, tmp_path):
    """--max-steps trains to a step whatever the time, and --resume goes on from the run's newest checkpoint
    (instead of refusing an earlier run): the row records both starts, the step cap and the machine."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import multi30k

    data = _multi30k_shaped(corpus, tmp_path / "multi30k", train=200, val=8, test=4)
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "multi30k.py"),
        "--minutes",
        "0.01",  # a budget that --max-steps overrides: 6 steps take longer than 0.6 s
        "--directions",
        "en-de",
        "--processes",
        "1",
        "--data",
        str(data),
        "--output-root",
        str(tmp_path / "out"),
        "--results-dir",
        str(tmp_path / "results"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    first = subprocess.run([*command, "--max-steps", "3"], capture_output=True, text=True, timeout=180, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    again = subprocess.run([*command, "--max-steps", "6"], capture_output=True, text=True, timeout=60, env=env)
    assert again.returncode == 2 and "or go on with it with --resume" in again.stderr, again.stderr[-2000:]
    resumed = subprocess.run(
        [*command, "--max-steps", "6", "--resume"], capture_output=True, text=True, timeout=180, env=env
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from checkpoint-3 (step 3" in resumed.stderr + resumed.stdout
    (row,) = json.loads((tmp_path / "results" / "multi30k-0.01min.json").read_text())["results"]
    assert row["step"] == row["max_steps"] == 6 and row["loop_seconds"] > 0.6
    assert row["command"].endswith("--max-steps 3") and row["resumed"][0]["command"].endswith("--max-steps 6 --resume")
    assert row["machine"].endswith(f", {os.cpu_count()} cores")
    assert f"| en-de | 6 steps ({row['loop_seconds'] / 60:.0f} min) | no | 6 |" in multi30k.results_table([row])


@pytest.mark.slow
def test_deployment_benchmark_smoke_run_compares_the_engines_on_the_same_work(tmp_path):
    """benchmarks/deployment.py on a tiny model: Marian carries our weights (same logits, same tokens), every engine
    translates the same sentences, and the tables are written."""
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    import deployment  # benchmarks/deployment.py
    from conftest import tiny_model

    from vanilla_transformer.tokenization import train_joint_bpe

    de = ["Ein Mann fährt Rad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch.", "Kinder spielen."]
    en = ["A man rides a bike.", "Two dogs play in the snow.", "A woman reads a book.", "Children play."]
    with gzip.open(tmp_path / "test.de.gz", "wt", encoding="utf-8") as f:  # a corpus of one's own, gzipped
        f.write("\n".join(de) + "\n")
    (tmp_path / "test.en").write_text("\n".join(en) + "\n")
    tokenizer = train_joint_bpe(de + en, vocab_size=300, min_frequency=1)
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.source_length_offset = 4  # an untrained model rarely stops
    model.save_pretrained(tmp_path / "model"), tokenizer.save_pretrained(tmp_path / "model")

    results = deployment.main(
        [
            "--model",
            str(tmp_path / "model"),
            "--sources",
            str(tmp_path / "test.de.gz"),
            "--references",
            str(tmp_path / "test.en"),
            "--name",
            "tiny",
            "--sentences",
            "4",
            "--greedy-sentences",
            "2",
            "--repeats",
            "1",
            "--no-memory",
            "--bleu",
            "--results-dir",
            str(tmp_path / "results"),
        ]
    )
    assert results["marian_logit_difference"] < 1e-4  # Marian computes our function
    speed = {(r["setting"], r["engine"]): r for r in results["speed"]}
    assert len(speed) == 2 * len(deployment.ENGINES) and all(r["tokens_per_s"] > 0 for r in speed.values())
    for setting in ("beam 4, batch 32", "greedy, batch 1"):
        assert speed[(setting, "Marian")]["vs_marian"] == 1.0
        # the same work: ours and the float32 export produce the same number of tokens
        assert speed[(setting, "ours")]["target_tokens"] == speed[(setting, "CTranslate2 float32")]["target_tokens"]
    bleu = {r["engine"]: r for r in results["bleu"]}
    assert (
        bleu["CTranslate2 float32"]["same_as_ours"] == 4 and bleu["ours"]["bleu"] == bleu["CTranslate2 float32"]["bleu"]
    )
    table = (tmp_path / "results" / "deployment-tiny.md").read_text()
    assert "CTranslate2 int8" in table and "vs MarianMTModel" in table and "sacreBLEU" in table
    assert "Whole test set (test.de.gz, 4 sentences" in table
    assert json.loads((tmp_path / "results" / "deployment-tiny.json").read_text())["speed"] == results["speed"]


def test_ctranslate2_batching_benchmark_compares_the_mixed_batches_with_the_exact_path(tmp_path):
    """benchmarks/ctranslate2_batching.py on an untrained model whose outputs all run into their limits: every
    sentence but the one whose limit the batch ran with (the longest: all four differ) is decoded twice, all
    match the exact path, and the report says so."""
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    import ctranslate2_batching  # benchmarks/ctranslate2_batching.py
    from conftest import tiny_model

    from vanilla_transformer.tokenization import train_joint_bpe

    sources = [
        "Ein Mann fährt Rad.",
        "Zwei Hunde spielen im Schnee.",
        "Eine Frau liest ein langes Buch im Park.",
        "Kinder.",
    ]
    tokenizer = train_joint_bpe(sources, vocab_size=300, min_frequency=1)
    assert len({len(ids) for ids in tokenizer(sources)["input_ids"]}) == 4
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.source_length_offset = 3  # an untrained model rarely stops
    model.save_pretrained(tmp_path / "model"), tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "sources.de").write_text("\n".join(sources) + "\n", encoding="utf-8")
    report = ctranslate2_batching.main(
        [
            "--model",
            str(tmp_path / "model"),
            "--sources",
            str(tmp_path / "sources.de"),
            "--name",
            "tiny",
            "--repeats",
            "1",
            "--threads",
            "1",
            "--results-dir",
            str(tmp_path / "results"),
        ]
    )
    for row in report["quantizations"].values():
        assert row["sentences"] == 4 and row["identical"] == 4 and row["redecoded"] == 3 and row["differing"] == []
        assert set(row["seconds"]) == {"exact", "package", "translate_batch", "translate_batch_text"}
        assert all(seconds > 0 for seconds in row["seconds"].values())
    assert "| int8 | 4 | 4 (100.0 %) | 3 |" in (tmp_path / "results" / "ctranslate2-batching-tiny.md").read_text()
    assert json.loads((tmp_path / "results" / "ctranslate2-batching-tiny.json").read_text()) == report


def test_length_penalty_benchmark_scores_both_forms_and_counts_the_outputs_that_differ(tmp_path):
    """benchmarks/length_penalty.py on a tiny untrained model: both forms decoded and scored with sacreBLEU, the
    differing outputs listed, and the Markdown and JSON written."""
    import length_penalty  # benchmarks/length_penalty.py
    from conftest import tiny_model

    from vanilla_transformer.tokenization import train_joint_bpe

    sources = [
        "Ein Mann fährt Rad.",
        "Zwei Hunde spielen im Schnee.",
        "Eine Frau liest ein langes Buch im Park.",
        "Kinder.",
    ]
    references = [
        "A man rides a bike.",
        "Two dogs play in the snow.",
        "A woman reads a long book in the park.",
        "Children.",
    ]
    tokenizer = train_joint_bpe(sources + references, vocab_size=300, min_frequency=1)
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.source_length_offset = 3
    model.save_pretrained(tmp_path / "model"), tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "src.de").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "ref.en").write_text("\n".join(references) + "\n", encoding="utf-8")
    report = length_penalty.main(
        [
            "--model",
            str(tmp_path / "model"),
            "--source",
            str(tmp_path / "src.de"),
            "--reference",
            str(tmp_path / "ref.en"),
            "--name",
            "tiny",
            "--results-dir",
            str(tmp_path / "results"),
        ]
    )
    assert set(report["forms"]) == {"power", "gnmt"} and report["sentences"] == 4
    assert report["identical"] + len(report["differing"]) == 4
    assert all(row["bleu_signature"].startswith("nrefs:1|case:mixed") for row in report["forms"].values())
    assert report["decoding"] == {"num_beams": 4, "length_penalty": 0.6, "source_length_offset": 3}
    assert 0 <= report["paired_bootstrap"]["p_value"] <= 1
    table = (tmp_path / "results" / "length-penalty-tiny.md").read_text()
    assert (
        "| \\|Y\\|^α (transformers, CTranslate2) |" in table and "| ((5 + \\|Y\\|) / 6)^α (GNMT, the paper) |" in table
    )
    assert json.loads((tmp_path / "results" / "length-penalty-tiny.json").read_text()) == report


@pytest.mark.slow
def test_table3_smoke_run_records_each_row_resumes_an_interrupted_one_and_skips_recorded_ones(
    corpus, tmp_path, monkeypatch, capsys
):
    args = [
        "--smoke",
        "--data",
        str(corpus),
        "--src-lang",
        "en",
        "--tgt-lang",
        "de",
        "--output",
        str(tmp_path / "out"),
        "--workdir",
        str(tmp_path / "work"),
    ]
    # an interruption after 4 of the row's 6 steps (checkpoints every 2), before it is scored
    monkeypatch.setitem(table3.SMOKE, "steps", 4)
    monkeypatch.setattr(table3, "score", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        table3.main([*args, "--rows", "X-untied"])
    assert (tmp_path / "work" / "X-untied-seed0" / "checkpoints" / "checkpoint-4").is_dir()
    assert not (tmp_path / "out" / "table3.json").exists()
    monkeypatch.undo()
    capsys.readouterr()

    results = table3.main([*args, "--rows", "base", "A-h1", "B-dk16", "X-untied"])
    assert "resumed from checkpoint-4 (step 4" in capsys.readouterr().out
    runs = {(r["row"], r["seed"]): r for r in results["runs"]}
    assert set(runs) == {("base", 0), ("base", 1), ("base", 2), ("A-h1", 0), ("B-dk16", 0), ("X-untied", 0)}
    saved = json.loads((tmp_path / "out" / "table3.json").read_text())
    assert saved["runs"] == results["runs"] and saved["steps"] == 6
    base, untied, one_head = runs["base", 0], runs["X-untied", 0], runs["A-h1", 0]
    for run in runs.values():
        assert run["steps"] == 6 and run["val"]["ppl"] > 1 and 0 <= run["val"]["bleu"] <= 100 and run["val"]["n"] == 100
        assert run["command"].startswith("python benchmarks/table3.py --smoke")
        assert run["layout"]["processes"] == 1 and run["layout"]["threads"] == torch.get_num_threads()
        folder = tmp_path / "work" / f"{run['row']}-seed{run['seed']}"
        assert not (folder / "checkpoints").exists() and (folder / "final" / "config.json").is_file()
    assert all("averaged" in runs["base", seed] for seed in (0, 1, 2)) and "averaged" not in untied
    assert len({runs["base", seed]["val"]["ppl"] for seed in (0, 1, 2)}) == 3  # the seeds change the run
    # the changes reach the model: one head keeps h*d_k = d_model (same size); untied adds two vocabulary matrices
    assert one_head["settings"]["encoder_attention_heads"] == 1 and one_head["params"] == base["params"]
    d_model, vocab = base["settings"]["d_model"], table3.SMOKE["vocab_size"]
    assert untied["params"] - base["params"] == 2 * vocab * d_model
    # d_k = d_v = d_model / h / 4: each of the 3N attention modules has Q, K, V, O (and, if asked, Q, K, V biases)
    # of width h*d_k
    small_heads, layers = runs["B-dk16", 0], base["settings"]["encoder_layers"]
    width = small_heads["settings"]["head_dim"] * small_heads["settings"]["encoder_attention_heads"]
    biases = 3 * int(base["settings"].get("attention_bias", False))
    assert width == d_model // 4
    assert base["params"] - small_heads["params"] == 3 * layers * (d_model - width) * (4 * d_model + biases)
    table = (tmp_path / "out" / "table3.md").read_text()
    assert all(f"| {key} |" in table for key in ("base", "A-h1", "B-dk16", "X-untied", "X-averaged"))
    assert (tmp_path / "out" / "table3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    again = table3.main([*args, "--rows", "base", "A-h1", "B-dk16", "X-untied"])  # everything recorded: nothing trains
    assert "0 run(s) to do" in capsys.readouterr().out and again["runs"] == results["runs"]
    with pytest.raises(SystemExit):  # rows of 6 steps are not mixed with rows of the default step count
        table3.main(["--report", "--output", str(tmp_path / "out")])


def test_table3_report_lays_out_the_fixture_rows_against_the_base_band(tmp_path):
    """tests/fixtures/table3.json: base BLEU 30/31/32 (PPL 6.0/5.8/5.6); A-h1 worse on both, A-h16 inside, E
    below on BLEU (against the paper), the bigger models better, no label smoothing better on both (the paper:
    PPL better, BLEU worse), two seeds of it, and 0.2 worse on PPL (as the paper)."""
    shutil.copy(ROOT / "tests" / "fixtures" / "table3.json", tmp_path / "table3.json")
    table3.main(["--report", "--output", str(tmp_path)])
    table = (tmp_path / "table3.md").read_text()
    assert "BLEU 30.00–32.00 (mean 31.00, standard deviation 1.00); PPL 5.60–6.00" in table
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if line.startswith("| ")}
    assert rows["A-h1"][1:7] == ["h=1, d_k=256", "3", "256", "1024", "1", "256"]
    assert rows["A-h1"][10:14] == ["6.50", "28.00", "9.9M", "below / above"]
    assert rows["A-h1"][15:18] == ["h=1, d_k=512", "5.29", "24.9"]
    assert rows["A-h16"][13] == "inside / inside" and rows["E-learned"][13] == "below / inside"
    assert rows["D-ls0.0"][8] == "0.0" and rows["D-ls0.0"][11] == "33.00 (32.50–33.50)"
    assert rows["base"][11] == "31.00 (30.00–32.00)" and rows["X-averaged"][11] == "32.00 (31.00–33.00)"
    assert "B-dk16" not in rows  # not run: no line
    lines = table.splitlines()
    verdicts = {
        text: next(line.removeprefix(f"- {text}: ") for line in lines if line.startswith(f"- {text}: "))
        for text, _ in table3.CLAIMS
    }
    assert verdicts["(A) single-head attention is worse than the base's heads (paper: −0.9 BLEU)"].startswith(
        "**held**"
    )
    assert verdicts["(A) too many heads also hurt (paper: 32 heads −0.4 BLEU)"].startswith("not resolved")
    assert verdicts["(B) reducing the attention key size d_k hurts (paper: −0.7 / −0.4 BLEU)"] == "not run yet"
    assert verdicts["(C) bigger models are better (more layers, wider, larger FFN)"].startswith("**held**")
    label_smoothing = next(v for k, v in verdicts.items() if k.startswith("(D) label smoothing"))
    assert label_smoothing == (
        "**held in part** (held: D-ls0.0 PPL below, D-ls0.2 PPL above; did not hold: D-ls0.0 BLEU above)"
    )
    learned = next(v for k, v in verdicts.items() if k.startswith("(E)"))
    assert learned == "**did not hold** (E-learned BLEU below)"
    assert "per seed, averaging changed BLEU by +1.00, +1.00, +1.00" in table
    assert (tmp_path / "table3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("value", "where"), [(29.99, "below"), (30.0, "inside"), (32.0, "inside"), (32.01, "above")])
def test_table3_band_edges_count_as_inside(value, where):
    assert table3.position(value, {"min": 30.0, "max": 32.0, "n": 3}) == where
    assert table3.position(value, {"min": 30.0, "max": 32.0, "n": 1}) == "?"  # one seed is no band


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_gpu_check_dry_run_runs_every_step_on_the_cpu(tmp_path):
    """scripts/gpu_check.sh --dry-run: the gpu tests, the throughput comparison, the main job and the CTranslate2
    comparison, each on the CPU at tiny sizes, so that the GPU check cannot rot between GPU runs."""
    import os

    from conftest import run_processes

    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    done = run_processes(
        [
            "bash",
            str(ROOT / "scripts" / "gpu_check.sh"),
            "--dry-run",
            "--results-dir",
            str(tmp_path / "results"),
            "--workdir",
            str(tmp_path / "work"),
        ],
        {**os.environ, "PYTHON": sys.executable},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "gpu-check-dry-run.json").read_text())
    assert [name for name in ("tests", "throughput", "main_job", "ctranslate2") if report[name]["ok"]] == [
        "tests",
        "throughput",
        "main_job",
        "ctranslate2",
    ]
    assert any(line.startswith("PASSED") and "no_training_step_waits" in line for line in report["tests"]["outcomes"])
    assert report["throughput"]["rows"]["ours"]["target_tokens_per_s"] > 0 and report["main_job"]["step"] == 2
    assert report["ctranslate2"]["identical_outputs"] == report["ctranslate2"]["sentences"]


# --------------------------------------------------------------------------------------------
# benchmarks/table3_converged.py
# --------------------------------------------------------------------------------------------
def _table3_converged():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import table3_converged

    return table3_converged


@pytest.mark.parametrize("df", [1, 2, 4, 10, 30])
def test_table3_t_quantiles_leave_two_and_a_half_percent_above(df):
    """The tabulated 97.5 % quantile, checked by integrating Student's t density (trapezoids) from 0 to it."""
    t3 = _table3_converged()
    q = t3.t_quantile(df)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    xs = [q * i / 20000 for i in range(20001)]
    ys = [math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df)) for x in xs]
    area = sum((a + b) / 2 for a, b in zip(ys, ys[1:])) * q / 20000
    assert 0.5 + area == pytest.approx(0.975, abs=2e-4)
    with pytest.raises(ValueError, match="31 degrees of freedom"):
        t3.t_quantile(31)


def test_table3_bleu_resamples_are_sacrebleus_corpus_bleu_of_the_resampled_sentences():
    """The resampler's scores (sacreBLEU's sentence statistics, summed over a resample) equal sacreBLEU's corpus
    BLEU of that resample's sentences."""
    import sacrebleu

    t3 = _table3_converged()
    references = [f"a dog number {i} runs on the {'green' if i % 2 else 'wet'} grass ." for i in range(12)]
    hypotheses = [r.replace("dog", "cat") if i % 3 else r for i, r in enumerate(references)]
    resampler = t3.BleuResampler(references, samples=5)
    scores = resampler.scores(hypotheses)
    for k in range(5):
        picked = resampler.indices[k]
        expected = sacrebleu.corpus_bleu([hypotheses[i] for i in picked], [[references[i] for i in picked]]).score
        assert scores[k] == pytest.approx(expected, abs=1e-9)


def test_table3_paired_intervals_and_outcomes():
    t3 = _table3_converged()
    interval = t3.paired_interval([-1.0, -2.0, -3.0])
    # mean -2, s = 1, t(2) = 4.303: ± 4.303 / √3
    assert interval["mean"] == -2.0 and interval["high"] == pytest.approx(-2 + 4.303 / math.sqrt(3))
    assert t3.outcome(interval, "-") == "not resolvable" and t3.outcome(interval, "+") == "not resolvable"
    tight = t3.paired_interval([-1.9, -2.0, -2.1])
    assert t3.outcome(tight, "-") == "held" and t3.outcome(tight, "+") == "contradicted"
    # the test-set part widens the interval: [seeds, resamples] of differences whose mean varies with sd 1
    noisy = t3.paired_interval([-1.9, -2.0, -2.1], np.array([[-3.0, -1.0] * 50] * 3))
    assert noisy["test_var"] == pytest.approx(1.0, rel=0.02) and t3.outcome(noisy, "-") == "not resolvable"
    assert t3.paired_interval([-2.0]) is None and t3.outcome(None, "-") == "not run"
    near = t3.paired_interval([0.1, -0.1, 0.0])
    assert t3.outcome(near, "=") == "held" and t3.outcome(tight, "=") == "contradicted"
    assert t3.claim_verdict(["held", "not resolvable"]) == "not resolvable at this scale"
    assert t3.claim_verdict(["held", "contradicted"]) == "contradicted"
    assert t3.claim_verdict(["held", "held"]) == "held" and t3.claim_verdict(["held", "not run"]) == "not run yet"


def test_table3_runs_stop_at_the_cap_or_after_their_patience_but_not_before_the_minimum():
    t3 = _table3_converged()
    args = argparse.Namespace(max_epochs=20, min_epochs=6, patience=2)

    def curve(nlls, epochs):
        return [{"step": 250 * (i + 1), "epoch": e, "valid_nll": n} for i, (n, e) in enumerate(zip(nlls, epochs))]

    assert t3.should_stop(curve([3.0, 2.5, 2.6, 2.7], [2, 3, 4, 5]), args) is None  # patience spent, but epoch 5 < 6
    assert t3.should_stop(curve([3.0, 2.5, 2.6, 2.7], [5, 6, 6, 7]), args) == "early"
    assert t3.should_stop(curve([3.0, 2.5, 2.6], [5, 6, 7]), args) is None  # one evaluation without a better NLL
    assert t3.should_stop(curve([3.0, 2.5, 2.4], [18, 19, 20]), args) == "cap"
    assert [e["step"] for e in t3.window(curve([5, 4, 3, 2, 1, 2, 3], [1] * 7), 4, 5)] == [750, 1000, 1250, 1500, 1750]
    assert [e["step"] for e in t3.window(curve([1, 2, 3], [1] * 3), 0, 5)] == [250, 500, 750]


def _fixture_runs(t3, references, shift: dict[str, float], seeds: int = 3) -> list[dict]:
    """Runs whose test outputs are the references with some words dropped: more dropped, lower BLEU; rows get
    ``shift`` more drops (a float: the share of sentences that lose a word) than the base, seed by seed."""
    runs = []
    for row, extra in shift.items():
        for seed in range(seeds):
            share = 0.2 + 0.02 * seed + extra
            hyps = [r.rsplit(" ", 2)[0] if (i * 7919 % 100) / 100 < share else r for i, r in enumerate(references)]
            import sacrebleu

            bleu = sacrebleu.corpus_bleu(hyps, [references])
            scores = {"ppl": 5.0 + extra + 0.01 * seed, "bleu": bleu.score, "bleu_signature": "sig", "chrf": 0.0}
            runs.append(
                {
                    "row": row,
                    "seed": seed,
                    "stop": "early",
                    "curve": [
                        {"step": 250, "epoch": 6, "valid_nll": 1.7 + extra},
                        {"step": 500, "epoch": 7, "valid_nll": 1.6 + extra + 0.01 * seed},
                    ],
                    "params": 1e6,
                    "revision": "abc1234",
                    "selected": scores,
                    "averaged": scores,
                    "last": scores,
                    "selected_hypotheses": hyps,
                }
            )
    return runs


def test_table3_verdicts_follow_the_intervals(tmp_path):
    """A row clearly worse than the base on every paired seed: the single-head claim holds; the same row better:
    contradicted; a row equal to the base: "nearly identical" holds only when the interval fits the margin."""
    t3 = _table3_converged()
    references = [
        f"the {w} dog number {i} runs on the grass near a {w} tree today ."
        for i, w in enumerate(["red", "big", "old", "tall"] * 100)
    ]
    worse = _fixture_runs(t3, references, {"base": 0.0, "A-h1": 0.3, "E-learned": 0.0})
    intervals = t3.comparisons(worse, references, samples=200)
    single = intervals[("A-h1", "base", "bleu")]
    assert single["high"] < 0 and t3.outcome(single, "-") == "held"
    assert intervals[("E-learned", "base", "bleu")]["mean"] == 0.0
    early = {"steps": 750, "base_settings": {"d_model": 256}, "runs": []}
    early["runs"] = [
        {"row": row, "val": {"bleu": bleu}}
        for row, bleu in (("base", 14.0), ("base", 13.0), ("A-h1", 12.0), ("D-drop0.1", 15.0))
    ]
    (tmp_path / "table3.json").write_text(json.dumps(early))
    text = t3.report({"runs": worse, "bootstrap_samples": 200}, tmp_path, references, picture=True)
    # 3 base seeds of the planned 5: the verdict stands, marked as provisional
    claim = "- (A) single-head attention is worse than the base's heads (paper: −0.9 BLEU): "
    assert claim + "**held, provisional (seeds base: 3 of 5)**" in text
    a_h1 = next(line for line in text.splitlines() if line.startswith("| A-h1 | 12.00 | -1.50 |"))
    assert a_h1.endswith(f" | {t3._interval_text(single)} |")
    assert "| E-learned | — | — |" in text
    assert "| base | 15.00 | +1.50 |" in text  # beside the 750-step row of its settings (P_drop 0.1)
    assert (tmp_path / "table3-converged-curves.png").stat().st_size > 10_000
    assert "(E) learned positions give nearly identical results" in text and "**not run yet**" in text
    full = _fixture_runs(t3, references, {"base": 0.0}, seeds=5)
    full += [r for r in worse if r["row"] == "A-h1"]
    assert claim + "**held** (" in t3.report({"runs": full, "bootstrap_samples": 200}, tmp_path, references, False)
    one = [r for r in worse if r["row"] == "base"] + _fixture_runs(t3, references, {"D-drop0.0": 0.1}, seeds=1)
    text = t3.report({"runs": one, "bootstrap_samples": 200}, tmp_path, references, False)
    assert "(D-drop0.0 − base BLEU — (1 paired seed, no interval yet))" in text
    better = _fixture_runs(t3, references, {"base": 0.3, "A-h1": 0.0})
    assert t3.outcome(t3.comparisons(better, references, samples=200)[("A-h1", "base", "bleu")], "-") == "contradicted"
    effect = t3.resolvable_effect(worse, 3, references, samples=200)
    assert 0 < effect < abs(single["mean"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_table3_converged_smoke_run_trains_in_chunks_resumes_and_reports(corpus, tmp_path):
    """--smoke end to end: rows train chunk by chunk to their cap, each chunk's weights go where the scoring reads
    them, a killed run goes on from its curve, the report and the pilot's curves are written."""
    t3 = _table3_converged()
    data = _multi30k_shaped(corpus, tmp_path / "data", train=60, val=8, test=6, test_name="test")
    common = ["--smoke", "--data", str(data), "--output", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")]
    common += ["--src-lang", "en", "--tgt-lang", "de", "--test-split", "test"]
    results = t3.main([*common, "--rows", "base", "A-h1", "--seeds", "0", "1"])
    runs = {(r["row"], r["seed"]): r for r in results["runs"]}
    assert set(runs) == {("base", 0), ("base", 1), ("A-h1", 0), ("A-h1", 1)}
    for run in runs.values():
        steps = [e["step"] for e in run["curve"]]
        assert steps == list(range(3, 3 * len(steps) + 1, 3)) and run["stop"] in ("cap", "early")
        assert run["curve"][-1]["epoch"] >= 2 or run["stop"] == "early"
        assert run["selected"]["steps"][0] in steps and run["last"]["steps"] == [steps[-1]]
        assert len(run["averaged"]["steps"]) >= 3 and 0 <= run["selected"]["bleu"] <= 100
    assert runs["base", 0]["selected"]["ppl"] != runs["base", 1]["selected"]["ppl"]  # seeds differ
    assert not (tmp_path / "work" / "base-seed0" / "checkpoints").exists()  # cleaned after scoring
    assert (tmp_path / "out" / "table3-converged" / "A-h1-seed1.selected.hyp.gz").is_file()
    text = (tmp_path / "out" / "table3-converged.md").read_text()
    assert "| base | — | 2 |" in text and "(A) single-head attention" in text
    # a run killed after two chunks: its curve and checkpoint are where the next start goes on from
    record = dict(runs["base", 0])
    folder = tmp_path / "work" / "again"
    shutil.copytree(tmp_path / "work" / "tokenizer", tmp_path / "work2" / "tokenizer")
    args = argparse.Namespace(
        **{
            **vars(argparse.Namespace()),
            **t3.SMOKE,
            "average": 5,
            "smoke": True,
            "data": data,
            "src_lang": "en",
            "tgt_lang": "de",
            "workdir": tmp_path / "work2",
        }
    )
    settings = t3.settings(t3.ROW_BY_KEY["base"], t3.SMOKE_BASE)
    first = t3.train_run(settings, 0, t3.RECIPE, args, folder, 6)
    resumed = t3.train_run(settings, 0, t3.RECIPE, args, folder, 9)
    assert resumed[:2] == first and [e["valid_nll"] for e in resumed] == [e["valid_nll"] for e in record["curve"][:3]]
    pilot = t3.main([*common, "--pilot"])
    assert set(pilot["runs"]) == {t3.pilot_key(name, row, base) for name, row, _, base in t3.PILOT}
    assert "warmup1000-7e-4:C-N6@d128" in pilot["runs"] and pilot["runs"]["warmup1000-7e-4:C-N6@d128"]["base"] == "d128"
    assert all(len(run["curve"]) == 1 for run in pilot["runs"].values())  # --smoke: one chunk each
    assert (tmp_path / "out" / "table3-pilot.png").is_file()
    check = t3.main([*common, "--check-start"])
    assert check["identical"] and check["valid_nll"] == runs["base", 0]["curve"][0]["valid_nll"]
    t3.main([*common, "--report"])
    assert (
        "first chunk trained to the identical validation NLL" in (tmp_path / "out" / "table3-converged.md").read_text()
    )
    timing = t3.main([*common, "--time-base", "d128"])
    recorded = json.loads((tmp_path / "out" / "table3-base-timing.json").read_text())["runs"]
    assert recorded["d128"] == timing and timing["steps"] == 3 and timing["target_tokens"] > 0
    assert timing["target_tokens_per_s"] == timing["target_tokens"] / timing["loop_seconds"]
    assert not (tmp_path / "work" / "timing" / "d128").exists()
