"""SIGKILL at random moments and during checkpoint writes, then --resume: nothing is lost or corrupted.

The harness is ``benchmarks/kill_resume.py`` (its longer default run: 30 kills); here it runs with 10, and with
3 kills of a whole job of 2 processes (torchrun, gloo).
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import kill_resume  # noqa: E402


@pytest.mark.slow
def test_ten_kills_and_resumes_end_bit_identical_to_an_uninterrupted_run(tmp_path):
    report = kill_resume.main(
        [
            "--kills",
            "10",
            "--steps",
            "120",
            "--save-every",
            "3",
            "--output",
            str(tmp_path / "out"),
            "--workdir",
            str(tmp_path / "work"),
        ]
    )
    assert report["kills"] == 10 and report["resumes"] == 10, report
    # every kill was followed by the check that each complete checkpoint equals the reference's
    assert all(event["complete"] == sorted(event["complete"]) for event in report["events"][:-1])
    # at least some kills landed while a checkpoint was being written or rotated (half of them aim at it)
    assert report["kills_during_checkpoint_writes"] + report["kills_during_rotations"] >= 3, report
    assert report["final_bit_identical"] is True
    assert (tmp_path / "out" / "kill-resume.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| steps | save_every | kills |" in (tmp_path / "out" / "kill-resume.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(480)  # ~80 s on 2 busy cores; a hang fails here, far below CI's limit
def test_three_kills_of_a_two_process_job_end_bit_identical_to_an_uninterrupted_two_process_run(tmp_path):
    """SIGKILL reaches torchrun and both workers at once; each restart resumes both processes from the newest
    complete checkpoint, and each process must then take exactly the data and random numbers it would have."""
    out = tmp_path / "out"
    arguments = ["--processes", "2", "--kills", "3", "--steps", "24", "--save-every", "3", "--seed", "2"]
    report = kill_resume.main([*arguments, "--output", str(out), "--workdir", str(tmp_path / "work")])
    assert report["processes"] == 2 and report["kills"] == 3 and report["resumes"] == 3, report
    # the second kill is aimed at a checkpoint write: it lands while .tmp-checkpoint-N exists
    assert report["kills_during_checkpoint_writes"] + report["kills_during_rotations"] >= 1, report
    # seed 2 draws the random kills ~11 steps into a run, past its first checkpoints: the restarts resume
    assert any(event["resumed_from"] is not None for event in report["events"]), report["events"]
    assert report["final_bit_identical"] is True
    assert (out / "kill-resume-2processes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
