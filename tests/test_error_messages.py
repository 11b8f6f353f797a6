"""Bad input meets a clear error: every case of the table in docs/errors.md is run here.

Each case gives wrong input to the public API and expects an error whose message contains a given
phrase (what is wrong, which value, what to do). ``docs/errors.md`` is generated from the messages
these cases raise, so the documentation cannot drift from the code:

    python tests/test_error_messages.py      # rewrites docs/errors.md
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from conftest import random_ids, tiny_model  # noqa: E402

from vanilla_transformer import (  # noqa: E402
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    training,  # noqa: E402
)
from vanilla_transformer.checkpoints import average_checkpoints  # noqa: E402
from vanilla_transformer.cli import main as cli  # noqa: E402
from vanilla_transformer.data import load_parallel_corpus  # noqa: E402
from vanilla_transformer.deployment import CTranslate2Translator, export_ctranslate2  # noqa: E402
from vanilla_transformer.evaluation import evaluate_model, translate  # noqa: E402
from vanilla_transformer.explorer import Explorer, translate_candidates  # noqa: E402
from vanilla_transformer.tokenization import check_tokenizer_matches_model, train_joint_bpe  # noqa: E402
from vanilla_transformer.training import train  # noqa: E402
from vanilla_transformer.training_config import TrainConfig  # noqa: E402

DOC = ROOT / "docs" / "errors.md"
SENTENCES = ["A dog runs.", "Two men talk.", "The cat sleeps.", "It rains today."]


@dataclass
class Case:
    area: str
    what: str
    trigger: Callable[[Path], object]  # gets an empty folder to write files into
    expect: str  # a phrase the message must contain
    error: type[BaseException] = ValueError


def _lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _tokenizer():
    return train_joint_bpe(SENTENCES * 3, vocab_size=300)


def _model_for(tokenizer, **overrides) -> VanillaTransformerForConditionalGeneration:
    return tiny_model(vocab_size=len(tokenizer), **overrides)


def _corpus(folder: Path, en: list[str], de: list[str]) -> Path:
    _lines(folder / "train.en", en)
    _lines(folder / "train.de", de)
    return folder


def _command(argv: list[str]) -> None:
    """``vanilla-transformer ARGV`` as a user runs it: on failure, SystemExit with what it printed as ``.printed``."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = cli(argv)
        except SystemExit as stop:  # argparse's usage errors
            code = stop.code
    if code:
        error = SystemExit(code)
        lines = err.getvalue().strip().splitlines()
        error.printed = next((line for line in lines if "error:" in line), lines[-1])
        raise error


def _latin1(path: Path) -> Path:
    path.write_bytes("Grüße aus Köln.\n".encode("latin-1"))
    return path


def _saved_model(folder: Path) -> Path:
    tiny_model().save_pretrained(folder / "model")
    return folder / "model"


def _translator_model(folder: Path, **flags) -> Path:
    """A saved model with its tokenizer, as `vanilla-transformer export` takes it."""
    tokenizer = _tokenizer()
    model = _model_for(tokenizer)
    for name, value in flags.items():
        setattr(model.config, name, value)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return folder / "model"


def _export_over_an_export(folder: Path) -> None:
    export_ctranslate2(_translator_model(folder), folder / "export")
    export_ctranslate2(folder / "model", folder / "export")


def _sentence_past_the_position_table(folder: Path) -> None:
    export_ctranslate2(_translator_model(folder), folder / "export", max_positions=8)
    CTranslate2Translator(folder / "export").translate(["Two men talk. " * 4], max_new_tokens=4)


def _truncated_weights(folder: Path) -> None:
    model = _saved_model(folder)
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    average_checkpoints([model])


def _foreign_config(folder: Path) -> None:
    model = _saved_model(folder)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "bart"}))
    VanillaTransformerForConditionalGeneration.from_pretrained(model)


def _unknown_hub_dataset(folder: Path) -> None:
    import datasets

    def not_found(name, *args, **kwargs):  # what the Hub answers for a name it does not know
        raise datasets.exceptions.DatasetNotFoundError(f"Dataset '{name}' doesn't exist on the Hub")

    original, datasets.load_dataset = datasets.load_dataset, not_found
    try:
        load_parallel_corpus("wmt99", "en", "de")
    finally:
        datasets.load_dataset = original


