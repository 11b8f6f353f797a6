"""The command line: `train` options (help, --config files, overrides)."""

import dataclasses
import re

import pytest

from vanilla_transformer import training
from vanilla_transformer.cli import build_parser, main
from vanilla_transformer.training_config import TrainConfig


@pytest.fixture
def trained_with(monkeypatch):
    """Runs `train` commands without training: the TrainConfig each would have trained with."""
    configs = []
    monkeypatch.setattr(training, "train", lambda config: configs.append(config) or {})
    return configs


# ------------------------------------------------------------------ train
def help_entries(text: str) -> dict[str, str]:
    """The entries of an argparse help text, by option (each entry's lines joined)."""
    entries: dict[str, str] = {}
    for block in re.split(r"\n(?=  -)", text.split("options:\n", 1)[1]):
        options = block.strip().splitlines()[0].split("  ")[0]  # the first line, up to the help
        for option in re.findall(r"--[\w-]+", options):
            entries[option] = " ".join(block.split())
    return entries


def test_train_help_shows_every_option_with_its_meaning_and_default(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["train", "--help"])
    assert done.value.code == 0
    entries = help_entries(capsys.readouterr().out)
    for field in dataclasses.fields(TrainConfig):
        option = "--" + field.name.replace("_", "-")
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        assert option in entries, f"{option} is missing from `train --help`"
        assert " ".join(field.metadata["help"].split()) in entries[option], option
        assert entries[option].endswith(f"(default: {default})"), entries[option]
    assert entries["--no-progress"].startswith("--no_progress, --no-progress hide progress bars")
    assert entries["--model-json"].startswith("--model JSON, --model-json JSON")
    assert entries["--mixed-precision"].startswith("--mixed_precision {no,bf16,fp16,auto}")
    assert "--config" in entries


def test_train_options_reach_the_training_config(trained_with):
    main(["train", "--data", "corpus", "--max-tokens", "512", "--max-minutes", "2.5", "--model-json", '{"d_model": 64}',
          "--resume", "--no-progress", "--cpu", "--push-to-hub", "someone/model", "--test-split", "valid"])  # fmt: skip
    (config,) = trained_with
    assert config == TrainConfig(data="corpus", max_tokens=512, max_minutes=2.5, model={"d_model": 64}, resume=True,
                                 progress=False, cpu=True, push_to_hub="someone/model", test_split="valid")  # fmt: skip
    main(["train"])
    assert trained_with[1] == TrainConfig()


def test_a_config_file_sets_the_defaults_and_the_command_line_wins_wherever_it_is(tmp_path, trained_with):
    (tmp_path / "run.yaml").write_text("max_steps: 100000\nwarmup_steps: 10\nmodel:\n  d_model: 64\n  dropout: 0.3\n"
                                       "test_split: null\nprogress: false\n")  # fmt: skip
    main(["train", "--max-steps", "1000", "--config", str(tmp_path / "run.yaml"), "--seed", "4"])
    main(["train", "--config", str(tmp_path / "run.yaml"), "--model-json", '{"d_model": 32}', "--progress"])
    first, second = trained_with
    # --max-steps 1000 is TrainConfig's default, given before --config: it still wins over the file's 100000
    assert (first.max_steps, first.warmup_steps, first.seed, first.test_split, first.progress) == (1000, 10, 4, None, False)
    assert first.model == {"d_model": 64, "dropout": 0.3}
    assert second.model == {"d_model": 32} and second.max_steps == 100000 and second.progress  # the JSON replaces the file's
    (tmp_path / "run.json").write_text('{"max_minutes": 5, "preset": "big"}')
    main(["train", "--config", str(tmp_path / "run.json")])
    assert (trained_with[2].max_minutes, trained_with[2].preset) == (5, "big")


def test_bad_train_options_are_refused(tmp_path, trained_with, capsys):
    for argv, words in ((["--max-tokenz", "5"], "unrecognized arguments: --max-tokenz"),
                        (["--model-json", "{d_model: 64}"], "argument --model/--model-json: invalid dict value"),
                        (["--preset", "huge"], "argument --preset: invalid choice: 'huge'")):  # fmt: skip
        with pytest.raises(SystemExit) as done:
            main(["train", *argv])
        assert done.value.code == 2 and words in capsys.readouterr().err
    with pytest.raises(ValueError, match="TrainConfig: max_tokens=0 is out of range"):
        main(["train", "--max-tokens", "0"])
    (tmp_path / "bad.yaml").write_text("max_stepz: 7\n")
    with pytest.raises(ValueError, match=r"unknown training option\(s\) \['max_stepz'\]"):
        main(["train", "--config", str(tmp_path / "bad.yaml")])
    assert trained_with == []
