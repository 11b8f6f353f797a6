"""Table 3 of the paper at convergence: the rows that decide the paper's claims, each trained until its
validation loss stops improving, on paired seeds, with verdicts read from 95 % intervals.

    python benchmarks/table3_converged.py --pilot                # the recipe pilot: curves of base and N=6
    python benchmarks/table3_converged.py --pilot multi30k:C-N6   # one of its runs
    python benchmarks/table3_converged.py --rows base C-N1       # some rows (their seeds: SEEDS)
    python benchmarks/table3_converged.py --rows base --seeds 3 4
    python benchmarks/table3_converged.py --report               # table3-converged.md and .png from the json
    python benchmarks/table3_converged.py --smoke --data DIR --output DIR --workdir DIR   # seconds, every path

Where `benchmarks/table3.py` ranks every row after 750 steps (how fast each learns), this script asks what the
paper asks: which variation ends better. Its design:

* **One recipe for every row**, found by `--pilot` (base and N=6 post-LN, the row most likely to fail, under
  candidates of PILOT_RECIPES, as PILOT lists; their validation curves go to table3-pilot.{json,png}). RECIPE
  holds the recipe chosen; rows differ from the base only in the variable each changes.
* **Trained to convergence.** Validation NLL (unsmoothed, teacher-forced, the whole `val` split) every
  EVAL_EVERY steps, with a checkpoint there. A run stops when the NLL has not improved for PATIENCE
  evaluations (never before MIN_EPOCHS epochs), or at the cap of MAX_EPOCHS epochs. Training goes in chunks of
  EVAL_EVERY steps, each resuming from the previous chunk's checkpoint: resuming is bit-exact
  (tests/test_training.py), so a chunked run is the same run, and a killed one goes on from its last chunk.
* **Three models per run**, each scored by validation perplexity and by sacreBLEU on test_2016_flickr
  (beam 4, α 0.6, at most source + 50 tokens): the checkpoint with the lowest validation NLL ("selected", which
  the verdicts use), the average of the AVERAGE checkpoints centred on it, and the last one trained (at the cap,
  or where the run stopped: the paper-faithful number, which shows over-fitting).
* **Paired seeds.** Seed k fixes the initialisation, the batch order and dropout, the same k in every row, so
  each row is compared with the base of the same seed. SEEDS gives each row its count: 5 for the base, 3 for a
  row that decides a claim, 2 for the others.
* **Verdicts from intervals.** A row's difference from the base, Δ = row − base, gets a 95 % interval: the
  mean over the paired seeds, ± t(n − 1) × √(s²/n + v), where s is the seeds' standard deviation of Δ and v the
  variance of the seeds' mean Δ under paired bootstrap resampling of the test sentences (the same resamples for
  every run, as sacreBLEU's paired bootstrap draws them; perplexity: seeds only, its set being fixed). A claim
  holds when every comparison it makes excludes 0 in the paper's direction, is contradicted when one excludes 0
  the other way, and is not resolvable at this scale otherwise. The report states up front the smallest
  difference the design resolves (the half-width of the base's own interval at the rows' seed count).

The base has the paper's P_drop, 0.1, where benchmarks/table3.py's has 0.3 (ROWS_BASE says why; row D-drop0.3 is
that base). The rows are benchmarks/table3.py's, with its mapping of the paper's sizes onto this project's base;
row (B) is left out (there d_v shrinks with d_k, which the paper's row keeps at 64), and so are the width and FFN
rows of (C), whose claim the depth rows test at a lower cost.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import multi30k  # noqa: E402  (benchmarks/multi30k.py)
from reporting import cpu_name, multi30k_folder  # noqa: E402
from table3 import (  # noqa: E402
    ROW_BY_KEY,
    SMOKE_BASE,
    Row,
    describe_change,
    load_results,
    setting,
    settings,
    shared_tokenizer,
    validation_perplexity,
)

from vanilla_transformer.checkpoints import average_into_model, list_checkpoints, write_json_atomically  # noqa: E402
from vanilla_transformer.data import load_parallel_corpus  # noqa: E402
from vanilla_transformer.evaluation import evaluate_model  # noqa: E402
from vanilla_transformer.loading import load_model, load_tokenizer  # noqa: E402
from vanilla_transformer.training import train  # noqa: E402
from vanilla_transformer.training_config import TrainConfig  # noqa: E402

BASE = {**multi30k.MODEL, "dropout": multi30k.RECIPE["dropout"], "label_smoothing": 0.1}
#: Bases the pilot compares: multi30k.py's model (d256), and one of half its width (d128: 4 heads of 32, d_ff 512),
#: which a training step of the same tokens costs about a third of (a cheaper plan, if the recipe trains it).
BASES = {"d256": BASE, "d128": {**BASE, "d_model": 128, "encoder_ffn_dim": 512, "decoder_ffn_dim": 512}}
#: d128 with the paper's P_drop, 0.1, instead of benchmarks/multi30k.py's 0.3 (chosen there for d256 trained an hour).
BASES["d128-p0.1"] = {**BASES["d128"], "dropout": 0.1}
#: The base the rows vary: d128 with the paper's dropout. Timed side by side, a thread each
#: (table3-base-timing.json), d128's steps train 2.7 times the target tokens per second of d256's, so a run to the
#: 20-epoch cap takes about 0.6 hours of training against 1.6, and the plan fits its budget; the pilot showed that
#: RECIPE trains N=6 on it. The first runs varied d128 with P_drop 0.3; trained to the cap, P_drop 0.1 scored about
#: 5 BLEU more over 3 paired seeds, so the base became the paper's 0.1, those runs became row D-drop0.3 and
#: D-drop0.1's became the base's (the same settings and seeds; their records say ``renamed_from``).
ROWS_BASE = "d128-p0.1"
#: The earlier base's dropout as a row (the paper has no such row for its base model; its big one uses 0.3).
ROW_BY_KEY = {**ROW_BY_KEY, "D-drop0.3": Row("D-drop0.3", "D", setting(dropout=0.3))}
MAX_TOKENS = multi30k.RECIPE["max_tokens_per_step"]
#: Candidate recipes of the pilot: warm-up steps, peak learning rate, gradient clipping (None: none). Warm-up
#: stays well under the 20-epoch cap (about 4,000 steps here), which rules out fairseq's 4,000.
PILOT_RECIPES = {
    "multi30k": {"warmup_steps": 300, "peak_lr": 1.1e-3, "max_grad_norm": None},  # benchmarks/multi30k.py's
    "warmup1000-7e-4": {"warmup_steps": 1000, "peak_lr": 7e-4, "max_grad_norm": 1.0},
    "warmup1000-5e-4": {"warmup_steps": 1000, "peak_lr": 5e-4, "max_grad_norm": 1.0},  # fairseq's peak
}
#: The pilot's runs (recipe, row, steps, base), seed 0. multi30k's recipe trains the base (benchmarks/table3.py's
#: 750 steps), so only N=6 runs with it, as long as N=6 took there to stall (250 steps) and a little more.
PILOT = [
    ("multi30k", "C-N6", 500, "d256"),
    ("warmup1000-7e-4", "base", 1000, "d256"),
    ("warmup1000-7e-4", "C-N6", 1000, "d256"),
    ("warmup1000-5e-4", "base", 1000, "d256"),
    ("warmup1000-5e-4", "C-N6", 1000, "d256"),
    ("warmup1000-7e-4", "base", 1000, "d128"),
    ("warmup1000-7e-4", "C-N6", 1000, "d128"),
]
#: The recipe every row trains with (set from the pilot's curves; see docs/benchmarks.md).
RECIPE = PILOT_RECIPES["warmup1000-7e-4"]
EVAL_EVERY = 250  # steps between validation evaluations (and checkpoints): about 1.25 epochs of Multi30k
MAX_EPOCHS = 20
MIN_EPOCHS = 6  # no early stop before
PATIENCE = 4  # evaluations without a lower validation NLL
AVERAGE = 5  # checkpoints averaged around the selected one
BOOTSTRAP_SAMPLES = 1000
#: Rows and their paired seeds: 5 for the base, 3 for the rows that decide a claim, 2 for the others.
SEEDS = {
    "base": 5,
    "A-h1": 3,
    "A-h16": 3,
    "C-N1": 3,
    "C-N6": 3,
    "D-drop0.0": 3,
    "D-drop0.3": 5,  # the earlier base's 5 seeds (see ROWS_BASE)
    "D-ls0.0": 3,
    "E-learned": 3,
    "X-pre-ln": 2,
    "X-no-scale": 2,
}
#: "Nearly identical" (§6.2, learned positions) as a margin: half the smallest loss the paper calls one (single-head
#: attention, 0.9 BLEU).
EQUIVALENCE_MARGIN_BLEU = 0.45
#: The paper's claims (§5.4 and §6.2), each as the comparisons it makes: (row, reference row, metric, the paper's
#: direction of row − reference: "+" higher, "-" lower, "=" within the margin).
CLAIMS = [
    ("(A) single-head attention is worse than the base's heads (paper: −0.9 BLEU)", [("A-h1", "base", "bleu", "-")]),
    ("(A) quality drops off with too many heads (paper: 32 heads −0.4 BLEU)", [("A-h16", "base", "bleu", "-")]),
    (
        "(C) bigger models are better (depth: the paper's N=2 −2.1 BLEU; its N=8, −0.3, is not part of the claim)",
        [("base", "C-N1", "bleu", "+"), ("C-N6", "C-N1", "bleu", "+")],
    ),
    (
        "(D) dropout is very helpful in avoiding over-fitting (paper: none −1.2 BLEU against its P_drop 0.1)",
        [("D-drop0.0", "base", "bleu", "-")],
    ),
    (
        "(§5.4) label smoothing hurts perplexity but improves BLEU (paper, without it: PPL 4.67 against 4.92, "
        "−0.5 BLEU)",
        [("D-ls0.0", "base", "ppl", "-"), ("D-ls0.0", "base", "bleu", "-")],
    ),
    (
        f"(E) learned positions give nearly identical results (within ±{EQUIVALENCE_MARGIN_BLEU} BLEU; paper: −0.1)",
        [("E-learned", "base", "bleu", "=")],
    ),
]
BEYOND = [
    ("D-drop0.3", "P_drop 0.3 (the earlier base's) against the paper's 0.1"),
    ("X-pre-ln", "pre-LN"),
    ("X-no-scale", "no √d_model embedding scale"),
    ("C-N6", "N=6 against the base"),
]
#: Rows of this table beside the 750-step row of the same settings in benchmarks/table3.py, whose base has
#: P_drop 0.3.
ROW_AT_750_STEPS = {"base": "D-drop0.1", "D-drop0.3": "base"}
SMOKE = {"eval_every": 3, "max_epochs": 2, "min_epochs": 1, "patience": 2, "max_tokens": 256, "vocab_size": 400}


# --------------------------------------------------------------------------------------------
# One run: a row with a seed, trained to convergence in chunks
# --------------------------------------------------------------------------------------------
def lr_factor(recipe: dict, d_model: int) -> float:
    """The factor of the paper's schedule d^-0.5 · min(step^-0.5, step · warmup^-1.5) that peaks at the recipe's
    learning rate (the peak is d^-0.5 · warmup^-0.5 at factor 1)."""
    return recipe["peak_lr"] / (d_model**-0.5 * recipe["warmup_steps"] ** -0.5)


def run_config(row_settings: dict, seed: int, recipe: dict, args, output_dir: Path, max_steps: int) -> TrainConfig:
    model_settings = {k: v for k, v in row_settings.items() if k != "label_smoothing"}
    return TrainConfig(
        dataset_name=str(args.data),
        source_lang=args.src_lang,
        target_lang=args.tgt_lang,
        validation_split="validation",
        test_split=None,
        tokenizer_name=str(args.workdir / "tokenizer"),
        config_overrides=model_settings,
        label_smoothing_factor=row_settings["label_smoothing"],
        max_tokens=args.max_tokens,
        warmup_steps=recipe["warmup_steps"],
        lr_factor=lr_factor(recipe, row_settings["d_model"]),
        max_grad_norm=recipe["max_grad_norm"],
        max_steps=max_steps,
        mixed_precision="no",
        seed=seed,
        logging_steps=50,
        eval_steps=args.eval_every,
        eval_bleu_sentences=0,
        save_steps=args.eval_every,
        save_total_limit=1,
        average_last=1,
        output_dir=str(output_dir),
        resume_from_checkpoint="latest" if list_checkpoints(output_dir / "checkpoints") else None,
        disable_tqdm=args.smoke,
    )


def window(curve: list[dict], best: int, size: int) -> list[dict]:
    """The evaluations of the ``size`` checkpoints centred on ``curve[best]`` (fewer at either end)."""
    low = max(0, best - size // 2)
    return curve[low : low + size]


def should_stop(curve: list[dict], args, cap_only: bool = False) -> str | None:
    """ "cap" after MAX_EPOCHS epochs; "early" when the NLL has not improved for PATIENCE evaluations (not
    before MIN_EPOCHS epochs); None to go on."""
    if curve and curve[-1]["epoch"] >= args.max_epochs:
        return "cap"
    if cap_only or not curve or curve[-1]["epoch"] < args.min_epochs:
        return None
    best = min(range(len(curve)), key=lambda i: curve[i]["valid_nll"])
    return "early" if len(curve) - 1 - best >= args.patience else None


def train_run(row_settings: dict, seed: int, recipe: dict, args, output_dir: Path, max_steps: int | None) -> list:
    """Train in chunks of ``eval_every`` steps to convergence (or to ``max_steps``: the pilot), keeping the
    weights of each evaluation near the best one; the validation curve (resumed where a killed run stopped)."""
    curve_path, evals = output_dir / "curve.json", output_dir / "evals"
    curve = json.loads(curve_path.read_text()) if curve_path.is_file() else []
    evals.mkdir(parents=True, exist_ok=True)
    while not (max_steps and curve and curve[-1]["step"] >= max_steps):
        if max_steps is None and should_stop(curve, args):
            break
        target = (curve[-1]["step"] if curve else 0) + args.eval_every
        summary = train(run_config(row_settings, seed, recipe, args, output_dir, target))
        if summary["step"] != target or "valid_nll" not in summary:
            raise RuntimeError(f"{output_dir.name} stopped at step {summary['step']} without its evaluation")
        checkpoint = list_checkpoints(output_dir / "checkpoints")[-1]
        shutil.copyfile(checkpoint / "model.safetensors", evals / f"step-{target}.safetensors")
        curve.append(
            {
                "step": target,
                "epoch": summary["epoch"],  # epochs completed
                "valid_nll": summary["valid_nll"],
                "valid_loss": summary["valid_loss"],
                "loop_seconds": summary["loop_seconds"],
                "target_tokens": summary["target_tokens"],
            }
        )
        write_json_atomically(curve_path, curve)
        best = min(range(len(curve)), key=lambda i: curve[i]["valid_nll"])
        keep = {e["step"] for e in window(curve, best, args.average)} | {curve[-1]["step"]}
        for path in evals.glob("step-*.safetensors"):
            if int(path.stem.split("-")[1]) not in keep:
                path.unlink()
    return curve


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------
def score_models(curve: list[dict], args, output_dir: Path, corpus, row_key: str, seed: int) -> dict:
    """Validation perplexity and test BLEU of the selected, averaged and last weights; their outputs are kept
    under the results folder (the verdicts resample them)."""
    tokenizer = load_tokenizer(args.workdir / "tokenizer")
    model = load_model(output_dir / "final")
    best = min(range(len(curve)), key=lambda i: curve[i]["valid_nll"])
    models = {
        "selected": [curve[best]],
        "averaged": window(curve, best, args.average),
        "last": [curve[-1]],
    }
    test, scores = corpus[args.test_split], {}
    outputs = args.output / "table3-converged"
    outputs.mkdir(parents=True, exist_ok=True)
    for name, evaluations in models.items():
        average_into_model(model, [output_dir / "evals" / f"step-{e['step']}.safetensors" for e in evaluations])
        model.eval()
        ppl = validation_perplexity(model, tokenizer, corpus["validation"], max_tokens=4000)
        hypotheses = output_dir / f"test.{name}.hyp"
        bleu = evaluate_model(
            model, tokenizer, test["source"], test["target"], hypotheses_path=hypotheses, num_beams=4, progress=False
        )
        with gzip.open(outputs / f"{row_key}-seed{seed}.{name}.hyp.gz", "wt", encoding="utf-8") as f:
            f.write(hypotheses.read_text(encoding="utf-8"))
        scores[name] = {
            "steps": [e["step"] for e in evaluations],
            "ppl": ppl["ppl"],
            "nll": ppl["nll"],
            "bleu": bleu["bleu"],
            "bleu_signature": bleu["bleu_signature"],
            "chrf": bleu["chrf"],
        }
    return scores


def run_one(row_key: str, seed: int, args, corpus) -> dict:
    """Train and score one row with one seed; the record of the results file."""
    base = SMOKE_BASE if args.smoke else BASES[ROWS_BASE]
    row_settings = settings(ROW_BY_KEY[row_key], base)
    output_dir = args.workdir / f"{row_key}-seed{seed}"
    if args.rerun and output_dir.exists():
        shutil.rmtree(output_dir)
    started = time.monotonic()
    curve = train_run(row_settings, seed, RECIPE, args, output_dir, None)
    stop = should_stop(curve, args, cap_only=True) or "early"
    scores = score_models(curve, args, output_dir, corpus, row_key, seed)
    shutil.rmtree(output_dir / "checkpoints")
    shutil.rmtree(output_dir / "evals")
    model = load_model(output_dir / "final")
    return {
        "row": row_key,
        "seed": seed,
        "base": "smoke" if args.smoke else ROWS_BASE,
        "settings": row_settings,
        "params": sum(p.numel() for p in model.parameters()),
        "recipe": RECIPE,
        "stop": stop,
        "curve": curve,
        **scores,
        "train_seconds": curve[-1]["loop_seconds"],  # the training loop's, over every start of the run
        "seconds": time.monotonic() - started,  # this start's, scoring included
        "machine": cpu_name(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "revision": args.revision,
        "command": args.command,
    }


def pilot_key(recipe: str, row: str, base: str = "d256") -> str:
    """``RECIPE:ROW``, with ``@BASE`` for a base other than d256 (e.g. ``warmup1000-7e-4:C-N6@d128``)."""
    return f"{recipe}:{row}" + ("" if base == "d256" else f"@{base}")


def run_pilot(args) -> dict:
    """The pilot's runs (all of PILOT, or those ``args.pilot`` names), each recorded in table3-pilot.json as it
    ends (runs side by side keep each other's): their validation curves, with tokens and seconds."""
    path = args.output / "table3-pilot.json"
    for name, row_key, steps, base_name in PILOT:
        key = pilot_key(name, row_key, base_name)
        if args.pilot and key not in args.pilot:
            continue
        steps = args.eval_every if args.smoke else steps
        row_settings = settings(ROW_BY_KEY[row_key], SMOKE_BASE if args.smoke else BASES[base_name])
        recipe = PILOT_RECIPES[name]
        output_dir = args.workdir / "pilot" / key.replace(":", "-").replace("@", "-")
        print(f"pilot: {row_key} of the {base_name} base with {name} {recipe}, {steps} steps", flush=True)
        curve = train_run(row_settings, 0, recipe, args, output_dir, steps)
        shutil.rmtree(output_dir / "checkpoints", ignore_errors=True)
        shutil.rmtree(output_dir / "evals", ignore_errors=True)
        with FileLock(str(path) + ".lock"):
            report = load_results(path) if path.is_file() else {"runs": {}}
            report["runs"][key] = {
                "recipe": recipe,
                "row": row_key,
                "base": base_name,
                "settings": row_settings,
                "curve": curve,
                "machine": cpu_name(),
                "threads": torch.get_num_threads(),
                "revision": args.revision,
                "command": args.command,
            }
            write_json_atomically(path, report)
            draw_pilot(report, args.output / "table3-pilot.png")
    return load_results(path)


def train_first_chunk(args, base_name: str, output_dir: Path) -> dict:
    """Train the base row of ``base_name`` (a key of BASES), seed 0, RECIPE, for one chunk (``eval_every``
    steps) in a fresh ``output_dir``, which is removed afterwards; returns train()'s summary."""
    row_settings = settings(ROW_BY_KEY["base"], SMOKE_BASE if args.smoke else BASES[base_name])
    shutil.rmtree(output_dir, ignore_errors=True)
    summary = train(run_config(row_settings, 0, RECIPE, args, output_dir, args.eval_every))
    shutil.rmtree(output_dir)
    return {**summary, "settings": row_settings}


def time_base(args, base_name: str) -> dict:
    """Train the base row of one base (BASES) for one chunk (``eval_every`` steps, seed 0, RECIPE) and record
    its training loop's target tokens and seconds in table3-base-timing.json, with the load average around it
    (two of these side by side, a thread each, load 2 cores as the rows do). What the plan's cost is read from."""
    path = args.output / "table3-base-timing.json"
    load_before = os.getloadavg()[0]
    summary = train_first_chunk(args, base_name, args.workdir / "timing" / base_name)
    record = {
        "base": base_name,
        "settings": summary["settings"],
        "steps": summary["step"],
        "target_tokens": summary["target_tokens"],
        "loop_seconds": summary["loop_seconds"],
        "target_tokens_per_s": summary["target_tokens"] / summary["loop_seconds"],
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "machine": cpu_name(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "revision": args.revision,
        "command": args.command,
    }
    with FileLock(str(path) + ".lock"):
        report = load_results(path) if path.is_file() else {"runs": {}}
        report["runs"][base_name] = record
        write_json_atomically(path, report)
    print(f"{base_name}: {record['target_tokens_per_s']:,.0f} target tokens/s on {record['threads']} thread(s)")
    return record


def check_start(args, results_path: Path) -> dict:
    """Train the first chunk of the base row, seed 0, again and compare its validation NLL with the recorded
    run's, bit for bit: rows trained at later commits (or later starts) train as the first ones did when it is
    identical. Recorded under ``start_checks`` in table3-converged.json."""
    results = load_results(results_path)
    recorded = next((r for r in results["runs"] if (r["row"], r["seed"]) == ("base", 0)), None)
    if recorded is None:
        raise SystemExit(f"--check-start: {results_path.name} has no base seed 0 yet: run `--rows base --seeds 0`")
    summary = train_first_chunk(args, ROWS_BASE, args.workdir / "check-start")
    check = {
        "row": "base",
        "revision": args.revision,
        "recorded_revision": recorded["revision"],
        "valid_nll": summary["valid_nll"],
        "recorded_valid_nll": recorded["curve"][0]["valid_nll"],
        "identical": summary["valid_nll"] == recorded["curve"][0]["valid_nll"],
        "machine": cpu_name(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    with FileLock(str(results_path) + ".lock"):
        results = load_results(results_path)
        results.setdefault("start_checks", []).append(check)
        write_json_atomically(results_path, results)
    verdict = "identical" if check["identical"] else "DIFFERENT: rows trained now do not pair with the recorded ones"
    print(
        f"base seed 0, first {args.eval_every} steps at {args.revision}: valid NLL {summary['valid_nll']!r}, "
        f"recorded {check['recorded_valid_nll']!r} at {recorded['revision']}: {verdict}"
    )
    return check


# --------------------------------------------------------------------------------------------
# Intervals and verdicts
# --------------------------------------------------------------------------------------------
def t_quantile(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (scipy's ``t.ppf``, which this
    environment does not install), from the standard table (tests/test_benchmarks.py integrates the density)."""
    if df not in T_975:
        raise ValueError(f"t quantile for {df} degrees of freedom: this table covers 1 to 30")
    return T_975[df]


T_975 = dict(
    enumerate(
        [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131]
        + [2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042],
        start=1,
    )
)


class BleuResampler:
    """Corpus BLEU of any run's outputs over the same bootstrap resamples of the test sentences.

    sacreBLEU's paired bootstrap (``sacrebleu.significance``) draws one set of resamples and scores every system
    on it from per-sentence statistics; this does the same for many runs at once, with sacreBLEU's own statistics
    and score functions (``_extract_corpus_statistics`` and ``_compute_score_from_stats``, the ones its paired
    test calls) and its default seed."""

    def __init__(self, references: list[str], samples: int, seed: int = 12345):
        from sacrebleu.metrics import BLEU

        self.metric = BLEU(references=[references])
        self.indices = np.random.default_rng(seed).choice(len(references), size=(samples, len(references)))

    def scores(self, hypotheses: list[str]) -> np.ndarray:
        stats = np.array(self.metric._extract_corpus_statistics(hypotheses, None), dtype=np.int64)
        return np.array([self.metric._compute_score_from_stats(list(s)).score for s in stats[self.indices].sum(1)])


def paired_interval(deltas: list[float], resampled: np.ndarray | None = None) -> dict | None:
    """The mean of the paired seeds' differences with its 95 % interval: ± t(n − 1) · √(s²/n + v), v being the
    variance of the mean difference over test-set resamples (``resampled``: [seeds, samples]), if given."""
    n = len(deltas)
    if n < 2:
        return None
    mean, s = statistics.fmean(deltas), statistics.stdev(deltas)
    v = float(np.var(resampled.mean(0), ddof=1)) if resampled is not None else 0.0
    half = t_quantile(n - 1) * math.sqrt(s * s / n + v)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n, "seed_sd": s, "test_var": v}


def outcome(interval: dict | None, direction: str) -> str:
    """ "held", "contradicted" or "not resolvable" for one comparison."""
    if interval is None:
        return "not run"
    low, high = interval["low"], interval["high"]
    if direction == "=":  # equivalence: the interval inside the margin, or wholly beyond it
        margin = EQUIVALENCE_MARGIN_BLEU
        if -margin < low and high < margin:
            return "held"
        return "contradicted" if low > margin or high < -margin else "not resolvable"
    sign = 1 if direction == "+" else -1
    if sign * low > 0 and sign * high > 0:
        return "held"
    return "contradicted" if sign * low < 0 and sign * high < 0 else "not resolvable"


def claim_verdict(outcomes: list[str]) -> str:
    if "not run" in outcomes:
        return "not run yet"
    if "contradicted" in outcomes:
        return "contradicted"
    return "held" if all(o == "held" for o in outcomes) else "not resolvable at this scale"


def comparisons(runs: list[dict], references: list[str] | None, model: str = "selected", samples: int = 1000):
    """Every (row, reference, metric) of the claims and BEYOND: its paired interval."""
    by = {(r["row"], r["seed"]): r for r in runs}
    resampler = BleuResampler(references, samples) if references is not None else None
    cache: dict[tuple[str, int], np.ndarray] = {}

    def resampled(key: tuple[str, int]) -> np.ndarray:
        if key not in cache:
            cache[key] = resampler.scores(by[key][f"{model}_hypotheses"])
        return cache[key]

    wanted = {(row, ref, metric) for _, items in CLAIMS for row, ref, metric, _ in items}
    wanted |= {(row, "base", metric) for row, _ in BEYOND for metric in ("bleu", "ppl")}
    result = {}
    for row, ref, metric in sorted(wanted):
        seeds = sorted(s for (r, s) in by if r == row and (ref, s) in by)
        deltas = [by[row, s][model][metric] - by[ref, s][model][metric] for s in seeds]
        matrix = None
        if (
            metric == "bleu"
            and resampler is not None
            and all(f"{model}_hypotheses" in by[k, s] for k in (row, ref) for s in seeds)
        ):
            matrix = np.array([resampled((row, s)) - resampled((ref, s)) for s in seeds]) if seeds else None
        result[(row, ref, metric)] = paired_interval(deltas, matrix)
    return result


def resolvable_effect(runs: list[dict], seeds: int, references: list[str] | None, samples: int = 1000) -> float | None:
    """The smallest |Δ BLEU| this design resolves: the half-width of the interval of the difference between two
    groups of ``seeds`` base seeds (its spread standing in for a row's), from the base's runs."""
    base = sorted((r for r in runs if r["row"] == "base"), key=lambda r: r["seed"])
    if len(base) < 2:
        return None
    s = statistics.stdev(r["selected"]["bleu"] for r in base)
    v = 0.0
    if references is not None and all("selected_hypotheses" in r for r in base):
        # the test-set part: the variance over resamples of the difference of two base seeds, averaged over the
        # pairs, and not divided by the seeds (the resamples are shared, so their errors need not average out)
        resampler = BleuResampler(references, samples)
        scores = [resampler.scores(r["selected_hypotheses"]) for r in base]
        pairs = [(i, j) for i in range(len(scores)) for j in range(i + 1, len(scores))]
        v = statistics.fmean(float(np.var(scores[i] - scores[j], ddof=1)) for i, j in pairs)
    # the difference of two seeds has twice one seed's variance (pairing can only make it smaller)
    return t_quantile(seeds - 1) * math.sqrt(2 * s * s / seeds + v)


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------
def with_hypotheses(runs: list[dict], folder: Path) -> list[dict]:
    """The runs, each with the outputs of its selected model read back (``selected_hypotheses``) when kept."""
    out = []
    for r in runs:
        path = folder / f"{r['row']}-seed{r['seed']}.selected.hyp.gz"
        extra = {}
        if path.is_file():
            with gzip.open(path, "rt", encoding="utf-8") as f:
                extra["selected_hypotheses"] = f.read().splitlines()
        out.append({**r, **extra})
    return out


def _interval_text(interval: dict | None, digits: int = 2) -> str:
    if interval is None:
        return "—"
    return f"{interval['mean']:+.{digits}f} [{interval['low']:+.{digits}f}, {interval['high']:+.{digits}f}]"


def report(results: dict, out: Path, references: list[str] | None, picture: bool = True) -> str:
    """table3-converged.md (and .png) from the results; returns the Markdown."""
    runs = with_hypotheses(results["runs"], out / "table3-converged")
    intervals = comparisons(runs, references, samples=results.get("bootstrap_samples", BOOTSTRAP_SAMPLES))
    effect = resolvable_effect(runs, 3, references, results.get("bootstrap_samples", BOOTSTRAP_SAMPLES))
    revisions = sorted({r["revision"] or "?" for r in runs})
    lines = [
        "# Table 3 at convergence, Multi30k de→en",
        "",
        "Generated by `python benchmarks/table3_converged.py` from `table3-converged.json`; its docstring gives the",
        "design. Each run trains to the lowest validation NLL (early stopping with patience) or its epoch cap.",
        "Scores of the checkpoint selected by validation NLL: perplexity on `val`, sacreBLEU on test_2016_flickr",
        "(beam 4, α 0.6). Δ: row − reference over paired seeds, mean [95 % interval].",
        "",
        "**Smallest resolvable difference** (3 seeds a row, from the base's seeds): "
        + (f"{effect:.2f} BLEU." if effect is not None else "needs at least 2 base seeds."),
        "",
        f"**Commits**: {', '.join(revisions)}"
        + ("" if len(revisions) <= 1 else " — the rows did not all run at one commit")
        + "".join(
            f"; at {c['revision']} (checked {c['date']}) {c.get('row', 'base')} seed 0's first chunk trained to "
            + ("the identical" if c["identical"] else "a DIFFERENT")
            + " validation NLL (`--check-start`)"
            for c in results.get("start_checks", [])
        ),
        "",
        "| row | change | seeds | stopped (step, epoch) | PPL selected | BLEU selected | BLEU averaged | "
        "BLEU last | params |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = results.get("base_settings", BASES[ROWS_BASE])
    for key in SEEDS:
        row_runs = sorted((r for r in runs if r["row"] == key), key=lambda r: r["seed"])
        if not row_runs:
            continue
        stops = ", ".join(f"{r['stop']} {r['curve'][-1]['step']}/{r['curve'][-1]['epoch']}" for r in row_runs)
        cells = [
            key,
            "—" if key == "base" else describe_change(ROW_BY_KEY[key], base),
            len(row_runs),
            stops,
            *(
                _spread([r[m][metric] for r in row_runs])
                for m, metric in (("selected", "ppl"), ("selected", "bleu"), ("averaged", "bleu"), ("last", "bleu"))
            ),
            f"{row_runs[0]['params'] / 1e6:.1f}M",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "## The paper's claims", ""]
    seeds_of = {key: {r["seed"] for r in runs if r["row"] == key} for key in SEEDS}

    def said(row: str, ref: str, result: str) -> str:  # one paired seed runs, but gives no interval yet
        paired = len(seeds_of[row] & seeds_of[ref])
        return f"{paired} paired seed, no interval yet" if result == "not run" and paired == 1 else result

    for text, items in CLAIMS:
        outcomes = [outcome(intervals.get((row, ref, metric)), d) for row, ref, metric, d in items]
        details = "; ".join(
            f"{row} − {ref} {'PPL' if metric == 'ppl' else 'BLEU'} {_interval_text(intervals.get((row, ref, metric)))}"
            f" ({said(row, ref, o)})"
            for (row, ref, metric, _), o in zip(items, outcomes)
        )
        verdict = claim_verdict(outcomes)
        short = [
            f"{row}: {count} of {SEEDS[row]}"
            for row in dict.fromkeys(r for item in items for r in item[:2])
            if 0 < (count := len(seeds_of[row])) < SEEDS[row]
        ]
        if short and verdict != "not run yet":  # an interval from fewer seeds than planned: wider, and not final
            verdict += f", provisional (seeds {', '.join(short)})"
        lines.append(f"- {text}: **{verdict}** ({details})")
    lines += ["", "Beyond the paper (no claim):", ""]
    for row, what in BEYOND:
        bleu, ppl = intervals.get((row, "base", "bleu")), intervals.get((row, "base", "ppl"))
        if bleu is not None:
            lines.append(f"- {what}: {row} − base BLEU {_interval_text(bleu)}, PPL {_interval_text(ppl)}")
    if not any(intervals.get((row, "base", "bleu")) for row, _ in BEYOND):
        lines.append("- none run yet: " + ", ".join(what for _, what in BEYOND))
    signatures = sorted({r["selected"]["bleu_signature"] for r in runs})
    lines += ["", f"sacreBLEU signature: `{'`, `'.join(signatures)}`.", ""]
    early = out / "table3.json"
    if early.is_file():
        lines += beside_750_steps(runs, load_results(early), intervals)
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table3-converged.md").write_text(text)
    if picture:
        draw(intervals, out / "table3-converged.png")
        draw_curves(runs, out / "table3-converged-curves.png")
    return text


def beside_750_steps(runs: list[dict], early: dict, intervals: dict) -> list[str]:
    """Markdown: each converged row beside benchmarks/table3.py's 750-step run of the same row (its own base and
    split: BLEU on `val`, one to three seeds, no interval), as Δ BLEU from the base of each table."""

    def mean_bleu(rows: list[dict], key: str, field: str) -> float | None:
        values = [r[field]["bleu"] for r in rows if r["row"] == key]
        return statistics.fmean(values) if values else None

    early_base = mean_bleu(early["runs"], "base", "val")
    lines = [
        "## Beside the 750-step table",
        "",
        f"`table3.md` trained every row {early.get('steps', 750)} steps on d_model {early['base_settings']['d_model']} "
        "and scored `val`; here the rows train to their early stop or the epoch cap on this table's base and score "
        "test2016. Δ: the row's mean BLEU minus its own table's base mean. That base has P_drop 0.3 and this "
        "one 0.1, so each row stands beside the 750-step row of its settings: "
        + ", ".join(f"{key} beside {early_key}" for key, early_key in ROW_AT_750_STEPS.items())
        + ".",
        "",
        "| row | 750 steps: BLEU | 750 steps: Δ | to the stop: BLEU (selected) | to the stop: Δ [95 %] |",
        "|---|---|---|---|---|",
    ]
    for key in SEEDS:
        late = mean_bleu(runs, key, "selected")
        if late is None:
            continue
        early_key = ROW_AT_750_STEPS.get(key, key)
        before = mean_bleu(early["runs"], early_key, "val")
        cells = [
            key,
            "—" if before is None else f"{before:.2f}",
            "—" if before is None or early_base is None or early_key == "base" else f"{before - early_base:+.2f}",
            f"{late:.2f}",
            "—" if key == "base" else _interval_text(intervals.get((key, "base", "bleu"))),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ({min(values):.2f}–{max(values):.2f})"


def draw(intervals: dict, path: Path) -> None:
    """Each comparison's Δ BLEU with its 95 % interval, against 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = [(k, v) for k, v in intervals.items() if k[2] == "bleu" and v is not None]
    fig, ax = plt.subplots(figsize=(8, 0.4 * max(1, len(items)) + 1.2))
    for y, ((row, ref, _), v) in enumerate(items):
        ax.errorbar(v["mean"], y, xerr=[[v["mean"] - v["low"]], [v["high"] - v["mean"]]], fmt="o", color="0.2")
    ax.axvline(0, color="tab:red", lw=0.8)
    ax.set_yticks(range(len(items)), [f"{row} − {ref}" for (row, ref, _), _ in items], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("Δ sacreBLEU (test2016), mean over paired seeds, 95 % interval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_curves(runs: list[dict], path: Path) -> None:
    """Every run's validation perplexity against optimizer steps: one colour per row, one line per seed, a dot
    where the selected checkpoint is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = plt.get_cmap("tab10").colors
    last = [r["curve"][-1] for r in runs if r["curve"] and r["curve"][-1]["epoch"]]
    steps_per_epoch = statistics.fmean(e["step"] / e["epoch"] for e in last) if last else None
    for i, key in enumerate(k for k in SEEDS if any(r["row"] == k for r in runs)):
        for j, run in enumerate(sorted((r for r in runs if r["row"] == key), key=lambda r: r["seed"])):
            curve = run["curve"]
            ppl = [math.exp(e["valid_nll"]) for e in curve]
            steps = [e["step"] for e in curve]
            best = min(range(len(curve)), key=lambda k: curve[k]["valid_nll"])
            colour, style = colours[i % len(colours)], "-" if i < len(colours) else "--"
            ax.plot(steps, ppl, style, color=colour, lw=2 if key == "base" else 1, label=None if j else key)
            ax.plot(steps[best], ppl[best], "o", color=colour, ms=3)
    ax.set_yscale("log")
    ax.set_yticks([t for t in (2, 5, 10, 20, 50, 100, 200, 500, 1000) if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]])
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(
        f"optimizer step (about {steps_per_epoch:.0f} a Multi30k epoch)" if steps_per_epoch else "optimizer step"
    )
    ax.set_ylabel("validation perplexity (log scale)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_pilot(report: dict, path: Path) -> None:
    """Validation NLL against steps, one line per row and recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, run in report["runs"].items():
        curve = run["curve"]
        style = "-" if run["row"] == "base" else "--"
        ax.plot([e["step"] for e in curve], [e["valid_nll"] for e in curve], style, marker=".", label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation NLL per target token")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=list(SEEDS), help="rows to run (default: all, in order)")
    parser.add_argument("--seeds", nargs="+", type=int, help="seeds of the chosen rows (default: 0..SEEDS[row]-1)")
    parser.add_argument(
        "--pilot",
        nargs="*",
        choices=[pilot_key(name, row, base) for name, row, _, base in PILOT],
        help="the recipe pilot's runs (all of them when none is named)",
    )
    parser.add_argument(
        "--time-base",
        choices=list(BASES),
        help="time one chunk of the base row on this base (BASES) into table3-base-timing.json",
    )
    parser.add_argument(
        "--check-start",
        action="store_true",
        help="train base seed 0's first chunk again: does this commit train as the recorded runs did?",
    )
    parser.add_argument("--report", action="store_true", help="only rebuild table3-converged.md and .png")
    parser.add_argument("--rerun", action="store_true", help="train recorded runs again")
    parser.add_argument("--data", type=Path, default=multi30k_folder())
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--test-split", default="test_2016_flickr")
    parser.add_argument("--workdir", type=Path, default=ROOT / "outputs" / "table3-converged")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--smoke", action="store_true", help="tiny model and epochs: a test of every code path")
    args = parser.parse_args(argv)
    for name, value in (SMOKE if args.smoke else {}).items():
        setattr(args, name, value)
    if not args.smoke:
        args.eval_every, args.max_epochs, args.min_epochs, args.patience = EVAL_EVERY, MAX_EPOCHS, MIN_EPOCHS, PATIENCE
        args.max_tokens, args.vocab_size = MAX_TOKENS, 8000
    args.average = AVERAGE
    args.output.mkdir(parents=True, exist_ok=True)
    results_path = args.output / "table3-converged.json"
    corpus = load_parallel_corpus(str(args.data), args.src_lang, args.tgt_lang)
    if args.test_split not in corpus:
        parser.error(f"--test-split {args.test_split}: {args.data} has {', '.join(corpus)}")
    references = list(corpus[args.test_split]["target"])
    if args.report:
        results = load_results(results_path)
        if not results["runs"]:
            parser.error(f"{results_path} holds no runs yet: run some first (e.g. --rows base)")
        print(report(results, args.output, references))
        return results
    args.revision = multi30k._git_revision()
    args.command = shlex.join(["python", "benchmarks/table3_converged.py", *(sys.argv[1:] if argv is None else argv)])
    shared_tokenizer(args.workdir / "tokenizer", corpus, args.vocab_size)
    if args.pilot is not None:
        return run_pilot(args)
    if args.time_base:
        return time_base(args, args.time_base)
    if args.check_start:
        return check_start(args, results_path)
    results = load_results(results_path)
    todo = [
        (key, seed)
        for key in (args.rows or list(SEEDS))
        for seed in (args.seeds if args.seeds is not None else range(SEEDS[key]))
        if args.rerun or not any((r["row"], r["seed"]) == (key, seed) for r in results["runs"])
    ]
    print(f"{len(todo)} run(s) to do: " + ", ".join(f"{key} seed {seed}" for key, seed in todo), flush=True)
    for i, (key, seed) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {key} seed {seed}", flush=True)
        record = run_one(key, seed, args, corpus)
        with FileLock(str(results_path) + ".lock"):  # runs side by side (one thread each) keep each other's rows
            results = load_results(results_path)
            results["runs"] = [r for r in results["runs"] if (r["row"], r["seed"]) != (key, seed)] + [record]
            base_settings = SMOKE_BASE if args.smoke else BASES[ROWS_BASE]
            results.update(base_settings=base_settings, bootstrap_samples=BOOTSTRAP_SAMPLES)
            results["environment"] = {"torch": torch.__version__, "cpus": os.cpu_count()}
            write_json_atomically(results_path, results)
            report(results, args.output, references)
        print(
            f"[{i}/{len(todo)}] {key} seed {seed}: stopped {record['stop']} at step {record['curve'][-1]['step']}; "
            f"selected PPL {record['selected']['ppl']:.2f}, BLEU {record['selected']['bleu']:.2f}",
            flush=True,
        )
    return results


if __name__ == "__main__":
    main()