def _tiny_run(folder: Path, **overrides) -> TrainConfig:
    """Two training steps of a very small model on a 16-pair corpus, a checkpoint after each."""
    for split in ("train", "valid"):
        _lines(folder / f"{split}.en", SENTENCES * 4)
        _lines(folder / f"{split}.de", SENTENCES[::-1] * 4)
    size = {
        "d_model": 16,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 32,
        "decoder_ffn_dim": 32,
    }
    values = dict(
        dataset_name=str(folder),
        output_dir=str(folder / "run"),
        vocab_size=300,
        config_overrides=size,
        max_tokens=64,
        max_steps=2,
        warmup_steps=1,
        save_steps=1,
        eval_steps=1000,
        eval_bleu_sentences=0,
        test_split=None,
        disable_tqdm=True,
    )
    return TrainConfig(**{**values, **overrides})


def _resume_with_another_size(folder: Path) -> None:
    train(_tiny_run(folder))
    config = _tiny_run(folder, max_steps=4, resume_from_checkpoint="latest")
    train(dataclasses.replace(config, config_overrides={**config.config_overrides, "d_model": 32}))


def _non_finite_loss(folder: Path) -> None:
    real = training.loss_sums

    def poisoned(model, batch, smoothing, workspace=None):  # the second update's loss becomes NaN
        smoothed, nll = real(model, batch, smoothing, workspace)
        poisoned.calls += 1
        return (smoothed * float("nan") if poisoned.calls == 2 else smoothed), nll

    poisoned.calls = 0
    with mock.patch.object(training, "loss_sums", poisoned):
        train(_tiny_run(folder))


def _disk_full_during_a_checkpoint(folder: Path) -> None:
    from accelerate import Accelerator

    real = Accelerator.save_state

    def full_disk(self, output_dir=None, **kwargs):  # the second checkpoint runs out of space half-way
        if output_dir.endswith("checkpoint-2"):
            (Path(output_dir) / "model.safetensors").parent.mkdir(parents=True, exist_ok=True)
            (Path(output_dir) / "model.safetensors").write_bytes(b"\0" * 64)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, output_dir, **kwargs)

    with mock.patch.object(Accelerator, "save_state", full_disk):
        train(_tiny_run(folder))


