"""Table 3 of the paper, rerun at laptop scale: each model variation trained on Multi30k de->en for the same
number of optimizer steps, scored on the validation set, beside the base model's noise band over seeds.

    python benchmarks/table3.py                          # every row not yet in benchmarks/results/table3.json
    python benchmarks/table3.py --rows base A-h1 A-h2    # a subset (--list shows the rows)
    python benchmarks/table3.py --rows A-h2 --seeds 1    # a second seed of one row
    python benchmarks/table3.py --rows A-h1 --rerun      # train a recorded row again
    python benchmarks/table3.py --report                 # only rebuild table3.md and table3.png from the json
    python benchmarks/table3.py --smoke --data DIR --src-lang en --tgt-lang de --output DIR   # seconds per row

The recipe is benchmarks/multi30k.py's (token-bucketed batches of 2,500 padded tokens per side, Adam
0.9/0.98/1e-9, 300 warm-up steps then inverse square root at lr_factor 0.3, label smoothing 0.1, dropout 0.3)
in one process (every CPU thread unless OMP_NUM_THREADS says fewer) and in float32, so that a row's numbers do
not depend on the machine's bf16 support. Every row trains for STEPS optimizer steps (the paper: 100K for each
row) from the same seed, with one joint BPE vocabulary shared by all rows, and is scored on `val` (the paper
scores Table 3 on a dev set): perplexity per target token (unsmoothed, teacher-forced) and sacreBLEU with beam
4, alpha 0.6, at most source + 50 tokens, on the last weights, without checkpoint averaging (as the paper's
Table 3). The base row also scores the average of its last 5 checkpoints (saved every 50 steps): the row
"X-averaged".

How the paper's changes map onto this project's base (d_model 256, N=3, h=4, d_k=64, d_ff 1024, P_drop 0.3),
the paper's base being d_model 512, N=6, h=8, d_k=64, d_ff 2048, P_drop 0.1:
  (A) heads with h*d_k = d_model: the paper's h = 1/4/16/32 are 1/8, 1/2, 2x and 4x its 8 heads; here
      h = 1 (one head, as the paper's first row), 2, 8, 16, with d_k = 256/128/32/16.
  (B) d_k 16 and 32 with h fixed: the same fractions (1/4, 1/2) of the base's d_k of 64, here with h = 4
      (the config's head_dim; the attention then has h*d_k < d_model). head_dim sets d_k and d_v together,
      where the paper's row (B) kept d_v = 64: its attention outputs lose width here, not in the paper.
  (C) depth: the paper's N = 2/4/8 around 6; here N = 1/2/6 around 3. Width: d_model x1/2 and x2 with h fixed
      (d_k follows), as the paper's 256/1024; d_ff x1/2 and x2, as the paper's 1024/4096.
  (D) dropout: the paper's 0.0 and 0.2 around 0.1 are "none" and "more"; here 0.0 and 0.5 around 0.3, plus 0.1.
      Label smoothing 0.0 and 0.2 around 0.1, as the paper.
  (E) learned positions instead of sinusoids.
  Beyond the paper: pre-LN (norm_first), no sqrt(d_model) embedding scale, untied embeddings, and the base
  with checkpoint averaging.

Rows are appended to benchmarks/results/table3.json as each finishes (with its command, commit, seed, budget
and process layout); a recorded row is not trained again unless --rerun; an interrupted row resumes from its
newest checkpoint (outputs/table3/<row>-seed<k>/). The base row runs with 3 seeds: their spread is the noise
band each other row is compared with. table3.md and table3.png are rebuilt after every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from multi30k import MODEL, RECIPE, _git_revision  # noqa: E402

from vanilla_transformer.checkpoints import (  # noqa: E402
    average_into_model,
    list_checkpoints,
    save_folder_atomically,
    write_json_atomically,
)
from vanilla_transformer.data import load_parallel_corpus, tokenize_corpus  # noqa: E402
from vanilla_transformer.evaluation import evaluate_model, perplexity  # noqa: E402
from vanilla_transformer.loading import load_model, load_tokenizer  # noqa: E402
from vanilla_transformer.tokenization import save_tokenizer, train_joint_bpe  # noqa: E402
from vanilla_transformer.training import train  # noqa: E402
from vanilla_transformer.training_config import TrainConfig  # noqa: E402

# 750 steps of the base row took 14.8 minutes of training on 2 cores (AMD EPYC, AVX2, float32, 1.18 s a step).
STEPS = 750
SAVE_EVERY = 50  # the last 5 checkpoints (steps 550..750) make the averaged model of the row X-averaged
BASE_SEEDS = (0, 1, 2)
BASE = {**MODEL, "dropout": RECIPE["dropout"], "label_smoothing": 0.1}
# --smoke: sizes for a test run of every code path in seconds
SMOKE_BASE = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "dropout": 0.3,
    "label_smoothing": 0.1,
}
SMOKE = {"steps": 6, "save_every": 2, "max_tokens": 256, "vocab_size": 400}


# --------------------------------------------------------------------------------------------
# The rows: each is a change of the base settings (model fields, plus "label_smoothing")
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    group: str  # "base", "A".."E" as the paper's, "X" beyond the paper
    change: Callable[[dict], dict]  # base settings -> the settings that differ
    paper_change: str | None = None  # the paper's row this one scales down
    paper: tuple[float, float, int | None] | None = None  # the paper's PPL (dev), BLEU (dev), params (millions)
    trained: bool = True  # False: scored from the base row's runs (X-averaged)


def heads(h: int) -> Callable[[dict], dict]:
    return lambda base: {"encoder_attention_heads": h, "decoder_attention_heads": h}


def head_size(fraction: float) -> Callable[[dict], dict]:
    return lambda base: {"head_dim": int(base["d_model"] // base["encoder_attention_heads"] * fraction)}


def layers(n: int) -> Callable[[dict], dict]:
    return lambda base: {"encoder_layers": n, "decoder_layers": n}


def width(factor: float) -> Callable[[dict], dict]:
    return lambda base: {"d_model": int(base["d_model"] * factor)}


def ffn(factor: float) -> Callable[[dict], dict]:
    return lambda base: {
        "encoder_ffn_dim": int(base["encoder_ffn_dim"] * factor),
        "decoder_ffn_dim": int(base["decoder_ffn_dim"] * factor),
    }


def setting(**values) -> Callable[[dict], dict]:
    return lambda base: dict(values)


ROWS = [
    Row("base", "base", setting(), "base", (4.92, 25.8, 65)),
    Row("A-h1", "A", heads(1), "h=1, d_k=512", (5.29, 24.9, None)),
    Row("A-h2", "A", heads(2), "h=4, d_k=128", (5.00, 25.5, None)),
    Row("A-h8", "A", heads(8), "h=16, d_k=32", (4.91, 25.8, None)),
    Row("A-h16", "A", heads(16), "h=32, d_k=16", (5.01, 25.4, None)),
    Row("B-dk16", "B", head_size(1 / 4), "d_k=16", (5.16, 25.1, 58)),
    Row("B-dk32", "B", head_size(1 / 2), "d_k=32", (5.01, 25.4, 60)),
    Row("C-N1", "C", layers(1), "N=2", (6.11, 23.7, 36)),
    Row("C-N2", "C", layers(2), "N=4", (5.19, 25.3, 50)),
    Row("C-N6", "C", layers(6), "N=8", (4.88, 25.5, 80)),
    Row("C-d128", "C", width(1 / 2), "d_model=256", (5.75, 24.5, 28)),
    Row("C-d512", "C", width(2), "d_model=1024", (4.66, 26.0, 168)),
    Row("C-ff512", "C", ffn(1 / 2), "d_ff=1024", (5.12, 25.4, 53)),
    Row("C-ff2048", "C", ffn(2), "d_ff=4096", (4.75, 26.2, 90)),
    Row("D-drop0.0", "D", setting(dropout=0.0), "P_drop=0.0", (5.77, 24.6, None)),
    Row("D-drop0.1", "D", setting(dropout=0.1)),
    Row("D-drop0.5", "D", setting(dropout=0.5), "P_drop=0.2", (4.95, 25.5, None)),
    Row("D-ls0.0", "D", setting(label_smoothing=0.0), "ε_ls=0.0", (4.67, 25.3, None)),
    Row("D-ls0.2", "D", setting(label_smoothing=0.2), "ε_ls=0.2", (5.47, 25.7, None)),
    Row("E-learned", "E", setting(position_embedding_type="learned"), "positional embedding", (4.92, 25.7, None)),
    Row("X-pre-ln", "X", setting(norm_first=True)),
    Row("X-no-scale", "X", setting(scale_embedding=False)),
    Row("X-untied", "X", setting(tie_word_embeddings=False)),
    Row("X-averaged", "X", setting(), trained=False),
]
ROW_BY_KEY = {row.key: row for row in ROWS}


def settings(row: Row, base: dict) -> dict:
    """The full settings of ``row``: the base's with the row's changes."""
    return {**base, **row.change(base)}


def describe_change(row: Row, base: dict) -> str:
    """The row's change as text, e.g. "h=1, d_k=256"."""
    if row.key == "X-averaged":
        return "average of the last 5 checkpoints"
    s, names = (
        settings(row, base),
        {
            "encoder_layers": "N",
            "encoder_ffn_dim": "d_ff",
            "dropout": "P_drop",
            "label_smoothing": "ε_ls",
            "encoder_attention_heads": "h",
        },
    )
    words = {
        ("position_embedding_type", "learned"): "learned positions",
        ("norm_first", True): "pre-LN",
        ("scale_embedding", False): "no √d_model scale",
        ("tie_word_embeddings", False): "untied embeddings",
    }
    parts = []
    for field, value in row.change(base).items():
        if not field.startswith("decoder_"):
            parts.append(words.get((field, value)) or f"{names.get(field, field)}={value}")
    if "encoder_attention_heads" in row.change(base) or "d_model" in row.change(base):
        parts.append(f"d_k={head_dim(s)}")
    return ", ".join(parts) or "—"


