"""The training loop: smoothing, a real run that learns, exact resume, atomic checkpoints, progress, processes."""

import errno
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import random_ids, run_processes, tiny_model
from safetensors.torch import load_file

from vanilla_transformer.checkpoints import TIED_WEIGHTS_WARNING, list_checkpoints
from vanilla_transformer.training import emulated_bf16_warning, resolve_mixed_precision, train
from vanilla_transformer.training_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = {
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
}


def tiny_run(corpus: Path, output_dir: Path, **overrides) -> TrainConfig:
    values = dict(
        dataset_name=str(corpus),
        output_dir=str(output_dir),
        vocab_size=400,
        config_overrides={**TINY_MODEL, "dropout": 0.1},
        max_tokens=512,
        max_steps=6,
        warmup_steps=4,
        lr_factor=2.0,
        eval_steps=1000,
        save_steps=3,
        eval_bleu_sentences=8,
        generation_num_beams=1,
        disable_tqdm=True,
        seed=3,
    )
    return TrainConfig(**{**values, **overrides})


def test_tensorboard_logging_writes_the_run_scalars(corpus, tmp_path):
    """--report_to tensorboard: Accelerate's tracker writes event files holding the logged losses."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(
        tiny_run(
            corpus,
            tmp_path / "run",
            max_steps=50,
            eval_steps=50,
            save_steps=50,
            eval_bleu_sentences=0,
            report_to="tensorboard",
            test_split=None,
        )
    )
    events = list((tmp_path / "run").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    scalars = EventAccumulator(str(events[0].parent)).Reload().Tags()["scalars"]
    assert {"train_loss", "valid_loss", "lr"} <= set(scalars), scalars


# ------------------------------------------------------------------ §5.4
@pytest.mark.parametrize("skip_logits", [False, True])
def test_label_smoothing_matches_transformers_label_smoother(skip_logits):
    """The model's label-smoothed loss (both paths) equals transformers' LabelSmoother, the one
    Seq2SeqTrainer(label_smoothing_factor=0.1) uses; nll_loss equals plain cross-entropy."""
    from transformers.trainer_pt_utils import LabelSmoother

    model = tiny_model()
    input_ids, labels = random_ids(2, 6), random_ids(2, 5, seed=1)
    labels[1, 3:] = -100
    logits = model(input_ids=input_ids, labels=labels).logits
    out = model(input_ids=input_ids, labels=labels, smoothing=0.1, skip_logits=skip_logits)
    reference = LabelSmoother(epsilon=0.1)({"logits": logits}, labels)
    plain = torch.nn.functional.cross_entropy(logits[labels != -100], labels[labels != -100])
    assert out.loss.item() == pytest.approx(reference.item(), rel=1e-5)
    assert out.nll_loss.item() == pytest.approx(plain.item(), rel=1e-5)
    assert (out.logits is None) == skip_logits


# ------------------------------------------------------------------ a real run
def test_a_short_run_on_real_text_lowers_validation_loss_and_saves_a_hub_folder(corpus, tmp_path):
    config = tiny_run(
        corpus, tmp_path / "run", max_steps=120, eval_steps=60, save_steps=40, warmup_steps=40, lr_factor=0.3
    )
    summary = train(config)
    state = json.loads((list_checkpoints(tmp_path / "run" / "checkpoints")[-1] / "trainer_state.json").read_text())
    losses = [r["valid_loss"] for r in state["history"] if "valid_loss" in r]
    # uniform guessing over the 400-token vocabulary would give ln(400) = 6.0 (before smoothing)
    assert len(losses) == 2 and losses[1] < losses[0] - 0.2 and losses[1] < math.log(400) - 1.0, losses
    final = tmp_path / "run" / "final"
    for name in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "modeling_vanilla_transformer.py",
        "README.md",
    ):
        assert (final / name).is_file(), name
    assert summary["averaged_checkpoints"] == ["checkpoint-40", "checkpoint-80", "checkpoint-120"]
    assert summary["test"]["n"] == 40 and "nrefs:1" in summary["test"]["bleu_signature"]
    assert len((tmp_path / "run" / "test.hyp.de").read_text(encoding="utf-8").splitlines()) == 40
    # results.json keeps the log's records: the same evaluations as the last checkpoint's state
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (
        results["history"] == state["history"]
        and [r["valid_loss"] for r in results["history"] if "valid_loss" in r] == losses
    )
    card = (final / "README.md").read_text()
    assert f"{summary['test']['bleu']:.2f}" in card and "sacrebleu" in card


@pytest.mark.parametrize(
    "amx, avx512_bf16, expected", [(True, True, "bf16"), (False, True, "bf16"), (False, False, "no")]
)
def test_auto_mixed_precision_is_bf16_only_on_cpus_with_bf16_units(monkeypatch, amx, avx512_bf16, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert resolve_mixed_precision("auto", cpu=True) == expected
    for given in ("no", "bf16", "fp16"):
        assert resolve_mixed_precision(given, cpu=True) == given


def test_a_run_with_auto_precision_records_what_it_resolved_to(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    train(tiny_run(corpus, tmp_path / "run", max_steps=2, save_steps=2, mixed_precision="auto", use_cpu=True))
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["mixed_precision"] == "no"
    assert "mixed precision `no`" in (tmp_path / "run" / "final" / "README.md").read_text()


@pytest.mark.parametrize("units", [False, True])
def test_bf16_on_a_cpu_without_bf16_units_is_run_with_a_warning_naming_the_fix(
    corpus, tmp_path, monkeypatch, capsys, units
):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: units)
    assert emulated_bf16_warning("no", torch.device("cpu")) is None
    assert emulated_bf16_warning("bf16", torch.device("cuda")) is None
    train(
        tiny_run(
            corpus, tmp_path / "run", max_steps=1, save_steps=1, test_split=None, mixed_precision="bf16", use_cpu=True
        )
    )
    out = capsys.readouterr().out
    assert ("no AMX or AVX512-BF16" in out and "Use --mixed_precision no, or auto" in out) is not units
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["mixed_precision"] == "bf16"  # as asked


# ------------------------------------------------------------------ what a run shows
def test_the_progress_bar_counts_steps_or_with_a_time_budget_seconds_of_it(corpus, tmp_path, capsys, caplog):
    train(tiny_run(corpus, tmp_path / "steps", max_steps=2, save_steps=1, test_split=None, disable_tqdm=False))
    bars = capsys.readouterr().err
    assert re.search(r"training: 100%\|[^\n\r]*\| 2/2 ", bars), bars
    train(
        tiny_run(
            corpus, tmp_path / "budget", max_steps=2, save_steps=1, test_split=None, disable_tqdm=False, max_minutes=10
        )
    )
    bars = capsys.readouterr().err
    assert re.search(r"training, step 2: +\d+%\|[^\n\r]*\| \d+/600 s, loss=", bars), bars  # seconds of 10 minutes
    assert not re.search(r"training: [^\n\r]*/1000000", bars)
    assert TIED_WEIGHTS_WARNING not in caplog.text + bars  # four checkpoints were saved without it


def test_training_draws_attention_pictures_at_each_evaluation(corpus, tmp_path):
    pytest.importorskip("matplotlib")
    from vanilla_transformer.visualization import FILES

    run = tmp_path / "run"
    train(
        tiny_run(
            corpus,
            run,
            max_steps=2,
            eval_steps=1,
            save_steps=2,
            eval_bleu_sentences=0,
            test_split=None,
            attention_pictures=3,
        )
    )
    for step in (1, 2):
        folder = run / "pictures" / f"step-{step}"
        assert sorted(p.name for p in folder.iterdir()) == sorted(FILES[k] for k in ("encoder", "decoder", "cross"))
        for path in folder.iterdir():
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"attention_pictures=100000.*valid: 0\.\."):
        train(tiny_run(corpus, tmp_path / "bad", attention_pictures=100_000))


def test_a_launcher_asking_for_fsdp_is_refused_before_any_work(corpus, tmp_path, monkeypatch):
    """On CPUs Accelerate would run DDP instead of FSDP without a word; the command says so and stops."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="asks for FSDP, but .*only on GPUs.*configs/accelerate/8gpu.yaml"):
        train(tiny_run(corpus, tmp_path / "run"))
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ checkpoints and resume
def test_resume_continues_exactly_where_the_run_stopped(corpus, tmp_path):
    train(tiny_run(corpus, tmp_path / "full", max_steps=6))
    train(tiny_run(corpus, tmp_path / "split", max_steps=3))
    train(tiny_run(corpus, tmp_path / "split", max_steps=6, resume_from_checkpoint="latest"))
    full = load_file(tmp_path / "full" / "checkpoints" / "checkpoint-6" / "model.safetensors")
    resumed = load_file(tmp_path / "split" / "checkpoints" / "checkpoint-6" / "model.safetensors")
    assert full.keys() == resumed.keys()
    for name in full:
        assert torch.equal(full[name], resumed[name]), name