M = tiny_model  # a fresh tiny model (vocabulary of 61) for the model-input cases
CASES = [
    # ---------------------------------------------------------------- configuration
    Case(
        "configuration",
        "heads that do not divide d_model",
        lambda d: VanillaTransformerConfig(d_model=100),
        "must be divisible by the number of heads",
    ),
    Case(
        "configuration",
        "dropout of 1.0",
        lambda d: VanillaTransformerConfig(dropout=1.0),
        "a dropout probability must lie in [0, 1)",
    ),
    Case(
        "configuration",
        "a special token id outside the vocabulary",
        lambda d: VanillaTransformerConfig(vocab_size=10, eos_token_id=10),
        "a token id must lie in [0, vocab_size=10)",
    ),
    Case(
        "configuration",
        "an unknown position encoding",
        lambda d: VanillaTransformerConfig(position_embedding_type="rotary"),
        "'sinusoidal' (the paper) or 'learned'",
    ),
    Case(
        "configuration",
        "a negative layer count",
        lambda d: VanillaTransformerConfig(encoder_layers=-1),
        "it must be a positive integer",
    ),
    Case(
        "configuration",
        "a head size (head_dim) of 0",
        lambda d: VanillaTransformerConfig(head_dim=0),
        "`head_dim` = 0 is invalid: it must be a positive integer or None",
    ),
    Case("training options", "max_tokens=0", lambda d: TrainConfig(max_tokens=0), "max_tokens=0 is out of range"),
    Case(
        "training options",
        "an unknown mixed precision",
        lambda d: TrainConfig(mixed_precision="fp8"),
        "mixed_precision='fp8' is out of range",
    ),
    Case(
        "training options",
        "a misspelt option in a YAML file",
        lambda d: TrainConfig.from_file(_lines(d / "run.yaml", ["max_stepz: 7"])),
        "max_stepz",
    ),
    # ---------------------------------------------------------------- model inputs
    Case(
        "model inputs",
        "a token id >= vocab_size",
        lambda d: M()(input_ids=torch.tensor([[4, 5, 61]]), decoder_input_ids=torch.tensor([[1]])),
        "token id 61, outside the model's vocabulary [0, 61)",
    ),
    Case(
        "model inputs",
        "a negative token id",
        lambda d: M()(input_ids=torch.tensor([[4, -1]]), decoder_input_ids=torch.tensor([[1]])),
        "token id -1",
    ),
    Case(
        "model inputs",
        "float token ids",
        lambda d: M()(input_ids=torch.tensor([[4.0, 5.0]]), decoder_input_ids=torch.tensor([[1]])),
        "integer token ids",
    ),
    Case(
        "model inputs",
        "an attention mask of another shape",
        lambda d: M()(
            input_ids=torch.tensor([[4, 5, 6]]), attention_mask=torch.ones(1, 4), decoder_input_ids=torch.tensor([[1]])
        ),
        "shape (1, 4) but its ids",
    ),
    Case(
        "model inputs",
        "an empty batch",
        lambda d: M()(input_ids=torch.zeros(0, 4, dtype=torch.long), decoder_input_ids=torch.tensor([[1]])),
        "empty",
    ),
    Case(
        "model inputs",
        "ids without a batch dimension",
        lambda d: M()(input_ids=torch.tensor([4, 5, 6]), decoder_input_ids=torch.tensor([[1]])),
        "shape [batch, sequence]",
    ),
    Case(
        "model inputs",
        "a label id >= vocab_size",
        lambda d: M()(input_ids=torch.tensor([[4, 5]]), labels=torch.tensor([[70, -100]])),
        "`labels` holds token id 70",
    ),
    Case(
        "model inputs",
        "input longer than learned positions support",
        lambda d: M(max_position_embeddings=8, position_embedding_type="learned")(
            input_ids=random_ids(1, 9), decoder_input_ids=random_ids(1, 3)
        ),
        "max_position_embeddings=8",
    ),
    Case(
        "model inputs",
        "flex attention with heads too small for torch's CPU kernel",
        lambda d: M(attn_implementation="flex_attention")(
            input_ids=random_ids(1, 4), decoder_input_ids=random_ids(1, 3)
        ),
        "head size of at least 32",
    ),
    Case(
        "model inputs",
        "flex attention with a head_dim too small for torch's CPU kernel",
        lambda d: M(
            d_model=64,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            head_dim=16,
            attn_implementation="flex_attention",
        )(input_ids=random_ids(1, 4), decoder_input_ids=random_ids(1, 3)),
        "head size 16 (head_dim=16)",
    ),
    Case(
        "model inputs",
        "skip_logits without labels",
        lambda d: M()(input_ids=random_ids(1, 4), decoder_input_ids=random_ids(1, 3), skip_logits=True),
        "skip_logits=True needs `labels`",
    ),
    # ---------------------------------------------------------------- generation and translation
    Case(
        "generation",
        "more returned sequences than beams",
        lambda d: M().generate(random_ids(1, 4), num_beams=2, num_return_sequences=3, max_new_tokens=3),
        "num_return_sequences",
    ),
    Case(
        "translation",
        "one string instead of a list",
        lambda d: translate(_model_for(t := _tokenizer()), t, "A dog runs."),
        "not a single string",
    ),
    Case(
        "translation",
        "an empty list of sentences",
        lambda d: translate(_model_for(t := _tokenizer()), t, []),
        "`texts` is empty",
    ),
    Case(
        "translation",
        "an unknown dtype",
        lambda d: translate(_model_for(t := _tokenizer()), t, ["A dog."], dtype="int8"),
        "dtype='int8' is not understood",
    ),
    Case(
        "translation",
        "a sentence longer than learned positions support",
        lambda d: translate(
            _model_for(t := _tokenizer(), position_embedding_type="learned", max_position_embeddings=8),
            t,
            ["A dog runs. " * 6],
        ),
        "max_position_embeddings=8",
    ),
    Case(
        "translation",
        "more candidates than beams",
        lambda d: translate_candidates(
            _model_for(t := _tokenizer()), t, "A dog runs.", num_beams=2, num_return_sequences=3
        ),
        "num_return_sequences must be an integer from 1 to num_beams=2",
    ),
    Case(
        "explorer",
        "an empty source box",
        lambda d: Explorer(d / "pictures").translate(_translator_model(d), "  "),
        "The source box is empty",
    ),
    Case(
        "explorer",
        "a source over the page's limit",
        lambda d: Explorer(d / "pictures").translate(_translator_model(d), "A dog runs. " * 50),
        "this explorer takes at most 500 characters",
    ),
    Case(
        "explorer",
        "a folder that holds no model",
        lambda d: Explorer(d / "pictures").load(d),
        "is not a saved model folder",
    ),
    Case(
        "evaluation",
        "sources and references of different lengths",
        lambda d: evaluate_model(_model_for(t := _tokenizer()), t, SENTENCES, SENTENCES[:3]),
        "4 sources but 3 references",
    ),
    Case(
        "tokenizer",
        "a tokenizer larger than the model's vocabulary",
        lambda d: check_tokenizer_matches_model(_tokenizer(), tiny_model().config),
        "Tokenizer and model config do not match",
    ),
    # ---------------------------------------------------------------- corpus files
    Case(
        "corpus",
        "a missing file",
        lambda d: load_parallel_corpus(_lines(d / "c.en", SENTENCES).with_suffix(""), "en", "de"),
        "File not found",
    ),
    Case(
        "corpus",
        "an empty file",
        lambda d: (_lines(d / "c.en", SENTENCES), _lines(d / "c.de", []), load_parallel_corpus(d / "c", "en", "de")),
        "File is empty",
    ),
    Case(
        "corpus",
        "files with different line counts",
        lambda d: load_parallel_corpus(_corpus(d, SENTENCES, SENTENCES[:3]) / "train", "en", "de"),
        "Misaligned",
    ),
    Case(
        "corpus",
        "a file that is not UTF-8",
        lambda d: (
            _lines(d / "c.en", ["A dog."]),
            (d / "c.de").write_bytes("Männer.\n".encode("latin-1")),
            load_parallel_corpus(d / "c", "en", "de"),
        ),
        "not UTF-8: line 1",
    ),
    Case("corpus", "a dataset name the Hub does not know", _unknown_hub_dataset, "Unknown dataset 'wmt99'"),
    # ---------------------------------------------------------------- checkpoints
    Case(
        "checkpoints",
        "a checkpoint folder without weights",
        lambda d: ((d / "ck").mkdir(), average_checkpoints([d / "ck"])),
        "has no model.safetensors",
    ),
    Case("checkpoints", "a truncated model.safetensors", _truncated_weights, "is not a valid safetensors file"),
    Case("checkpoints", "a config.json of another model_type", _foreign_config, "model_type 'bart'"),
    Case("checkpoints", "resuming with another model size", _resume_with_another_size, "Cannot resume from"),
    # ---------------------------------------------------------------- training health
    Case(
        "training",
        "a loss that becomes NaN",
        _non_finite_loss,
        "Non-finite training loss in step 2",
        FloatingPointError,
    ),
    Case(
        "training",
        "a full disk while a checkpoint is written",
        _disk_full_during_a_checkpoint,
        "checkpoint-1, is intact",
        OSError,
    ),
    # ---------------------------------------------------------------- command line
    Case(
        "command line",
        "train --max_tokens 0",
        lambda d: _command(["train", "--dataset_name", str(d), "--max_tokens", "0"]),
        "max_tokens=0 is out of range",
        SystemExit,
    ),
    Case(
        "command line",
        "an unknown option",
        lambda d: _command(["train", "--max-tokenz", "5"]),
        "unrecognized arguments: --max-tokenz 5 (did you mean --max-tokens?)",
        SystemExit,
    ),
    Case(
        "command line",
        "an option cut short",
        lambda d: _command(["train", "--max_step", "3"]),
        "unrecognized arguments: --max_step 3 (did you mean --max_steps?)",
        SystemExit,
    ),
    Case(
        "command line",
        "a misspelt model setting",
        lambda d: _command(["train", "--config_overrides", '{"d_modl": 64}']),
        "'d_modl' is not a setting of VanillaTransformerConfig. Did you mean 'd_model'?",
        SystemExit,
    ),
    Case(
        "command line",
        "a wrong type in an options file",
        lambda d: _command(["train", "--config", str(_lines(d / "run.yaml", ["max_steps: many"]))]),
        "max_steps = 'many' is a str, but max_steps takes int",
        SystemExit,
    ),
    Case(
        "command line",
        "a training file without a validation file",
        lambda d: _command(["train", "--train_file", "pairs.tsv"]),
        "needs validation_file too",
        SystemExit,
    ),
    Case(
        "command line",
        "a model folder that does not exist",
        lambda d: _command(["translate", "--model_name_or_path", str(d / "run" / "final"), "Hallo."]),
        "is not a saved model folder",
        SystemExit,
    ),
    Case(
        "command line",
        "a test set that is not UTF-8",
        lambda d: _command(
            [
                "evaluate",
                "--model_name_or_path",
                str(d),
                "--source",
                str(_latin1(d / "test.de")),
                "--reference",
                str(_latin1(d / "test.en")),
            ]
        ),
        "test.de is not UTF-8: line 1",
        SystemExit,
    ),
    # ---------------------------------------------------------------- deployment (CTranslate2)
    Case(
        "deployment",
        "exporting a setting the export does not know",
        lambda d: export_ctranslate2(_translator_model(d, rotary_positions=True), d / "export"),
        "does not know the setting(s) rotary_positions=True",
    ),
    Case("deployment", "exporting into an existing export", _export_over_an_export, "pass --force to replace it"),
    Case(
        "deployment",
        "a model folder given to the CTranslate2 engine",
        lambda d: CTranslate2Translator(_translator_model(d)),
        "export it first",
    ),
    Case(
        "deployment",
        "a sentence longer than the export's position table",
        _sentence_past_the_position_table,
        "longer than this export's position table (8 positions)",
    ),
]


