"""Several processes never wait for each other forever: runs of 2 and 3 CPU processes (torchrun, gloo) with
delays injected into chosen processes at every point where they could disagree, and the helpers behind them.

Each run is given a time limit far below CI's: a hang fails the test in minutes, with the processes' output.
"""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_processes
from test_training import TINY_MODEL

from vanilla_transformer.distributed import (
    DELAY_POINTS,
    DELAYS_VARIABLE,
    _parse_delays,
    agree,
    any_process,
    on_main_process,
    test_delay,
)

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "tests" / "helpers" / "distributed_train.py"
RUN_LIMIT_S = 240  # one tiny run takes 20-60 s on 2 busy cores


def _train(processes: int, output_dir: Path, corpus: Path, delays: str, *extra: str, env: dict | None = None):
    """``vanilla-transformer train`` as ``processes`` torchrun processes; all killed past RUN_LIMIT_S."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        str(LAUNCHER),
        "train",
        "--dataset_name",
        str(corpus),
        "--output-dir",
        str(output_dir),
        "--vocab-size",
        "300",
        "--config_overrides",
        json.dumps(TINY_MODEL),
        "--max-tokens",
        "256",
        "--warmup-steps",
        "2",
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--eval-bleu-sentences",
        "2",
        "--generation_num_beams",
        "1",
        "--seed",
        "3",
        "--disable_tqdm",
        *extra,
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        DELAYS_VARIABLE: delays,
        **(env or {}),
    }
    done = run_processes(command, env, timeout=RUN_LIMIT_S)
    return done.returncode, done.stdout, done.stderr


def _assert_same_weights_on_every_process(output_dir: Path, processes: int) -> None:
    digests = [(output_dir / f"weights-rank{rank}.sha256").read_text() for rank in range(processes)]
    assert len(set(digests)) == 1, digests
    assert (output_dir / "final" / "model.safetensors").is_file() and (
        output_dir / "final" / "tokenizer.json"
    ).is_file()


# ------------------------------------------------------------------ real runs
@pytest.mark.timeout(2 * RUN_LIMIT_S + 60)
def test_two_processes_finish_a_fresh_and_a_resumed_run_whichever_process_arrives_first(corpus, tmp_path):
    """Process 1 reaches the tokenizer after process 0 has written it: before the fix, it skipped the barrier
    that process 0 waited in, and both waited forever. Then each point has a late process."""
    run = tmp_path / "run"
    fresh = "tokenizer:1=4,checkpoints:0=1,evaluate:1=0.5,save:0=0.5,finish:1=1"
    code, _, err = _train(2, run, corpus, fresh, "--max-steps", "4")
    assert code == 0, err[-4000:]
    _assert_same_weights_on_every_process(run, 2)
    resumed = "data:0=1,tokenizer:1=2,checkpoints:1=1,resume:0=1,step:1=0.2,save:1=0.5,finish:0=1"
    code, _, err = _train(2, run, corpus, resumed, "--max-steps", "6", "--resume_from_checkpoint")
    assert code == 0, err[-4000:]
    assert "resumed from checkpoint-4" in err + _
    _assert_same_weights_on_every_process(run, 2)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


@pytest.mark.timeout(2 * RUN_LIMIT_S + 60)
def test_three_processes_finish_a_run_with_a_given_tokenizer_and_its_resumption(corpus, tmp_path):
    from vanilla_transformer.tokenization import save_tokenizer, train_joint_bpe

    lines = (corpus / "train.en").read_text().splitlines() + (corpus / "train.de").read_text().splitlines()
    save_tokenizer(train_joint_bpe(lines, vocab_size=300, show_progress=False), tmp_path / "tokenizer")
    run, given = tmp_path / "run", ("--tokenizer_name", str(tmp_path / "tokenizer"))
    fresh = "data:2=2,tokenizer:0=2,checkpoints:1=1,step:2=0.2,evaluate:0=0.5,save:1=0.5,finish:2=1"
    code, _, err = _train(3, run, corpus, fresh, "--max-steps", "4", *given)
    assert code == 0, err[-4000:]
    _assert_same_weights_on_every_process(run, 3)
    resumed = "checkpoints:0=1,resume:2=1,save:0=0.5,finish:1=1"
    code, out, err = _train(3, run, corpus, resumed, "--max-steps", "6", "--resume_from_checkpoint", *given)
    assert code == 0, err[-4000:]
    assert "resumed from checkpoint-4" in err + out
    _assert_same_weights_on_every_process(run, 3)


@pytest.mark.timeout(RUN_LIMIT_S + 60)
def test_a_failure_on_the_main_process_stops_the_others_instead_of_leaving_them_waiting(corpus, tmp_path):
    code, out, err = _train(
        2, tmp_path / "run", corpus, "finish:1=1", "--max-steps", "2", env={"FAIL_ON_MAIN_PROCESS": "1"}
    )
    assert code != 0
    assert "No space left on device (injected)" in err
    assert "The main process failed while averaging checkpoints and saving the final model" in err


# ------------------------------------------------------------------ the helpers, in one process
class _OneProcess:
    num_processes, process_index, is_main_process, device = 1, 0, True, torch.device("cpu")


def test_one_process_agrees_with_itself_and_runs_the_main_process_work():
    assert agree(_OneProcess(), ["checkpoint-2"]) == ["checkpoint-2"]
    assert any_process(_OneProcess(), True) and not any_process(_OneProcess(), False)
    assert on_main_process(_OneProcess(), "adding", lambda: 1 + 1) == 2
    with pytest.raises(ZeroDivisionError):
        on_main_process(_OneProcess(), "dividing", lambda: 1 / 0)


def test_delays_are_read_from_the_variable_and_bad_ones_are_refused(monkeypatch):
    assert _parse_delays("tokenizer:1=2, save:0=0.5,") == {("tokenizer", 1): 2.0, ("save", 0): 0.5}
    with pytest.raises(ValueError, match="unknown point 'tokeniser'; the points are data, tokenizer"):
        _parse_delays("tokeniser:1=2")
    with pytest.raises(ValueError, match="cannot read 'tokenizer=2'; write POINT:RANK=SECONDS"):
        _parse_delays("tokenizer=2")
    monkeypatch.setenv(DELAYS_VARIABLE, "save:1=30")
    test_delay("save", 0)  # another process's delay: returns at once (a 30 s sleep would time the test out)
    monkeypatch.delenv(DELAYS_VARIABLE)
    for point in DELAY_POINTS:
        test_delay(point, 0)


def test_every_delay_point_is_reached_by_a_training_run():
    source = (ROOT / "vanilla_transformer" / "training.py").read_text()
    for point in DELAY_POINTS:
        assert f'test_delay("{point}", accelerator.process_index)' in source, point