def head_dim(s: dict) -> int:
    return s.get("head_dim") or s["d_model"] // s["encoder_attention_heads"]


# --------------------------------------------------------------------------------------------
# Training and scoring one row
# --------------------------------------------------------------------------------------------
def validation_perplexity(model, tokenizer, dataset, max_tokens: int) -> dict:
    """Unsmoothed per-target-token perplexity, teacher-forced, of every pair of ``dataset`` (none dropped)."""
    tokenized, dropped = tokenize_corpus(dataset, tokenizer, max_length=10**6)
    if dropped:
        raise ValueError(f"{dropped} validation pairs are empty: perplexity would not cover the whole set.")
    result = perplexity(
        model, tokenized["input_ids"], tokenized["labels"], pad_token_id=tokenizer.pad_token_id, max_tokens=max_tokens
    )
    return {"ppl": result["ppl"], "nll": result["nll"], "target_tokens": result["target_tokens"]}


def score(model, tokenizer, dataset, sentences: int | None, hypotheses_path: Path, progress: bool) -> dict:
    """Perplexity on the whole split and sacreBLEU (beam 4) of its first ``sentences`` (all: None)."""
    result = validation_perplexity(model, tokenizer, dataset, max_tokens=4000)
    n = len(dataset) if sentences is None else min(sentences, len(dataset))
    bleu = evaluate_model(
        model,
        tokenizer,
        dataset["source"][:n],
        dataset["target"][:n],
        hypotheses_path=hypotheses_path,
        num_beams=4,
        progress=progress,
    )
    result.update({k: bleu[k] for k in ("bleu", "bleu_signature", "chrf", "n", "seconds")})
    return result