def test_resume_takes_the_newest_checkpoint_by_its_path_and_refuses_others(corpus, tmp_path):
    run = tmp_path / "run"
    train(tiny_run(corpus, run, max_steps=4, save_steps=2))
    with pytest.raises(ValueError, match="already holds checkpoints .checkpoint-4.; pass --resume_from_checkpoint"):
        train(tiny_run(corpus, run, max_steps=6, save_steps=2))
    with pytest.raises(
        ValueError, match="has newer checkpoints .checkpoint-4., which going on from checkpoint-2 would overwrite"
    ):
        train(
            tiny_run(
                corpus, run, max_steps=6, save_steps=2, resume_from_checkpoint=str(run / "checkpoints" / "checkpoint-2")
            )
        )
    with pytest.raises(ValueError, match="not a complete checkpoint of this run's folder"):
        train(tiny_run(corpus, run, max_steps=6, save_steps=2, resume_from_checkpoint=str(tmp_path / "elsewhere")))
    summary = train(
        tiny_run(
            corpus, run, max_steps=6, save_steps=2, resume_from_checkpoint=str(run / "checkpoints" / "checkpoint-4")
        )
    )
    assert summary["step"] == 6
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_the_time_budget_counts_the_minutes_of_the_runs_before_a_resume(corpus, tmp_path, capsys):
    """A job preempted every hour must still stop once --max_minutes of training are spent in all (as fairseq does)."""
    run = tmp_path / "run"
    train(tiny_run(corpus, run, max_steps=2, save_steps=1, max_minutes=10))
    state_file = run / "checkpoints" / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert 0 < state["elapsed_seconds"] < 600
    state["elapsed_seconds"] = 10 * 60  # as if the earlier runs had spent the whole budget
    state_file.write_text(json.dumps(state))
    summary = train(tiny_run(corpus, run, max_steps=40, save_steps=1, max_minutes=10, resume_from_checkpoint="latest"))
    assert summary["stop_reason"] == "max_minutes" and summary["step"] == 3  # the deadline is checked after each step
    assert "min of the time budget spent" in capsys.readouterr().out


