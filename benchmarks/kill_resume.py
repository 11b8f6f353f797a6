"""Kill training with SIGKILL at random moments, resume each time, and check that no work is lost.

    python benchmarks/kill_resume.py                 # 30 kills: writes benchmarks/results/kill-resume.{json,md,png}
    python benchmarks/kill_resume.py --kills 10 --output /tmp/kr   # what the test suite runs
    python benchmarks/kill_resume.py --processes 2 --kills 10      # 2 processes: kill-resume-2processes.*

The procedure, on a tiny model and 2,000 pairs of the bundled Tatoeba corpus (CPU, one thread, so
that every run is deterministic):

1. A reference run trains ``--steps`` steps without interruption, keeping every checkpoint.
2. The same run, in another folder, is started with ``vanilla-transformer train --config ... --resume_from_checkpoint``
   and killed with SIGKILL ``--kills`` times, then left to finish. Kills alternate between two kinds:

   * ``random``: at a random moment, uniformly within ~12 training steps after the loop has started
     (sometimes that is already in the final averaging and saving);
   * ``write``: as soon as a checkpoint write has begun (a ``.tmp-checkpoint-N`` folder exists), or a
     rotation (``.tmp-deleting-checkpoint-N``), whichever the process reaches first.

   After every kill, the folder is inspected before the restart: every complete checkpoint
   (``checkpoint-N`` with its ``trainer_state.json``) must load and hold exactly the reference's
   weights of step N, and any half-written ``.tmp-*`` folder must be reported and removed by the
   next start ("ignoring incomplete checkpoint").
3. At the end, the last checkpoint and the averaged ``final/model.safetensors`` must be bit-identical
   to the reference's.

With ``--processes N`` (N > 1) every run, the reference included, is ``torchrun --nproc_per_node N`` on the CPU
(gloo, one thread per process), and each kill sends SIGKILL to the whole job at once: torchrun and every
worker, as a scheduler's preemption or a lost machine would. The reference is then an uninterrupted run with
the same number of processes.

No well-kept library offers such a fault-injection harness for training loops (pytest-timeout and
hypothesis do not kill and resume processes), so it is written here with ``subprocess`` and ``psutil`` (which
accelerate already depends on).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vanilla_transformer.checkpoints import CHECKPOINT_PREFIX, STATE_FILE, list_checkpoints  # noqa: E402

MODEL = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "dropout": 0.1,
}
LOOP_STARTED = "training from step"  # printed by training.train after resuming, before its loop


def write_corpus(folder: Path, sizes: dict[str, int] | None = None) -> Path:
    """The first pairs of each split of the bundled Tatoeba corpus, as {split}.{lang} files."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (sizes or {"train": 2000, "valid": 50}).items():
        for lang in ("en", "de"):
            with gzip.open(ROOT / "data" / "tatoeba_en_de" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (folder / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return folder


def run_config(corpus: Path, output_dir: Path, steps: int, save_every: int, keep: int, tokenizer: Path | None) -> dict:
    return {
        "dataset_name": str(corpus),
        "source_lang": "en",
        "target_lang": "de",
        "test_split": None,
        "vocab_size": 400,
        "tokenizer_name": None if tokenizer is None else str(tokenizer),
        "config_overrides": MODEL,
        "max_tokens": 256,
        "max_steps": steps,
        "warmup_steps": 10,
        "lr_factor": 2.0,
        "eval_steps": 10**6,
        "eval_bleu_sentences": 0,
        "save_steps": save_every,
        "save_total_limit": keep,
        "average_last": 2,
        "seed": 7,
        "disable_tqdm": True,
        "output_dir": str(output_dir),
    }


def _environment() -> dict:
    # one thread: bit-identical arithmetic from run to run, and a free core for this supervisor
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }


def _start(config_path: Path, log_path: Path, processes: int = 1) -> subprocess.Popen:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "-m"]
    command = [
        sys.executable,
        *(launcher if processes > 1 else ["-m"]),
        "vanilla_transformer",
        "train",
        "--config",
        str(config_path),
        "--resume_from_checkpoint",
    ]
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_environment(), cwd=ROOT)


