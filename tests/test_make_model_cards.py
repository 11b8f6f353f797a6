"""model_cards/ (scripts/make_model_cards.py): the cards parse as Hub cards, report exactly the committed
measurements, and are what the script makes from the committed inputs (so a card cannot drift from its
results file)."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard, ModelCardData

from vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import make_model_cards as cards  # noqa: E402

CARDS = ROOT / "model_cards"
MULTI30K_RESULTS = sorted((ROOT / "benchmarks" / "results").glob("multi30k-*min.json"))
PRESETS = ("base", "big")


@pytest.fixture(scope="module")
def generated():
    return cards.generate_cards(ROOT)


def card_files() -> list[Path]:
    return sorted(CARDS.glob("*.md"))


def trained_inputs() -> list[tuple[str, dict, str]]:
    """(card file name, measured test scores, command) for every committed results file."""
    rows = []
    for path in MULTI30K_RESULTS:
        for row in json.loads(path.read_text(encoding="utf-8"))["results"]:
            rows.append(
                (f"vanilla-transformer-multi30k-{row['direction']}-{row['minutes']:g}min.md", row["test"], path)
            )
    main = ROOT / cards.MAIN_JOB["results"]
    if main.is_file():
        rows.append((f"{cards.MAIN_JOB['name']}.md", json.loads(main.read_text(encoding="utf-8"))["test"], main))
    return rows


def test_every_card_parses_and_has_the_hub_metadata():
    assert {p.name for p in card_files()} >= {f"vanilla-transformer-{p}.md" for p in PRESETS}
    for path in card_files():
        text = path.read_text(encoding="utf-8")
        card, reparsed = ModelCard.load(path), ModelCard(text)
        assert str(card) == text == str(reparsed), path.name  # the metadata block round-trips unchanged
        data = card.data
        assert isinstance(data, ModelCardData)
        assert data.license == "apache-2.0" and data.library_name == "transformers", path.name
        assert data.pipeline_tag == "translation" and {"translation", "custom_code"} <= set(data.tags), path.name
        assert sorted(data.language) == ["de", "en"] and data.datasets, path.name
        assert data.model_name == path.stem, path.name
        assert ModelCardData(**data.to_dict()).to_dict() == data.to_dict(), path.name
        for section in ("## Intended use", "## Limitations", "## Training recipe", "## Licence", "## Citation"):
            assert section in card.text, (path.name, section)
        assert "Attention Is All You Need" in card.text and "vaswani2017attention" in card.text


def test_trained_cards_report_exactly_the_measured_scores_of_their_results_file():
    inputs = trained_inputs()
    assert inputs, "no committed results file: expected at least benchmarks/results/multi30k-10min.json"
    for name, test, source in inputs:
        path = CARDS / name
        assert path.is_file(), f"{name} missing: run python scripts/make_model_cards.py"
        card = ModelCard.load(path)
        results = {r.metric_type: r for r in card.data.eval_results}
        assert set(results) == {"sacrebleu", "chrf"}, name
        for metric, key in (("sacrebleu", "bleu"), ("chrf", "chrf")):
            result = results[metric]
            assert result.metric_value == test[key], (name, metric)  # exactly the measured value
            assert result.metric_config == test[f"{key}_signature"], (name, metric)
            assert result.task_type == "translation" and result.dataset_split, name
            assert f"| {test[key]:.2f} |" in card.text and f"`{test[key + '_signature']}`" in card.text, name
        assert f"{test['n']} sentences" in card.text, name
        assert source.relative_to(ROOT).as_posix() in card.text, name  # names its results file
        assert "Measured by `" in card.text and "not comparable" in card.text, name


def test_multi30k_cards_name_the_command_and_environment_of_their_results():
    for path in MULTI30K_RESULTS:
        report = json.loads(path.read_text(encoding="utf-8"))
        for row in report["results"]:
            text = (CARDS / f"vanilla-transformer-multi30k-{row['direction']}-{row['minutes']:g}min.md").read_text()
            assert f"`python benchmarks/multi30k.py --minutes {row['minutes']:g}" in text
            assert f"torch {report['environment']['torch']}" in text
            assert f"{row['step']} optimizer steps; {row['target_tokens']:,} target tokens" in text


def test_regenerating_from_the_committed_inputs_gives_the_same_bytes(generated):
    assert sorted(generated) == [p.name for p in card_files()], (
        "stale or missing cards: run python scripts/make_model_cards.py"
    )
    for name, text in generated.items():
        assert (CARDS / name).read_bytes() == text.encode("utf-8"), (
            f"{name} is out of date: run python scripts/make_model_cards.py"
        )


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_cards_have_no_scores_and_the_models_parameter_count(preset):
    path = CARDS / f"vanilla-transformer-{preset}.md"
    card = ModelCard.load(path)
    assert card.data.eval_results is None and "model-index" not in path.read_text() and "Not trained here" in card.text
    config = getattr(VanillaTransformerConfig, preset)(vocab_size=37000)
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    count = sum(p.numel() for p in model.parameters())
    assert f"| parameters with a 37,000-token vocabulary | {count:,} (tied matrices counted once) |" in card.text
    assert (
        f"| d_model | {config.d_model} |" in card.text
        and f"| dropout P_drop (residual, embeddings) | {config.dropout} |" in card.text
    )


@pytest.mark.parametrize(("mixed_precision", "processes"), [("bf16", 2), ("no", 1)])
def test_multi30k_rows_record_the_recipe_the_cards_rebuild_the_training_config_from(
    monkeypatch, mixed_precision, processes
):
    """A row of benchmarks/multi30k.py's results holds its recipe; the card's TrainConfig, rebuilt from that
    row, must be the one the script trained with (so a card cannot describe other settings than the run's)."""
    spec = importlib.util.spec_from_file_location("multi30k_benchmark", ROOT / "benchmarks" / "multi30k.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    captured = []
    monkeypatch.setattr(script, "train", lambda config: captured.append(config) or {"step": 1})
    monkeypatch.setenv("WORLD_SIZE", str(processes))  # as under torchrun
    row = json.loads(json.dumps(script.run("de-en", 60.0, Path(cards.MULTI30K_DATA), Path("outputs"), mixed_precision)))
    assert row["recipe"] == script.RECIPE and row["mixed_precision"] == mixed_precision
    rebuilt = cards.multi30k_train_config(
        row["direction"], row["minutes"], row["recipe"], row["mixed_precision"], row["processes"], cards.MULTI30K_DATA
    )
    assert captured == [rebuilt] and rebuilt.max_tokens * processes == script.RECIPE["max_tokens_per_step"]


def test_main_job_card_is_built_from_its_results_and_settings_and_skipped_without_them(tmp_path):
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / cards.MAIN_JOB["config"], tmp_path / cards.MAIN_JOB["config"])
    assert cards.main_job_card(tmp_path) == {}  # no results file: no card, no invented numbers
    # the shape of a training run's results.json and train_config.json (values made up for this test only)
    summary = {
        "step": 7,
        "target_tokens": 1234,
        "loop_seconds": 60.0,
        "stop_reason": "max_minutes",
        "averaged_checkpoints": ["checkpoint-5", "checkpoint-7"],
        "valid_loss": 4.5,
        "valid_nll": 4.0,
        "valid_ppl": 54.6,
        "valid_bleu": 3.21,
        "dropped": {"train": 0},
        "test": {
            "bleu": 12.3456,
            "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
            "chrf": 30.5,
            "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
            "n": 17,
            "seconds": 1.0,
        },
    }
    results = tmp_path / cards.MAIN_JOB["results"]
    results.parent.mkdir(parents=True)
    results.write_text(json.dumps(summary))
    from_yaml = cards.main_job_card(tmp_path)[f"{cards.MAIN_JOB['name']}.md"]
    assert "or 6 minutes" in from_yaml.text and cards.MAIN_JOB["config"] in from_yaml.text
    settings = TrainConfig.from_file(ROOT / cards.MAIN_JOB["config"], max_minutes=20)  # e.g. main.sh --max-minutes 20
    (tmp_path / cards.MAIN_JOB["train_config"]).write_text(json.dumps(settings.__dict__))
    card = ModelCard(str(cards.main_job_card(tmp_path)[f"{cards.MAIN_JOB['name']}.md"]))
    assert "or 20 minutes" in card.text and "`bash scripts/main.sh`" in card.text
    assert [r.metric_value for r in card.data.eval_results] == [12.3456, 30.5]
    assert "| 12.35 |" in card.text and "checkpoint-5, checkpoint-7" in card.text and "CC BY 2.0" in card.text


def test_check_mode_reports_a_card_that_differs(tmp_path, generated):
    for folder in ("configs", "benchmarks/results", "model_cards"):
        (tmp_path / folder).mkdir(parents=True)
    shutil.copy(ROOT / cards.BASE_RECIPE, tmp_path / cards.BASE_RECIPE)
    for path in MULTI30K_RESULTS:
        shutil.copy(path, tmp_path / "benchmarks" / "results" / path.name)
    for name, text in generated.items():
        (tmp_path / "model_cards" / name).write_text(text, encoding="utf-8")
    if (ROOT / cards.MAIN_JOB["results"]).is_file():
        shutil.copytree(ROOT / "model_cards" / "results", tmp_path / "model_cards" / "results")
        shutil.copy(ROOT / cards.MAIN_JOB["config"], tmp_path / cards.MAIN_JOB["config"])
    assert cards.main(["--root", str(tmp_path), "--check"]) == 0
    edited = tmp_path / "model_cards" / "vanilla-transformer-base.md"
    edited.write_text(edited.read_text().replace("63,045,632", "65,000,000"))
    assert cards.main(["--root", str(tmp_path), "--check"]) == 1
