"""The shipped recipes and examples run: the WMT14 base recipe for two steps on local data, the
example training script, and the README's main-job configuration on a tiny budget."""

import json
import sys
from pathlib import Path

import pytest
import yaml

from vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.training import train
from vanilla_transformer.training_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


def test_accelerate_configs_are_valid_yaml_for_their_setups():
    configs = {p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "configs" / "accelerate").glob("*.yaml")}
    assert configs["1gpu"]["num_processes"] == 1
    assert configs["8gpu"]["num_processes"] == 8 and configs["8gpu"]["distributed_type"] == "MULTI_GPU"
    assert configs["multinode"]["num_machines"] > 1 and "main_process_ip" in configs["multinode"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda path: path.name)
def test_each_recipe_loads_into_train_config_and_names_only_files_that_exist(recipe):
    values = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    config = TrainConfig.from_file(recipe)
    assert {name: getattr(config, name) for name in values} == values  # every key is a setting, read as written
    for name in ("train_file", "validation_file", "test_file", "tokenizer_name", "model_name_or_path"):
        path = getattr(config, name)
        if path is not None and not str(path).startswith(("http", "hf://")) and "/" in str(path):
            assert (ROOT / path).exists() or Path(path).exists(), f"{recipe.name}: {name}={path!r} does not exist"
    if str(config.dataset_name).startswith(("data/", "./", "../")):  # a local corpus, not a Hub dataset
        assert (ROOT / config.dataset_name).is_dir(), (
            f"{recipe.name}: dataset_name={config.dataset_name!r} is not a folder"
        )
    else:
        assert config.dataset_config_name, f"{recipe.name}: a Hub dataset needs its configuration"


@pytest.mark.slow
def test_the_paper_recipe_runs_two_steps_on_local_data(corpus, tmp_path):
    recipe = TrainConfig.from_file(ROOT / "configs" / "wmt14_en_de_base.yaml")
    assert (recipe.preset, recipe.warmup_steps, recipe.label_smoothing_factor, recipe.average_last) == (
        "base",
        4000,
        0.1,
        5,
    )
    assert recipe.max_tokens * 8 == 25000 and recipe.vocab_size == 37000
    # Same recipe; only what needs the network (Hub data, TensorBoard) or a GPU (bf16) is swapped.
    config = TrainConfig.from_file(
        ROOT / "configs" / "wmt14_en_de_base.yaml",
        dataset_name=str(corpus),
        dataset_config_name=None,
        max_steps=2,
        save_steps=1,
        eval_steps=2,
        eval_bleu_sentences=0,
        test_split=None,
        report_to=None,
        mixed_precision="no",
        output_dir=str(tmp_path / "run"),
        disable_tqdm=True,
        max_tokens=600,
    )
    summary = train(config)
    assert summary["step"] == 2 and summary["averaged_checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    saved = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    base = VanillaTransformerConfig.base()
    assert (saved["d_model"], saved["encoder_layers"], saved["encoder_ffn_dim"]) == (
        base.d_model,
        6,
        base.encoder_ffn_dim,
    )


@pytest.mark.slow
def test_the_main_job_configuration_runs_on_a_tiny_budget(corpus, tmp_path):
    config = TrainConfig.from_file(
        ROOT / "configs" / "tatoeba_en_de_small.yaml",
        dataset_name=str(corpus),
        vocab_size=500,
        max_steps=4,
        save_steps=2,
        eval_steps=4,
        eval_bleu_sentences=4,
        output_dir=str(tmp_path / "run"),
        disable_tqdm=True,
    )
    summary = train(config)
    assert summary["test"]["n"] == 40 and (tmp_path / "run" / "final" / "README.md").is_file()


def test_the_example_training_script_learns_and_reports_sacrebleu(corpus, capsys):
    import train_translation

    result = train_translation.main(
        [
            "--data",
            str(corpus),
            "--steps",
            "40",
            "--vocab-size",
            "400",
            "--d-model",
            "32",
            "--max-tokens",
            "400",
            "--eval-sentences",
            "10",
        ]
    )
    printed = capsys.readouterr().out
    losses = [float(line.split("loss ")[1].split()[0]) for line in printed.splitlines() if line.startswith("step ")]
    assert len(losses) == 1 and losses[0] < 6.0  # from ~6.2 (uniform over ~400 tokens) at the start
    assert result["n"] == 10 and "sacreBLEU" in printed