def shared_tokenizer(folder: Path, corpus, vocab_size: int):
    """One joint BPE for every row (trained on the training split), so that rows differ only in the model."""
    if not (folder / "tokenizer.json").is_file():
        train_split = corpus["train"]
        texts = (text for pair in zip(train_split["source"], train_split["target"]) for text in pair)
        bpe = train_joint_bpe(texts, vocab_size=vocab_size)
        save_folder_atomically(folder, lambda f: save_tokenizer(bpe, f))
    return load_tokenizer(folder)


def run_row(row: Row, seed: int, args: argparse.Namespace, corpus, tokenizer_dir: Path) -> dict:
    """Train (or resume) one row with one seed, score its last weights (and, for the base, the average of the
    last checkpoints), delete its checkpoints; the record of the results file."""
    base = SMOKE_BASE if args.smoke else BASE
    s = settings(row, base)
    model_settings = {k: v for k, v in s.items() if k != "label_smoothing"}
    steps, save_every = (SMOKE["steps"], SMOKE["save_every"]) if args.smoke else (args.steps, SAVE_EVERY)
    max_tokens = SMOKE["max_tokens"] if args.smoke else RECIPE["max_tokens_per_step"]
    output_dir = args.workdir / f"{row.key}-seed{seed}"
    checkpoint_dir = output_dir / "checkpoints"
    if args.rerun and output_dir.exists():
        shutil.rmtree(output_dir)
    config = TrainConfig(
        dataset_name=str(args.data),
        source_lang=args.src_lang,
        target_lang=args.tgt_lang,
        validation_split="validation",
        test_split=None,
        tokenizer_name=str(tokenizer_dir),
        config_overrides=model_settings,
        label_smoothing_factor=s["label_smoothing"],
        max_tokens=max_tokens,
        warmup_steps=RECIPE["warmup_steps"],
        lr_factor=RECIPE["lr_factor"],
        max_steps=steps,
        mixed_precision="no",
        seed=seed,
        logging_steps=50,
        eval_steps=10**9,
        eval_bleu_sentences=0,
        save_steps=save_every,
        save_total_limit=5,
        average_last=5,
        output_dir=str(output_dir),
        resume_from_checkpoint="latest" if list_checkpoints(checkpoint_dir) else None,
        disable_tqdm=args.smoke,
    )
    load_before = os.getloadavg()[0]
    summary = train(config)
    if summary["step"] != steps:
        raise RuntimeError(f"{row.key} seed {seed} stopped at step {summary['step']}, not {steps}.")
    tokenizer = load_tokenizer(tokenizer_dir)
    model = load_model(output_dir / "final")  # the average of the last checkpoints
    record = {}
    if row.key == "base":
        record["averaged"] = score(
            model,
            tokenizer,
            corpus["validation"],
            args.eval_sentences,
            output_dir / "val.averaged.hyp",
            progress=not args.smoke,
        )
    average_into_model(model, list_checkpoints(checkpoint_dir)[-1:])  # the last weights alone
    record["val"] = score(
        model, tokenizer, corpus["validation"], args.eval_sentences, output_dir / "val.hyp", progress=not args.smoke
    )
    shutil.rmtree(checkpoint_dir)  # ~0.6 GB a row; final/ (the averaged model) is kept
    return {
        "row": row.key,
        "seed": seed,
        "settings": s,
        "steps": summary["step"],
        "params": sum(p.numel() for p in model.parameters()),
        "target_tokens": summary["target_tokens"],
        "train_seconds": summary["loop_seconds"],
        **record,
        "budget": {
            "steps": steps,
            "max_tokens_per_step": max_tokens,
            "warmup_steps": RECIPE["warmup_steps"],
            "lr_factor": RECIPE["lr_factor"],
            "save_every": save_every,
        },
        "layout": {
            "processes": 1,
            "threads": torch.get_num_threads(),
            "mixed_precision": "no",
            "attention": "sdpa",
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "load_average_before": round(load_before, 2),
            "load_average_after": round(os.getloadavg()[0], 2),
        },
        "eval_sentences": args.eval_sentences,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "revision": args.revision,
        "command": args.command,
    }


