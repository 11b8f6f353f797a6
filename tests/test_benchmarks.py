"""The benchmark scripts run (tiny sizes, one repeat) so that they cannot rot."""

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bf16_curve  # noqa: E402
import speed  # noqa: E402


def test_flop_formula_counts_linear_layers_and_attention():
    size = {"vocab_size": 10, "d_model": 4, "layers": 1, "heads": 1, "ffn": 8}
    # per source token: encoder 4d²+2d·f = 128 and cross K/V 2d² = 32 weights; per target token: 6d²+2d·f = 160
    # and the output layer d·V = 40; attention 4·d·(S²+T²+ST), of which half is multiply-adds
    linear = (128 + 32) * 3 + (160 + 40) * 2
    attention = 4 * 4 * (9 + 4 + 6) / 2
    assert speed.model_flops(size, 1, 3, 2) == 6 * (linear + attention)


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
    table = (tmp_path / "speed.md").read_text()
    assert "Training step" in table and "Generation" in table and "ours / Marian" in table
    if results["epoch"]:  # needs Multi30k beside the repository
        batchings = {r["batching"]: r for r in results["epoch"]}
        assert len(batchings) == 2 and all(r["target_tokens"] > 0 for r in batchings.values())


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