def test_the_main_job_script_resumes_instead_of_deleting_the_run(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "keep-me").write_text("a run in progress")
    env = {**os.environ, "OUTPUT_DIR": str(out)}
    # --max_steps 0 is refused by train, after the script's own steps: what matters is what they did to the run
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "main.sh"), "--resume_from_checkpoint", "--max_steps", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0 and "max_steps=0 is out of range" in done.stderr, done.stderr[-2000:]
    assert (out / "keep-me").exists()


def test_a_users_own_files_train_with_a_separate_validation_and_test_file(corpus, tmp_path):
    """One TSV of training pairs, a TSV of validation pairs and a JSON-lines test file, as a user brings them."""

    def pairs(split: str) -> list[tuple[str, str]]:
        en, de = ((corpus / f"{split}.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))
        return list(zip(en, de))

    (tmp_path / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs("train")), encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs("valid")), encoding="utf-8")
    (tmp_path / "test.jsonl").write_text(
        "".join(json.dumps({"translation": {"en": a, "de": b}}) + "\n" for a, b in pairs("test")[:10]), encoding="utf-8"
    )
    summary = train(
        tiny_run(
            tmp_path / "no-corpus-here",
            tmp_path / "run",
            max_steps=2,
            save_steps=2,
            train_file=str(tmp_path / "pairs.tsv"),
            validation_file=str(tmp_path / "dev.tsv"),
            test_file=str(tmp_path / "test.jsonl"),
            eval_bleu_sentences=0,
        )
    )
    assert summary["test"]["n"] == 10 and "valid_loss" in summary
    assert len((tmp_path / "run" / "test.hyp.de").read_text(encoding="utf-8").splitlines()) == 10


