"""The settings of a training run: defaults, range checks, files, and the help of every field."""

import dataclasses
import json

import pytest

from vanilla_transformer.training import TrainConfig as ReExported
from vanilla_transformer.training_config import PRESETS, TrainConfig, options_from_file


def test_every_field_says_what_it_means():
    for field in dataclasses.fields(TrainConfig):
        assert len(field.metadata.get("help", "")) > 10, f"TrainConfig.{field.name} has no help"
        assert "%" not in field.metadata["help"], f"TrainConfig.{field.name}: argparse would read % as a format"


def test_the_defaults_are_the_papers_recipe():
    config = TrainConfig()
    assert (config.preset, config.warmup_steps, config.label_smoothing_factor, config.average_last) == (
        "base",
        4000,
        0.1,
        5,
    )
    assert (config.adam_beta1, config.adam_beta2, config.adam_epsilon, config.generation_num_beams) == (
        0.9,
        0.98,
        1e-9,
        4,
    )
    assert (
        config.config_overrides == {} and config.config_overrides is not TrainConfig().config_overrides
    )  # a fresh dict each time
    assert ReExported is TrainConfig  # `from vanilla_transformer.training import TrainConfig` still works


@pytest.mark.parametrize(
    "overrides, words",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(mixed_precision="fp8"), "mixed_precision"),
        (dict(label_smoothing_factor=1.0), "label_smoothing_factor"),
        (dict(preset="huge"), "preset"),
        (dict(attention_pictures=-1), "attention_pictures"),
        (dict(max_minutes=0), "max_minutes"),
    ],
)
def test_out_of_range_options_are_rejected(overrides, words):
    with pytest.raises(ValueError, match=f"TrainConfig: {words}=.* is out of range"):
        TrainConfig(**overrides)


def test_every_preset_is_accepted():
    assert [TrainConfig(preset=preset).preset for preset in PRESETS] == list(PRESETS)


def test_options_from_yaml_and_json_files_and_unknown_keys(tmp_path):
    (tmp_path / "run.yaml").write_text("max_steps: 7\nconfig_overrides:\n  d_model: 64\ntest_split: null\n")
    config = TrainConfig.from_file(tmp_path / "run.yaml", seed=5)
    assert (config.max_steps, config.config_overrides, config.seed, config.test_split) == (7, {"d_model": 64}, 5, None)
    (tmp_path / "run.json").write_text(json.dumps({"max_steps": 9, "mixed_precision": "bf16"}))
    assert options_from_file(tmp_path / "run.json") == {"max_steps": 9, "mixed_precision": "bf16"}
    assert TrainConfig.from_file(tmp_path / "run.json", max_steps=3).max_steps == 3  # overrides win
    (tmp_path / "empty.yaml").write_text("")
    assert TrainConfig.from_file(tmp_path / "empty.yaml") == TrainConfig()
    (tmp_path / "bad.yaml").write_text("max_stepz: 7\n")
    with pytest.raises(ValueError, match=r"bad.yaml: unknown training option\(s\) \['max_stepz'\]"):
        TrainConfig.from_file(tmp_path / "bad.yaml")


def test_a_saved_train_config_json_reads_back_as_the_same_settings(tmp_path):
    """The training command writes dataclasses.asdict(config) to train_config.json; it is a valid config file."""
    config = TrainConfig(config_overrides={"d_model": 64}, max_minutes=3.5, attention_pictures=2)
    (tmp_path / "train_config.json").write_text(json.dumps(dataclasses.asdict(config)))
    assert TrainConfig.from_file(tmp_path / "train_config.json") == config


def test_a_misspelt_model_setting_is_refused_wherever_it_is_given(tmp_path):
    """A name that is not a VanillaTransformerConfig setting would train the preset's size and be saved as is."""
    with pytest.raises(
        ValueError, match="'d_modl' is not a setting of VanillaTransformerConfig. Did you mean 'd_model'"
    ):
        TrainConfig(config_overrides={"d_modl": 64})
    (tmp_path / "run.yaml").write_text("config_overrides:\n  d_modl: 64\n")
    with pytest.raises(ValueError, match=r"run.yaml: config_overrides: 'd_modl' is not a setting"):
        options_from_file(tmp_path / "run.yaml")


def test_a_file_with_bad_syntax_or_a_wrong_type_names_the_file_line_and_option(tmp_path):
    (tmp_path / "broken.yaml").write_text("max_steps: 7\nseed: [1\n")
    with pytest.raises(ValueError, match=r"broken.yaml, line \d+, column \d+: not valid YAML"):
        options_from_file(tmp_path / "broken.yaml")
    (tmp_path / "broken.json").write_text('{"max_steps": 7,}')
    with pytest.raises(ValueError, match=r"broken.json, line 1, column \d+: not valid JSON"):
        options_from_file(tmp_path / "broken.json")
    (tmp_path / "typed.yaml").write_text("max_steps: many\n")
    with pytest.raises(ValueError, match=r"typed.yaml: max_steps = 'many' is a str, but max_steps takes int"):
        options_from_file(tmp_path / "typed.yaml")
    (tmp_path / "float.yaml").write_text("max_minutes: 2\nlr_factor: 1\nmax_grad_norm: null\n")
    assert options_from_file(tmp_path / "float.yaml") == {"max_minutes": 2, "lr_factor": 1, "max_grad_norm": None}


def test_older_option_names_in_a_file_still_work_and_say_what_replaced_them(tmp_path, capsys):
    (tmp_path / "old.yaml").write_text("save_every: 7\nresume: true\nprogress: false\nmodel:\n  d_model: 64\n")
    config = TrainConfig.from_file(tmp_path / "old.yaml")
    assert (config.save_steps, config.resume_from_checkpoint, config.disable_tqdm, config.config_overrides) == (
        7,
        "latest",
        True,
        {"d_model": 64},
    )
    notices = capsys.readouterr().err
    assert (
        "'save_every' is an old name of 'save_steps'" in notices
        and "'model' is an old name of 'config_overrides'" in notices
    )
    (tmp_path / "both.yaml").write_text("save_every: 7\nsave_steps: 8\n")
    with pytest.raises(ValueError, match="both 'save_every' and its new name 'save_steps' are set"):
        options_from_file(tmp_path / "both.yaml")
