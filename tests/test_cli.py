"""The command line: `train` options (help, --config files, overrides), and the other commands end to end."""

import dataclasses
import re
import sys

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file

from vanilla_transformer import training
from vanilla_transformer.cli import build_parser, main
from vanilla_transformer.tokenization import train_joint_bpe
from vanilla_transformer.training_config import TrainConfig

SOURCE, TARGET = "Ein Mann fährt Fahrrad auf der Straße.", "A man rides a bike on the street."
SENTENCES = [SOURCE, TARGET, "Zwei Hunde spielen im Schnee.", "Two dogs play in the snow.",
             "Eine Frau liest ein Buch.", "A woman reads a book."]  # fmt: skip
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder holding a tiny (untrained) model and its tokenizer."""
    folder = tmp_path_factory.mktemp("saved")
    tokenizer = train_joint_bpe(SENTENCES * 3, vocab_size=400, min_frequency=1)
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.source_length_offset = 4  # short outputs: an untrained model rarely stops
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


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


# ------------------------------------------------------------------ translate, evaluate, average
def test_translate_prints_one_line_per_sentence(saved, capsys):
    assert main(["translate", "--model", str(saved), "--num-beams", "1", "--device", "cpu", SOURCE, "Zwei Hunde."]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_evaluate_scores_and_writes_the_hypotheses(saved, tmp_path, capsys):
    (tmp_path / "src.de").write_text("\n".join(SENTENCES[::2]) + "\n", encoding="utf-8")
    (tmp_path / "ref.en").write_text("\n".join(SENTENCES[1::2]) + "\n", encoding="utf-8")
    argv = ["evaluate", "--model", str(saved), "--source", str(tmp_path / "src.de"), "--reference",
            str(tmp_path / "ref.en"), "--output", str(tmp_path / "hyp.en"), "--num-beams", "2"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^BLEU \d+\.\d\d  nrefs:1", printed, re.M) and re.search(r"^chrF \d+\.\d\d  nrefs:1", printed, re.M)
    assert len((tmp_path / "hyp.en").read_text(encoding="utf-8").splitlines()) == 3


def test_average_writes_the_mean_of_the_checkpoints(saved, tmp_path, capsys):
    other = tmp_path / "other"
    tiny_model(seed=1, vocab_size=len(load_file(saved / "model.safetensors")["model.shared.weight"])).save_pretrained(other)
    assert main(["average", str(saved), str(other), "--model", str(saved), "--output-dir", str(tmp_path / "avg")]) == 0
    assert "averaged 2 checkpoints" in capsys.readouterr().out
    a, b = load_file(saved / "model.safetensors"), load_file(other / "model.safetensors")
    averaged = load_file(tmp_path / "avg" / "model.safetensors")
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (a[name] + b[name]) / 2, rtol=0, atol=1e-6)


# ------------------------------------------------------------------ visualize
def test_visualize_command_writes_every_picture(tmp_path, saved, capsys):
    pytest.importorskip("matplotlib")
    from vanilla_transformer.visualization import FILES

    out = tmp_path / "pictures"
    assert main(["visualize", "--output-dir", str(out), "--model", str(saved), "--source", SOURCE, "--target", TARGET]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(printed) == sorted(str(out / name) for name in FILES.values())
    for name in FILES.values():
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE

    assert main(["visualize", "--output-dir", str(tmp_path / "plain")]) == 0  # no model: no attention maps
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == sorted(
        FILES[k] for k in ("positional_encoding", "masks", "learning_rate", "label_smoothing")
    )
    assert main(["visualize", "--output-dir", str(tmp_path / "x"), "--model", str(saved)]) == 2  # no --source
    assert "--source" in capsys.readouterr().err
    bad = ["visualize", "--output-dir", str(tmp_path / "y"), "--model", str(saved), "--source", SOURCE, "--layer", "5"]
    assert main(bad) == 2 and "layer 5 does not exist" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()  # checked before anything is drawn


# ------------------------------------------------------------------ explore
def test_explore_without_gradio_says_how_to_install_it(saved, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` fails as if it were not installed
    assert main(["explore", "--model", str(saved)]) == 1
    assert "pip install 'vanilla-transformer[app]'" in capsys.readouterr().err


def test_explore_refuses_a_folder_that_holds_no_model(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["explore", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no config.json" in err and "vanilla-transformer train" in err and "Traceback" not in err