def test_the_bpe_of_a_large_corpus_learns_from_an_evenly_spread_sample_of_bpe_train_pairs(corpus, tmp_path, capsys):
    """--bpe_train_pairs 300 of the 2,000 training pairs: the run's tokenizer is the BPE of exactly pairs i with
    i * 300 mod 2000 < 300 (spread over the whole file), not that of all pairs, and the log says so."""
    from vanilla_transformer.tokenization import train_joint_bpe

    train(tiny_run(corpus, tmp_path / "run", max_steps=1, save_steps=1, bpe_train_pairs=300, test_split=None))
    assert "the BPE learns from 300 of the 2,000 training pairs" in capsys.readouterr().out
    en, de = ((corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))
    chosen = [i for i in range(2000) if i * 300 % 2000 < 300]
    assert len(chosen) == 300 and chosen[0] == 0 and chosen[-1] > 1980
    saved = (tmp_path / "run" / "tokenizer" / "tokenizer.json").read_text(encoding="utf-8")
    vocab = json.loads(saved)["model"]["vocab"]

    def vocab_of(indices):
        texts = [text for i in indices for text in (en[i], de[i])]
        return json.loads(train_joint_bpe(texts, vocab_size=400).backend_tokenizer.to_str())["model"]["vocab"]

    assert vocab == vocab_of(chosen)
    assert vocab != vocab_of(range(2000))


def test_half_written_checkpoints_are_ignored_and_reported(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_run(corpus, run, max_steps=3))
    broken = run / "checkpoints" / ".tmp-checkpoint-6"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"garbage")
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["checkpoint-3"]
    train(tiny_run(corpus, run, max_steps=6, resume_from_checkpoint="latest"))
    printed = capsys.readouterr().out
    assert "ignoring incomplete checkpoint .tmp-checkpoint-6" in printed and "resumed from checkpoint-3" in printed
    assert not broken.exists()
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["checkpoint-3", "checkpoint-6"]