def message(case: Case, folder: Path) -> str:
    """The error ``case`` raises, with the temporary folder's path shortened to ``…``."""
    folder.mkdir(parents=True, exist_ok=True)
    with pytest.raises(case.error) as error:
        case.trigger(folder)
    text = (
        str(error.value) if case.error is not SystemExit else f"exit status {error.value.code}: {error.value.printed}"
    )
    return " ".join(text.replace(str(folder), "…").split())


def render(messages: list[str]) -> str:
    lines = [
        "# Errors for bad input",
        "",
        "Every row is a test (`tests/test_error_messages.py`), and this file is generated from the messages those",
        "tests see: `python tests/test_error_messages.py` rewrites it. `…` stands for the folder of the example.",
        "",
        "| area | bad input | error | message |",
        "|---|---|---|---|",
    ]
    for case, text in zip(CASES, messages):
        cell = text.replace("|", "\\|")
        lines.append(f"| {case.area} | {case.what} | `{case.error.__name__}` | {cell} |")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", CASES, ids=[c.what for c in CASES])
def test_bad_input_gets_a_clear_error(case, tmp_path):
    text = message(case, tmp_path)
    assert case.expect in text, text


def test_the_documented_table_is_what_the_cases_raise(tmp_path):
    assert len(CASES) >= 25
    messages = [message(case, tmp_path / str(i)) for i, case in enumerate(CASES)]
    assert DOC.read_text(encoding="utf-8") == render(messages), (
        "docs/errors.md is stale: run python tests/test_error_messages.py"
    )


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        texts = [message(case, Path(tmp) / str(i)) for i, case in enumerate(CASES)]
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(render(texts), encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)} ({len(CASES)} cases)")