def _kill_job(process: subprocess.Popen) -> None:
    """SIGKILL to ``process`` and every process under it (torchrun's workers live in sessions of their own,
    so a process group would miss them): the children are listed first, then all are killed together."""
    import psutil

    try:
        job = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        job = []
    for member in reversed(job):  # the workers, then torchrun: one after the other, within microseconds
        try:
            member.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    process.wait()
    psutil.wait_procs(job[1:], timeout=30)


def _wait_for_text(path: Path, text: str, offset: int, process: subprocess.Popen, timeout: float = 300) -> bool:
    """Wait until ``text`` appears in the log after byte ``offset``; False if the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text.encode() in path.read_bytes()[offset:]:
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.01)
    raise TimeoutError(f"no {text!r} in {path} after {timeout:.0f} s")


def _temporary_folders(checkpoint_dir: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(checkpoint_dir) if entry.name.startswith(".tmp-"))
    except FileNotFoundError:
        return []


def _same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(str(a)), load_file(str(b))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def check_checkpoints(run: Path, reference: Path) -> list[int]:
    """Every complete checkpoint of ``run`` loads and equals the reference's at the same step; their steps."""
    steps = []
    for checkpoint in list_checkpoints(run / "checkpoints"):
        step = int(checkpoint.name[len(CHECKPOINT_PREFIX) :])
        state = json.loads((checkpoint / STATE_FILE).read_text())
        if state["step"] != step:
            raise AssertionError(f"{checkpoint}: trainer_state.json says step {state['step']}")
        if not _same_weights(
            checkpoint / "model.safetensors", reference / "checkpoints" / checkpoint.name / "model.safetensors"
        ):
            raise AssertionError(f"{checkpoint} differs from the uninterrupted run's {checkpoint.name}")
        steps.append(step)
    return steps


def kill_and_resume(
    workdir: Path, kills: int = 30, steps: int = 200, save_every: int = 4, seed: int = 0, processes: int = 1
) -> dict:
    """Run the whole procedure in ``workdir``; returns a report (raises AssertionError on any mismatch)."""
    rng = random.Random(seed)
    corpus = write_corpus(workdir / "corpus")

    # 1. the uninterrupted reference, every checkpoint kept
    reference = workdir / "reference"
    (workdir / "reference.json").write_text(json.dumps(run_config(corpus, reference, steps, save_every, 10**6, None)))
    started = time.monotonic()
    process = _start(workdir / "reference.json", workdir / "reference.log", processes)
    if process.wait() != 0:
        raise RuntimeError(f"the reference run failed:\n{(workdir / 'reference.log').read_text()[-3000:]}")
    reference_seconds = time.monotonic() - started
    step_seconds = json.loads((reference / "results.json").read_text())["loop_seconds"] / steps

    # 2. the same run (with the reference's tokenizer), killed again and again
    run = workdir / "killed"
    config_path = workdir / "killed.json"
    config_path.write_text(json.dumps(run_config(corpus, run, steps, save_every, 2, reference / "tokenizer")))
    log_path, events, t0 = workdir / "killed.log", [], time.monotonic()
    for i in range(kills + 1):
        offset = log_path.stat().st_size if log_path.exists() else 0
        leftovers = set(_temporary_folders(run / "checkpoints"))
        resumed_from = (list_checkpoints(run / "checkpoints") or [None])[-1]
        process = _start(config_path, log_path, processes)
        event = {
            "start": time.monotonic() - t0,
            "resumed_from": resumed_from.name if resumed_from else None,
            "leftovers": sorted(leftovers),
        }
        if i == kills:  # the last start runs to the end
            if process.wait() != 0:
                raise RuntimeError(f"the final resume failed:\n{log_path.read_text()[-3000:]}")
            event.update(kind="finish", end=time.monotonic() - t0)
            events.append(event)
            break
        kind = "random" if i % 2 == 0 else "write"
        if not _wait_for_text(log_path, LOOP_STARTED, offset, process):
            raise RuntimeError(f"a resumed run ended before its loop:\n{log_path.read_text()[-3000:]}")
        # from here on, every .tmp- folder is this process's own (it removed the leftovers before its loop)
        if kind == "random":
            time.sleep(rng.uniform(0, 12 * step_seconds))
        else:
            while process.poll() is None and not _temporary_folders(run / "checkpoints"):
                time.sleep(0.0002)
        if process.poll() is not None:  # it finished before the kill: --steps is too small for --kills
            if process.returncode != 0:
                raise RuntimeError(f"a resumed run failed:\n{log_path.read_text()[-3000:]}")
            event.update(kind="finish", end=time.monotonic() - t0)
            events.append(event)
            break
        _kill_job(process)
        during = [name for name in _temporary_folders(run / "checkpoints")]
        event.update(kind=kind, end=time.monotonic() - t0, during=during, complete=check_checkpoints(run, reference))
        if leftovers and f"ignoring incomplete checkpoint {sorted(leftovers)[0]}" not in log_path.read_bytes()[
            offset:
        ].decode("utf-8", "replace"):  # offset: bytes
            raise AssertionError(f"start {i} did not report the half-written {sorted(leftovers)}")
        events.append(event)

    # 3. the end: identical to the uninterrupted run
    last = check_checkpoints(run, reference)
    if not last or last[-1] != steps:
        raise AssertionError(f"the killed run ended with checkpoints {last}, not at step {steps}")
    final_identical = _same_weights(run / "final" / "model.safetensors", reference / "final" / "model.safetensors")
    if not final_identical:
        raise AssertionError("the averaged final model differs from the uninterrupted run's")
    killed = [e for e in events if e["kind"] != "finish"]
    return {
        "processes": processes,
        "steps": steps,
        "save_every": save_every,
        "kills": len(killed),
        "kills_during_checkpoint_writes": sum(
            any(n.startswith(".tmp-checkpoint") for n in e["during"]) for e in killed
        ),
        "kills_during_rotations": sum(any(n.startswith(".tmp-deleting") for n in e["during"]) for e in killed),
        "resumes": len(events) - 1,
        "resumes_matching_reference": len(events) - 1,  # every check above passed
        "final_bit_identical": final_identical,
        "reference_seconds": reference_seconds,
        "killed_run_seconds": events[-1]["end"],
        "events": events,
    }