def test_keeps_only_the_last_k_checkpoints(corpus, tmp_path):
    train(tiny_run(corpus, tmp_path / "run", max_steps=8, save_steps=2, save_total_limit=2, average_last=2))
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["checkpoint-6", "checkpoint-8"]


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint_and_the_run_resumes(corpus, tmp_path, monkeypatch):
    from accelerate import Accelerator

    real = Accelerator.save_state

    def full_disk(self, output_dir=None, **kwargs):
        if output_dir.endswith("checkpoint-4"):  # half a file, then ENOSPC
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            (Path(output_dir) / "model.safetensors").write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, output_dir, **kwargs)

    monkeypatch.setattr(Accelerator, "save_state", full_disk)
    with pytest.raises(OSError, match="checkpoint-4 failed .No space left on device.*checkpoint-2, is intact") as error:
        train(tiny_run(corpus, tmp_path / "run", max_steps=6, save_steps=2))
    assert error.value.errno == errno.ENOSPC
    checkpoints = tmp_path / "run" / "checkpoints"
    assert [p.name for p in checkpoints.iterdir()] == ["checkpoint-2"]  # the half-written folder is gone
    monkeypatch.setattr(Accelerator, "save_state", real)
    train(tiny_run(corpus, tmp_path / "run", max_steps=6, save_steps=2, resume_from_checkpoint="latest"))
    train(tiny_run(corpus, tmp_path / "full", max_steps=6, save_steps=2))
    a = load_file(checkpoints / "checkpoint-6" / "model.safetensors")
    b = load_file(tmp_path / "full" / "checkpoints" / "checkpoint-6" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_non_finite_loss_stops_the_run_before_its_next_checkpoint_and_keeps_the_last_one(
    corpus, tmp_path, monkeypatch
):
    from vanilla_transformer import training

    real, calls = training.loss_sums, []

    def poisoned(model, batch, smoothing, workspace=None):
        smoothed, nll = real(model, batch, smoothing, workspace)
        calls.append(model.training)
        return (smoothed * float("nan") if len(calls) == 3 else smoothed), nll

    monkeypatch.setattr(training, "loss_sums", poisoned)
    # found at the next checkpoint (step 4), before it is written: no checkpoint holds the updates of a NaN loss
    with pytest.raises(
        FloatingPointError,
        match="in steps 3-4, found before any checkpoint of it was written; the newest checkpoint.*checkpoint-2",
    ):
        train(tiny_run(corpus, tmp_path / "run", max_steps=6, save_steps=2))
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["checkpoint-2"]
    monkeypatch.setattr(training, "loss_sums", real)
    summary = train(tiny_run(corpus, tmp_path / "run", max_steps=6, save_steps=2, resume_from_checkpoint="latest"))
    assert summary["step"] == 6
    weights = load_file(tmp_path / "run" / "final" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())


class CountReadsBack:
    """Counts the values read back from tensors to the host, into the bucket of the current step: ``.item()``,
    ``bool(tensor)``, ``int(tensor)``... (all dispatch to ``aten._local_scalar_dense``), and the operators whose
    output size depends on tensor values (``nonzero``, boolean indexing, ``masked_select``, ``repeat_interleave``
    by a tensor). On a GPU each of them waits for the device to finish its queued work."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter, aten = self, torch.ops.aten
        reads = {
            aten._local_scalar_dense.default,
            aten.nonzero.default,
            aten.masked_select.default,
            aten.repeat_interleave.Tensor,
        }

        def boolean_index(func, args) -> bool:
            return func is aten.index.Tensor and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else [])
            )

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in reads or boolean_index(func, args):
                    counter.per_step[-1] += 1
                return func(*args, **(kwargs or {}))

        self.mode, self.per_step = Mode(), [0]  # per_step[0]: before the first step


@pytest.mark.parametrize("gradient_accumulation", [1, 2])
def test_a_training_step_reads_nothing_back_from_the_device_between_logging_steps(
    corpus, tmp_path, monkeypatch, gradient_accumulation
):
    """The steps that neither log, evaluate nor save read no value back (the losses, token counts and the
    finiteness check stay on the device until a logging step); scripts/gpu_check.sh checks the same on a GPU
    with torch.cuda.set_sync_debug_mode("error")."""
    from vanilla_transformer import kernels_vanilla_transformer, training

    # the loss as it runs on a GPU: a CPU may drop the ignored rows first (it waits for no device to count them)
    monkeypatch.setattr(kernels_vanilla_transformer, "COMPACT_ROWS_ON", ())
    counter, real = CountReadsBack(), training.test_delay

    def mark(point, rank):  # called at the start of every step
        if point == "step":
            counter.per_step.append(0)
        real(point, rank)

    monkeypatch.setattr(training, "test_delay", mark)
    with counter.mode:
        train(
            tiny_run(
                corpus,
                tmp_path / "run",
                max_steps=12,
                logging_steps=4,
                eval_steps=6,
                save_steps=6,
                gradient_accumulation_steps=gradient_accumulation,
                test_split=None,
            )
        )
    per_step = counter.per_step[1:]  # per_step[k - 1]: from the start of step k to the start of step k + 1
    assert len(per_step) == 12
    quiet = [k for k in range(1, 13) if k % 4 and k % 6]
    assert {k: per_step[k - 1] for k in quiet} == dict.fromkeys(quiet, 0), per_step
    assert per_step[4 - 1] > 0 and per_step[6 - 1] > 0  # logging and evaluation do read: the counter counts


# ------------------------------------------------------------------ bad input, before any training
def test_refuses_to_overwrite_a_run_without_resume(corpus, tmp_path):
    train(tiny_run(corpus, tmp_path / "run", max_steps=3))
    with pytest.raises(ValueError, match="--resume_from_checkpoint"):
        train(tiny_run(corpus, tmp_path / "run", max_steps=6))


def test_resuming_with_another_model_size_says_so(corpus, tmp_path):
    train(tiny_run(corpus, tmp_path / "run", max_steps=3))
    with pytest.raises(ValueError, match="Cannot resume.*shape"):
        train(
            tiny_run(
                corpus,
                tmp_path / "run",
                max_steps=6,
                resume_from_checkpoint="latest",
                config_overrides={**TINY_MODEL, "d_model": 96},
            )
        )


def test_missing_corpus_fails_before_training(tmp_path):
    with pytest.raises(ValueError, match="File not found: .*nowhere"):
        train(tiny_run(tmp_path / "nowhere", tmp_path / "run"))
    assert not (tmp_path / "run" / "checkpoints").exists()


# ------------------------------------------------------------------ data parallel
def test_the_wall_clock_budget_is_decided_by_all_processes_together(monkeypatch):
    """With several processes, one whose clock is past the budget stops them all at the same step (a process
    stopping alone would leave the others waiting for it forever in the next gradient all-reduce)."""
    import time

    from vanilla_transformer import distributed
    from vanilla_transformer.training import _past_deadline

    class TwoProcesses:
        num_processes, device = 2, torch.device("cpu")

    def other_process_adds(others: float):  # the all-reduce, as gloo would sum this process's flag and the other's
        monkeypatch.setattr(distributed, "_control_group", lambda accelerator: None)
        monkeypatch.setattr(distributed, "_collective", lambda function, tensor, **kwargs: tensor.add_(others))

    future, past = time.monotonic() + 3600, time.monotonic() - 1
    other_process_adds(1.0)
    assert _past_deadline(future, TwoProcesses())  # only the other process is late: stop here too
    other_process_adds(0.0)
    assert _past_deadline(past, TwoProcesses())
    assert not _past_deadline(future, TwoProcesses())


def _free_port() -> str:
    """A port no one listens on now (a fixed one fails when another run of these tests holds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


@pytest.mark.timeout(600)
def test_two_processes_reach_the_parameters_of_one_process_with_the_same_global_batch(corpus, tmp_path):
    common = [
        "--dataset_name",
        str(corpus),
        "--vocab-size",
        "400",
        "--config_overrides",
        json.dumps({**TINY_MODEL, "dropout": 0.0}),
        "--max-tokens",
        "256",
        "--max-steps",
        "4",
        "--warmup-steps",
        "2",
        "--eval_steps",
        "1000",
        "--save_steps",
        "4",
        "--eval-bleu-sentences",
        "0",
        "--seed",
        "3",
        "--disable_tqdm",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # the tokenizer is trained once and shared, so both runs see identical ids
    one = run_processes(
        [
            sys.executable,
            "-m",
            "vanilla_transformer",
            "train",
            *common,
            "--gradient_accumulation_steps",
            "2",
            "--output-dir",
            str(tmp_path / "one"),
        ],
        env,
        timeout=240,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_processes(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            _free_port(),
            "-m",
            "vanilla_transformer",
            "train",
            *common,
            "--gradient_accumulation_steps",
            "1",
            "--tokenizer_name",
            str(tmp_path / "one" / "tokenizer"),
            "--output-dir",
            str(tmp_path / "two"),
        ],
        env,
        timeout=240,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    a = load_file(tmp_path / "one" / "checkpoints" / "checkpoint-4" / "model.safetensors")
    b = load_file(tmp_path / "two" / "checkpoints" / "checkpoint-4" / "model.safetensors")
    gap = max((a[k] - b[k]).abs().max().item() for k in a)
    assert gap < 1e-5, gap