# --------------------------------------------------------------------------------------------
# The report: table3.md and table3.png
# --------------------------------------------------------------------------------------------
def base_band(runs: list[dict], metric: str, averaged: bool = False) -> dict | None:
    """min, max, mean and sample standard deviation of the base row's seeds (None without a base run)."""
    values = [(r["averaged"] if averaged else r["val"])[metric] for r in runs if r["row"] == "base"]
    if not values:
        return None
    return {
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
        "n": len(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def row_values(runs: list[dict], key: str, metric: str) -> list[float]:
    if key == "X-averaged":
        return [r["averaged"][metric] for r in runs if r["row"] == "base" and "averaged" in r]
    return [r["val"][metric] for r in runs if r["row"] == key]


def position(value: float, band: dict | None) -> str:
    """Where a row's mean lies against the base band: "above", "inside" or "below"."""
    if band is None or band["n"] < 2:
        return "?"
    return "above" if value > band["max"] else "below" if value < band["min"] else "inside"


def _cell(values: list[float], digits: int) -> str:
    if not values:
        return "—"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


# The paper's conclusions (its §6.2), each with the rows and where it predicts their BLEU or perplexity against
# the base row's band ("below": a lower value than every base seed).
CLAIMS = [
    ("(A) single-head attention is worse than the base's heads (paper: −0.9 BLEU)", {("A-h1", "bleu"): "below"}),
    ("(A) too many heads also hurt (paper: 32 heads −0.4 BLEU)", {("A-h16", "bleu"): "below"}),
    (
        "(B) reducing the attention key size d_k hurts (paper: −0.7 / −0.4 BLEU)",
        {("B-dk16", "bleu"): "below", ("B-dk32", "bleu"): "below"},
    ),
    (
        "(C) smaller models are worse (fewer layers, narrower, smaller FFN)",
        {
            ("C-N1", "bleu"): "below",
            ("C-N2", "bleu"): "below",
            ("C-d128", "bleu"): "below",
            ("C-ff512", "bleu"): "below",
        },
    ),
    (
        "(C) bigger models are better (more layers, wider, larger FFN)",
        {("C-N6", "bleu"): "above", ("C-d512", "bleu"): "above", ("C-ff2048", "bleu"): "above"},
    ),
    ("(D) dropout is very helpful in avoiding over-fitting (paper: none −1.2 BLEU)", {("D-drop0.0", "bleu"): "below"}),
    (
        "(D) label smoothing hurts perplexity but improves BLEU (paper: without it PPL 4.67 instead of 4.92 and −0.5 "
        "BLEU; at 0.2, PPL 5.47)",
        {("D-ls0.0", "ppl"): "below", ("D-ls0.0", "bleu"): "below", ("D-ls0.2", "ppl"): "above"},
    ),
    ("(E) learned positions give nearly identical results to the sinusoids", {("E-learned", "bleu"): "inside"}),
]


def verdict(runs: list[dict], expected: dict[tuple[str, str], str]) -> str:
    """Row by row, whether the paper's prediction held: "held" when every row is where the paper says, "did not
    hold" when none is and one lies outside the band on the other side, "held in part" when some are and some
    are not, "not resolved" when every row is inside the noise band; "not run yet" without its rows."""
    outcomes: dict[str, list[str]] = {"held": [], "did not hold": [], "inside the band": []}
    for (key, metric), direction in expected.items():
        values, band = row_values(runs, key, metric), base_band(runs, metric)
        if not values or band is None or band["n"] < 2:
            return "not run yet"
        where = position(statistics.fmean(values), band)
        outcome = "held" if where == direction else "inside the band" if where == "inside" else "did not hold"
        outcomes[outcome].append(f"{key} {'PPL' if metric == 'ppl' else 'BLEU'} {where}")
    held, against, inside = outcomes.values()
    if not against and not inside:
        return f"**held** ({', '.join(held)})"
    if not held and not against:
        return f"not resolved, inside the noise band ({', '.join(inside)})"
    if not held:
        return f"**did not hold** ({', '.join(against + inside)})"
    return "**held in part** (" + "; ".join(f"{k}: {', '.join(v)}" for k, v in outcomes.items() if v) + ")"


def describe_layout(layout: dict) -> str:
    threads, precision = layout["threads"], layout["mixed_precision"]
    return (
        f"{layout['processes']} process x {threads} thread{'s' if threads > 1 else ''}, {layout['cpus']} CPUs "
        f"({layout['processor']}), {'float32' if precision == 'no' else precision}"
    )


def report(results: dict, out: Path, picture: bool = True) -> str:
    """Write table3.md (and table3.png) from the results file's content; returns the Markdown."""
    runs, base = results["runs"], results.get("base_settings", BASE)
    bleu_band, ppl_band = base_band(runs, "bleu"), base_band(runs, "ppl")
    steps = results.get("steps", STEPS)
    lines = [
        f"# Table 3, rerun on Multi30k de→en ({steps} steps a row)",
        "",
        "Generated by `python benchmarks/table3.py` from `table3.json`; see the script's docstring for the recipe and",
        "how the paper's rows map onto this project's base. PPL: perplexity per target token on `val` (unsmoothed);",
        "BLEU: sacreBLEU on `val`, beam 4, last weights (no checkpoint averaging, as the paper's Table 3). A row",
        "with several seeds shows mean (min–max). *band*: where the row's BLEU / PPL mean lies against the base",
        "row's seeds (min–max); a row with one seed inside the band is not distinguishable from noise.",
        "",
    ]
    if bleu_band and bleu_band["n"] < 2:
        lines += ["**Noise band**: the base row has 1 seed so far; the band needs at least 2.", ""]
    elif bleu_band and ppl_band:
        lines += [
            f"**Noise band** (base, {bleu_band['n']} seeds): BLEU {bleu_band['min']:.2f}–{bleu_band['max']:.2f} "
            f"(mean {bleu_band['mean']:.2f}, standard deviation {bleu_band['std']:.2f}); PPL "
            f"{ppl_band['min']:.2f}–{ppl_band['max']:.2f} (mean {ppl_band['mean']:.2f}, standard deviation "
            f"{ppl_band['std']:.3f}).",
            "",
        ]
    lines += [
        "| row | change | N | d_model | d_ff | h | d_k | P_drop | ε_ls | steps | PPL (val) | BLEU (val) | params | "
        "band BLEU / PPL | train min | paper's row | paper PPL | paper BLEU | paper params |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        row_runs = [r for r in runs if r["row"] == ("base" if row.key == "X-averaged" else row.key)]
        if not row_runs:
            continue
        s = row_runs[0]["settings"]
        bleu, ppl = row_values(runs, row.key, "bleu"), row_values(runs, row.key, "ppl")
        if not bleu:
            continue
        if row.key == "base":
            band_text = f"{len(bleu)} seed{'s' if len(bleu) > 1 else ''}"
        else:
            band_text = f"{position(statistics.fmean(bleu), bleu_band)} / {position(statistics.fmean(ppl), ppl_band)}"
        minutes = statistics.fmean(r["train_seconds"] for r in row_runs) / 60
        paper = row.paper or (None, None, None)
        cells = [
            row.key,
            describe_change(row, base),
            s["encoder_layers"],
            s["d_model"],
            s["encoder_ffn_dim"],
            s["encoder_attention_heads"],
            head_dim(s),
            s["dropout"],
            s["label_smoothing"],
            row_runs[0]["steps"],
            _cell(ppl, 2),
            _cell(bleu, 2),
            f"{row_runs[0]['params'] / 1e6:.1f}M",
            band_text,
            "—" if row.key == "X-averaged" else f"{minutes:.1f}",
            row.paper_change or "—",
            "—" if paper[0] is None else paper[0],
            "—" if paper[1] is None else paper[1],
            "—" if paper[2] is None else f"{paper[2]}M",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        "## The paper's conclusions at this scale",
        "",
        f"Every row stops after {steps} steps, far from converged (the paper trains each row 100K steps): a "
        "verdict says where a variation stands after this budget, where how fast it learns counts, not where "
        "it would end.",
        "",
    ]
    lines += [f"- {text}: {verdict(runs, expected)}" for text, expected in CLAIMS]
    for key, what in (
        ("X-pre-ln", "pre-LN"),
        ("X-no-scale", "no √d_model embedding scale"),
        ("X-untied", "untied embeddings"),
        ("X-averaged", "checkpoint averaging (base seeds)"),
    ):
        values = row_values(runs, key, "bleu")
        if values and bleu_band and bleu_band["n"] >= 2:
            mean = statistics.fmean(values)
            line = f"- beyond the paper, {what}: BLEU {mean:.2f}, {position(mean, bleu_band)} the base band"
            if key == "X-averaged":
                gains = [
                    r["averaged"]["bleu"] - r["val"]["bleu"] for r in runs if r["row"] == "base" and "averaged" in r
                ]
                line += "; per seed, averaging changed BLEU by " + ", ".join(f"{g:+.2f}" for g in gains)
            lines.append(line)
    signatures = sorted({r["val"]["bleu_signature"] for r in runs})
    lines += ["", f"sacreBLEU signature: `{'`, `'.join(signatures)}`.", ""]
    layouts: dict[str, list[str]] = {}
    for r in runs:
        layouts.setdefault(describe_layout(r["layout"]), []).append(f"{r['row']} seed {r['seed']}")
    lines += [
        "Process layouts (train minutes are the training loop's wall-clock, which depends on them and on other "
        "work beside the row; each row's load average before and after is in `table3.json`):",
        "",
    ]
    lines += [f"- {layout}: {', '.join(rows)}" for layout, rows in layouts.items()] + [""]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table3.md").write_text(text)
    if picture:
        draw(runs, out / "table3.png", steps, base)
    return text


def draw(runs: list[dict], path: Path, steps: int, base: dict) -> None:
    """BLEU and perplexity per row (one dot per seed), against the base row's band (shaded: min–max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [row.key for row in ROWS if row_values(runs, row.key, "bleu")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.32 * len(keys) + 1.6), sharey=True)
    for ax, metric, label in (
        (axes[0], "bleu", "BLEU (val), higher is better"),
        (axes[1], "ppl", "perplexity (val), lower is better"),
    ):
        band = base_band(runs, metric)
        if band is not None:
            ax.axvspan(band["min"], band["max"], color="0.85")
            ax.axvline(band["mean"], color="0.5", lw=0.8)
        for y, key in enumerate(keys):
            values = row_values(runs, key, metric)
            where = position(statistics.fmean(values), band)
            better = (where == "above") == (metric == "bleu") and where not in ("inside", "?")
            color = "0.3" if key == "base" or where in ("inside", "?") else "tab:green" if better else "tab:red"
            ax.scatter(values, [y] * len(values), color=color, s=22, zorder=3)
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
    labels = [f"{key}  ({describe_change(ROW_BY_KEY[key], base)})" if key != "base" else key for key in keys]
    axes[0].set_yticks(range(len(keys)), labels, fontsize=8)
    axes[0].invert_yaxis()
    seeds = sum(r["row"] == "base" for r in runs)
    fig.suptitle(
        f"Table 3 rerun, Multi30k de→en, {steps} steps a row, one dot per seed\n"
        f"shaded: the base row's {seeds} seeds (min–max), line: their mean; "
        f"green better / red worse than that band",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------
def load_results(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {"runs": []}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=list(ROW_BY_KEY), help="rows to run (default: all, in order)")
    parser.add_argument("--seeds", nargs="+", type=int, help="seeds of the chosen rows (default: base 0 1 2, others 0)")
    parser.add_argument("--rerun", action="store_true", help="train the chosen rows again even if they are recorded")
    parser.add_argument("--report", action="store_true", help="only rebuild table3.md and table3.png")
    parser.add_argument("--list", action="store_true", help="print the rows and their changes")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per row (default {STEPS})")
    parser.add_argument(
        "--eval-sentences", type=int, default=None, help="BLEU on the first N val sentences (default: all)"
    )
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--src-lang", default="de")
    parser.add_argument("--tgt-lang", default="en")
    parser.add_argument("--workdir", type=Path, default=ROOT / "outputs" / "table3", help="where rows train")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results", help="folder of table3.*")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 6 steps a row: a test of the code paths")
    args = parser.parse_args(argv)
    base = SMOKE_BASE if args.smoke else BASE
    if args.list:
        for row in ROWS:
            print(f"{row.key:12} {describe_change(row, base):40} paper: {row.paper_change or '—'}")
        return {}
    args.output.mkdir(parents=True, exist_ok=True)
    results_path = args.output / "table3.json"
    results = load_results(results_path)
    steps = SMOKE["steps"] if args.smoke else args.steps
    if results["runs"] and results.get("steps") != steps:
        parser.error(
            f"{results_path} holds rows of {results.get('steps')} steps, not {steps}: "
            f"use another --output, or the same --steps"
        )
    results.update(steps=steps, base_settings=base)
    if args.report:
        if not results["runs"]:
            parser.error(f"{results_path} holds no rows yet: run some first (e.g. --rows base)")
        print(report(results, args.output))
        return results
    args.revision = _git_revision()
    args.command = shlex.join(["python", "benchmarks/table3.py", *(sys.argv[1:] if argv is None else argv)])
    corpus = load_parallel_corpus(str(args.data), args.src_lang, args.tgt_lang)
    tokenizer_dir = args.workdir / "tokenizer"
    shared_tokenizer(tokenizer_dir, corpus, SMOKE["vocab_size"] if args.smoke else 8000)
    todo = []
    for row in [ROW_BY_KEY[k] for k in args.rows] if args.rows else ROWS:
        if not row.trained:
            continue  # X-averaged comes from the base runs
        for seed in args.seeds or (BASE_SEEDS if row.key == "base" else (0,)):
            done = any(r["row"] == row.key and r["seed"] == seed for r in results["runs"])
            if args.rerun or not done:
                todo.append((row, seed))
    print(f"{len(todo)} run(s) to do: " + ", ".join(f"{row.key} seed {seed}" for row, seed in todo))
    for i, (row, seed) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {row.key} seed {seed}: {describe_change(row, base)}", flush=True)
        record = run_row(row, seed, args, corpus, tokenizer_dir)
        # Each row is kept as soon as it is done. The file is read again under a lock (filelock, which the Hub
        # client already uses), so runs of different rows side by side (`--rows A-h1 & --rows A-h2`) keep each other's.
        with FileLock(str(results_path) + ".lock"):
            results = {**load_results(results_path), "steps": steps, "base_settings": base}
            results["runs"] = [r for r in results["runs"] if (r["row"], r["seed"]) != (row.key, seed)] + [record]
            results["environment"] = {"torch": torch.__version__, "python": platform.python_version()}
            write_json_atomically(results_path, results)
            report(results, args.output)
        print(
            f"[{i}/{len(todo)}] {row.key} seed {seed}: PPL {record['val']['ppl']:.2f}, "
            f"BLEU {record['val']['bleu']:.2f}, "
            f"{record['train_seconds'] / 60:.1f} min",
            flush=True,
        )
    return results


if __name__ == "__main__":
    main()