def draw(report: dict, path: Path) -> None:
    """Newest complete checkpoint over wall-clock time, with the kills marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4), dpi=110)
    for e in report["events"]:
        start = int(e["resumed_from"].split("-")[1]) if e["resumed_from"] else 0
        end = e["complete"][-1] if e.get("complete") else report["steps"] if e["kind"] == "finish" else start
        ax.plot([e["start"], e["end"]], [start, end], color="tab:blue", lw=1.5)
        if e["kind"] != "finish":
            during = bool(e["during"])
            ax.plot(e["end"], end, "x" if not during else "o", color="tab:red" if not during else "tab:orange", ms=7)
    ax.plot([], [], "x", color="tab:red", label="SIGKILL at a random moment")
    ax.plot([], [], "o", color="tab:orange", label="SIGKILL during a checkpoint write or rotation")
    ax.plot([], [], color="tab:blue", label="newest complete checkpoint (step) of each process")
    ax.set_xlabel("wall-clock seconds (each restart includes ~3-5 s of start-up)")
    ax.set_ylabel("training step")
    ax.set_title(
        f"{report['processes']} process(es), {report['kills']} kills of the whole job, {report['resumes']} resumes: "
        "final weights bit-identical to an "
        f"uninterrupted run: {report['final_bit_identical']}",
        fontsize=9,
    )
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=1, help="processes per run (torchrun, gloo) when above 1")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results", help="where the report goes")
    parser.add_argument("--workdir", type=Path, default=ROOT / "outputs" / "kill-resume")
    args = parser.parse_args(argv)
    if args.kills < 1 or args.steps < 2 * args.save_every or args.processes < 1:
        parser.error("--kills and --processes must be >= 1 and --steps at least twice --save-every")
    if args.workdir.exists():
        import shutil

        shutil.rmtree(args.workdir)
    report = kill_and_resume(
        args.workdir,
        kills=args.kills,
        steps=args.steps,
        save_every=args.save_every,
        seed=args.seed,
        processes=args.processes,
    )
    args.output.mkdir(parents=True, exist_ok=True)
    name = "kill-resume" if args.processes == 1 else f"kill-resume-{args.processes}processes"
    (args.output / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    draw(report, args.output / f"{name}.png")
    summary = {k: v for k, v in report.items() if k != "events"}
    lines = [
        "| " + " | ".join(summary) + " |",
        "|" + "---|" * len(summary),
        "| " + " | ".join(f"{v:.0f}" if isinstance(v, float) else str(v) for v in summary.values()) + " |",
    ]
    (args.output / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
