"""The command line: options (help, old spellings, --config files, overrides), errors without tracebacks, and each
command end to end."""

import dataclasses
import gzip
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SENTENCES, SOURCE, TARGET, tiny_model
from safetensors.torch import load_file

from vanilla_transformer import training
from vanilla_transformer.cli import build_parser, main
from vanilla_transformer.training_config import TrainConfig

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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


def test_train_help_shows_every_option_with_its_meaning_and_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no line breaks inside a help text
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["train", "--help"])
    assert done.value.code == 0
    entries = help_entries(capsys.readouterr().out)
    for field in dataclasses.fields(TrainConfig):
        option = "--" + field.name
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        assert option in entries, f"{option} is missing from `train --help`"
        assert " ".join(field.metadata["help"].split()) in entries[option], option
        assert entries[option].endswith(f"(default: {default})"), entries[option]
    assert entries["--mixed_precision"].startswith("--mixed_precision {no,bf16,fp16,auto}, --mixed-precision")
    assert "--config" in entries
    for old in ("--save-every", "--model-json", "--resume", "--no-progress"):  # still accepted, no longer shown
        assert old not in entries


@pytest.mark.parametrize("command", ["average", "evaluate", "translate", "export", "visualize", "explore"])
def test_every_option_of_every_command_is_explained_with_its_default(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    entries = help_entries(capsys.readouterr().out)
    assert "--model_name_or_path" in entries or command == "visualize" and "--output_dir" in entries
    for option, entry in entries.items():
        if option in ("--help", "-h") or not option.startswith("--") or "_" not in option and "-" in option[2:]:
            continue
        text = entry.split(option, 1)[1]
        assert re.search(r"[a-z]{3,}", text), f"{command} {option} has no help"
        assert "(default: " in entry or "required" in entry or option in REQUIRED[command], (
            f"{command} {option}: no default"
        )


REQUIRED = {
    "average": {"--model_name_or_path", "--output_dir"},
    "evaluate": {"--model_name_or_path", "--source", "--reference"},
    "translate": {"--model_name_or_path"},
    "export": {"--model_name_or_path", "--output_dir"},
    "visualize": {"--output_dir"},
    "explore": {"--model_name_or_path"},
}


def test_train_options_reach_the_training_config(trained_with):
    main(
        [
            "train",
            "--dataset_name",
            "corpus",
            "--max_tokens",
            "512",
            "--max-minutes",
            "2.5",
            "--config_overrides",
            '{"d_model": 64}',
            "--resume_from_checkpoint",
            "--disable_tqdm",
            "--use_cpu",
            "--push_to_hub",
            "--hub_model_id",
            "someone/model",
            "--hub_private_repo",
            "--test_split",
            "valid",
            "--gradient_accumulation_steps",
            "2",
        ]
    )
    (config,) = trained_with
    assert config == TrainConfig(
        dataset_name="corpus",
        max_tokens=512,
        max_minutes=2.5,
        config_overrides={"d_model": 64},
        resume_from_checkpoint="latest",
        disable_tqdm=True,
        use_cpu=True,
        push_to_hub=True,
        hub_model_id="someone/model",
        hub_private_repo=True,
        test_split="valid",
        gradient_accumulation_steps=2,
    )
    main(["train", "--resume_from_checkpoint", "run/checkpoints/checkpoint-4", "--model_name_or_path", "run/final"])
    assert (trained_with[1].resume_from_checkpoint, trained_with[1].model_name_or_path) == (
        "run/checkpoints/checkpoint-4",
        "run/final",
    )
    main(["train"])
    assert trained_with[2] == TrainConfig()


def test_older_spellings_of_options_still_work_and_say_what_replaced_them(trained_with, capsys):
    main(
        [
            "train",
            "--data",
            "corpus",
            "--model-json",
            '{"d_model": 64}',
            "--resume",
            "--no-progress",
            "--cpu",
            "--push-to-hub",
            "someone/model",
            "--save-every",
            "7",
            "--gradient-accumulation",
            "2",
            "--src-lang",
            "de",
        ]
    )
    assert trained_with[0] == TrainConfig(
        dataset_name="corpus",
        config_overrides={"d_model": 64},
        resume_from_checkpoint="latest",
        disable_tqdm=True,
        use_cpu=True,
        push_to_hub=True,
        hub_model_id="someone/model",
        save_steps=7,
        gradient_accumulation_steps=2,
        source_lang="de",
    )
    notices = capsys.readouterr().err
    for old, new in (
        ("--data", "--dataset_name"),
        ("--model-json", "--config_overrides"),
        ("--resume", "--resume_from_checkpoint"),
        ("--save-every", "--save_steps"),
        ("--src-lang", "--source_lang"),
    ):
        assert f"{old} is an old spelling of {new}" in notices
    main(["train", "--model", "run/final"])  # once sizes as JSON; a folder now, as for every other command
    assert trained_with[1].model_name_or_path == "run/final"


def test_a_config_file_sets_the_defaults_and_the_command_line_wins_wherever_it_is(tmp_path, trained_with):
    (tmp_path / "run.yaml").write_text(
        "max_steps: 100000\nwarmup_steps: 10\nconfig_overrides:\n  d_model: 64\n  dropout: 0.3\n"
        "test_split: null\ndisable_tqdm: true\n"
    )
    main(["train", "--max_steps", "1000", "--config", str(tmp_path / "run.yaml"), "--seed", "4"])
    main(
        [
            "train",
            "--config",
            str(tmp_path / "run.yaml"),
            "--config_overrides",
            '{"d_model": 32}',
            "--disable_tqdm",
            "false",
        ]
    )
    first, second = trained_with
    # --max_steps 1000 is TrainConfig's default, given before --config: it still wins over the file's 100000
    assert (first.max_steps, first.warmup_steps, first.seed, first.test_split, first.disable_tqdm) == (
        1000,
        10,
        4,
        None,
        True,
    )
    assert first.config_overrides == {"d_model": 64, "dropout": 0.3}
    assert second.config_overrides == {"d_model": 32} and second.max_steps == 100000 and not second.disable_tqdm
    (tmp_path / "run.json").write_text('{"max_minutes": 5, "preset": "big"}')
    main(["train", "--config", str(tmp_path / "run.json")])
    assert (trained_with[2].max_minutes, trained_with[2].preset) == (5, "big")


def test_bad_train_options_are_refused_with_a_message_and_no_traceback(tmp_path, trained_with, capsys):
    for argv, words in (
        (["--max-tokenz", "5"], "unrecognized arguments: --max-tokenz"),
        (["--config_overrides", "{d_model: 64}"], "argument --config_overrides/--config-overrides: not valid JSON"),
        (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
        # a prefix is not taken for the option it starts (argparse's default would train 3 steps silently)
        (["--max_step", "3"], "unrecognized arguments: --max_step 3 (did you mean --max_steps?)"),
        (["--max-tokenz=5"], "unrecognized arguments: --max-tokenz=5 (did you mean --max-tokens?)"),
    ):
        with pytest.raises(SystemExit) as done:
            main(["train", *argv])
        assert done.value.code == 2 and words in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("max_stepz: 7\n")
    (tmp_path / "typo.yaml").write_text("config_overrides:\n  d_modl: 64\n")
    (tmp_path / "typed.yaml").write_text("max_steps: many\n")
    for argv, words in (
        (["--max_tokens", "0"], "TrainConfig: max_tokens=0 is out of range"),
        (
            ["--config_overrides", '{"d_modl": 64}'],
            "'d_modl' is not a setting of VanillaTransformerConfig. Did you mean 'd_model'?",
        ),
        (["--config", str(tmp_path / "bad.yaml")], "unknown training option(s) ['max_stepz']"),
        (["--config", str(tmp_path / "typo.yaml")], "typo.yaml: config_overrides: 'd_modl' is not a setting"),
        (
            ["--config", str(tmp_path / "typed.yaml")],
            "typed.yaml: max_steps = 'many' is a str, but max_steps takes int",
        ),
        (["--train_file", "pairs.tsv"], "train_file='pairs.tsv' needs validation_file too"),
    ):
        assert main(["train", *argv]) == 1
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err
    assert trained_with == []


def test_a_missing_model_folder_prints_the_message_alone_and_debug_adds_the_traceback(tmp_path, capsys):
    assert main(["translate", "--model_name_or_path", str(tmp_path / "nowhere"), "Hallo."]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vanilla-transformer translate: error: ") and "is not a saved model folder" in err
    assert "Traceback" not in err and len(err.splitlines()) == 2
    with pytest.raises(ValueError, match="is not a saved model folder"):
        main(["--debug", "translate", "--model_name_or_path", str(tmp_path / "nowhere"), "Hallo."])


def test_version(capsys):
    from vanilla_transformer import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"vanilla-transformer {__version__}"
    # the version comes from the package metadata, which pyproject.toml sets
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    assert __version__ == re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)


# ------------------------------------------------------------------ translate, evaluate, average
def test_translate_prints_one_line_per_sentence(saved, capsys):
    assert (
        main(
            [
                "translate",
                "--model_name_or_path",
                str(saved),
                "--num_beams",
                "1",
                "--device",
                "cpu",
                SOURCE,
                "Zwei Hunde.",
            ]
        )
        == 0
    )
    assert len(capsys.readouterr().out.splitlines()) == 2


def _translate_process(saved: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "helpers" / "peak_memory.py"),
            "translate",
            "--model_name_or_path",
            str(saved),
            "--num_beams",
            "1",
            "--device",
            "cpu",
            *extra,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def test_translate_keeps_one_output_line_per_input_line_blank_ones_included(saved, tmp_path):
    lines = [SOURCE, "", "Zwei Hunde spielen im Schnee.", "   ", "Eine Frau liest ein Buch."]
    process = _translate_process(saved)
    out, err = process.communicate("\n".join(lines).encode() + b"\n", timeout=120)
    assert process.returncode == 0, err.decode()[-2000:]
    printed = out.decode().split("\n")[:-1]
    assert len(printed) == len(lines)
    assert printed[1] == "" and printed[3] == "" and printed[0] and printed[2] and printed[4]


def test_translate_answers_each_line_as_it_arrives(saved):
    process = _translate_process(saved)
    try:
        process.stdin.write(f"{SOURCE}\n".encode())
        process.stdin.flush()
        # standard input is still open: the line must be translated without waiting for more
        assert select.select([process.stdout], [], [], 120)[0], "no translation while the input stays open"
        first = process.stdout.readline()
        assert first.strip(), process.stderr.read1().decode() if first == b"" else first
        process.stdin.write(b"\nZwei Hunde.\n")
        process.stdin.close()
        rest = process.stdout.read().decode().split("\n")[:-1]
        assert rest[0] == "" and rest[1] and len(rest) == 2
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_translate_streams_a_long_input_in_bounded_memory(saved):
    """100,000 lines need no more memory than 1,000: lines are read, translated and printed batch by batch."""
    peaks = {}
    for n in (1_000, 100_000):
        process = _translate_process(saved, "--batch_size", "500", "--max_new_tokens", "2")
        lines = (SENTENCES[i % len(SENTENCES)] for i in range(n))
        out, err = process.communicate("".join(f"{line}\n" for line in lines).encode(), timeout=600)
        assert process.returncode == 0, err.decode()[-2000:]
        assert out.count(b"\n") == n
        peaks[n] = int(re.search(rb"peak RSS (\d+) kB", err).group(1))
    assert peaks[100_000] - peaks[1_000] < 40_000, peaks  # kB


def test_translate_stops_at_a_line_that_is_not_utf8_and_names_it(saved):
    process = _translate_process(saved)
    out, err = process.communicate(f"{SOURCE}\n".encode() + "Straße\n".encode("latin-1"), timeout=120)
    assert process.returncode == 1
    err = err.decode()
    assert "standard input, line 2, is not UTF-8" in err and "iconv" in err and "Traceback" not in err


def test_evaluate_scores_and_writes_the_hypotheses(saved, tmp_path, capsys):
    (tmp_path / "src.de").write_text("\n".join(SENTENCES[::2]) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "ref.en.gz", "wt", encoding="utf-8") as f:  # the bundled test sets are gzipped
        f.write("\n".join(SENTENCES[1::2]) + "\n")
    argv = [
        "evaluate",
        "--model_name_or_path",
        str(saved),
        "--source",
        str(tmp_path / "src.de"),
        "--reference",
        str(tmp_path / "ref.en.gz"),
        "--output",
        str(tmp_path / "hyp.en"),
        "--num_beams",
        "2",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^BLEU \d+\.\d\d  nrefs:1", printed, re.M) and re.search(
        r"^chrF \d+\.\d\d  nrefs:1", printed, re.M
    )
    assert len((tmp_path / "hyp.en").read_text(encoding="utf-8").splitlines()) == 3


def test_evaluate_names_a_file_that_is_not_utf8(saved, tmp_path, capsys):
    (tmp_path / "src.de").write_bytes("Gr\u00fc\u00dfe\n".encode("latin-1"))
    (tmp_path / "ref.en").write_text("Greetings\n", encoding="utf-8")
    argv = [
        "evaluate",
        "--model_name_or_path",
        str(saved),
        "--source",
        str(tmp_path / "src.de"),
        "--reference",
        str(tmp_path / "ref.en"),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'src.de'} is not UTF-8: line 1" in err and "Traceback" not in err


def test_average_writes_the_mean_of_the_checkpoints_into_a_folder_that_translates(saved, tmp_path, capsys):
    other = tmp_path / "other"
    tiny_model(seed=1, vocab_size=len(load_file(saved / "model.safetensors")["model.shared.weight"])).save_pretrained(
        other
    )
    argv = [
        "average",
        str(saved),
        str(other),
        "--model_name_or_path",
        str(saved),
        "--output_dir",
        str(tmp_path / "avg"),
    ]
    assert main(argv) == 0
    assert "averaged 2 checkpoints" in capsys.readouterr().out
    a, b = load_file(saved / "model.safetensors"), load_file(other / "model.safetensors")
    averaged = load_file(tmp_path / "avg" / "model.safetensors")
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (a[name] + b[name]) / 2, rtol=0, atol=1e-6)
    assert {"tokenizer.json", "generation_config.json", "config.json"} <= {p.name for p in (tmp_path / "avg").iterdir()}
    assert (
        main(["translate", "--model_name_or_path", str(tmp_path / "avg"), "--num_beams", "1", SOURCE]) == 0
    )  # the next step
    assert capsys.readouterr().out.strip()


# ------------------------------------------------------------------ visualize
def test_visualize_command_writes_every_picture(tmp_path, saved, capsys):
    pytest.importorskip("matplotlib")
    from vanilla_transformer.visualization import FILES

    out = tmp_path / "pictures"
    argv = [
        "visualize",
        "--output_dir",
        str(out),
        "--model_name_or_path",
        str(saved),
        "--source",
        SOURCE,
        "--target",
        TARGET,
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(printed) == sorted(str(out / name) for name in FILES.values())
    for name in FILES.values():
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE

    assert main(["visualize", "--output_dir", str(tmp_path / "plain")]) == 0  # no model: no attention maps
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == sorted(
        FILES[k] for k in ("architecture", "positional_encoding", "masks", "learning_rate", "label_smoothing")
    )
    assert (
        main(["visualize", "--output_dir", str(tmp_path / "x"), "--model_name_or_path", str(saved)]) == 1
    )  # no --source
    assert "--source" in capsys.readouterr().err
    bad = [
        "visualize",
        "--output_dir",
        str(tmp_path / "y"),
        "--model_name_or_path",
        str(saved),
        "--source",
        SOURCE,
        "--layer",
        "5",
    ]
    assert main(bad) == 1 and "layer 5 does not exist" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()  # checked before anything is drawn


# ------------------------------------------------------------------ explore
def test_explore_without_gradio_says_how_to_install_it(saved, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` fails as if it were not installed
    assert main(["explore", "--model_name_or_path", str(saved)]) == 1
    assert "[app]" in capsys.readouterr().err


def test_explore_refuses_a_folder_that_holds_no_model(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["explore", "--model_name_or_path", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no config.json" in err and "vanilla-transformer train" in err and "Traceback" not in err


def test_no_command_line_of_the_repository_takes_an_abbreviated_option():
    """Every argparse parser (the package's, the benchmarks', scripts' and examples') sets ``allow_abbrev=False``,
    so that a misspelt option that happens to be a prefix is refused rather than read as another."""
    root = Path(__file__).resolve().parents[1]
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True).stdout.split()
    calls = {}
    for name in tracked:
        text = (root / name).read_text(encoding="utf-8")
        for match in re.finditer(r"argparse\.ArgumentParser\((.{0,40})", text, flags=re.S):
            calls[f"{name}:{text[: match.start()].count(chr(10)) + 1}"] = match.group(1)
    assert len(calls) >= 20
    loose = [where for where, head in calls.items() if "allow_abbrev=False" not in head]
    assert not loose, f"argparse.ArgumentParser without allow_abbrev=False: {loose}"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["translate", "--model_name_or_path", "m", "--num_beam", "2", "hi"])
