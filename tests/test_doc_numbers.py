"""The measured numbers of the README and docs/ come from the results files.

Each claim below rebuilds a piece of a page's text from a results file (``benchmarks/results/*`` or
``model_cards/results/*``) and asserts that the page contains it, so a stale or mistyped number fails. Every
number that looks measured (a decimal, a ratio ``N×``, a share ``N %``) in the README's results table must be
part of a claim. A rerun that changes a results file fails here until the pages say the new numbers.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@cache
def load(name: str) -> dict:
    folder = ROOT / "model_cards" / "results" if name.startswith("tatoeba") else RESULTS
    return json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))


def page(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def span(values, digits: int = 2, unit: str = "×") -> str:
    """'1.33–1.83×': the range of ``values`` as the pages write it."""
    low, high = min(values), max(values)
    return f"{low:.{digits}f}–{high:.{digits}f}{unit}"


def multi30k_row(direction: str) -> dict:
    return next(r for r in load("multi30k-60min")["results"] if r["direction"] == direction)


def speed_rows(section: str, **match) -> list[dict]:
    return [r for r in load("speed")[section] if all(r[k] == v for k, v in match.items())]


def deployment(setting: str, engine: str, name: str = "deployment-multi30k-de-en-base") -> float:
    return next(r["vs_marian"] for r in load(name)["speed"] if r["setting"] == setting and r["engine"] == engine)


def table3_val_bleu(row: str) -> list[float]:
    return [r["val"]["bleu"] for r in load("table3")["runs"] if r["row"] == row]


def before_after(number: str) -> str:
    """A number of the run before a change, which a results page records (its text is the source)."""
    text = (RESULTS / "attention-bias-rerun.md").read_text(encoding="utf-8")
    assert number in text, f"{number} is not in attention-bias-rerun.md"
    return number


def machine_of_speed() -> str:
    cpu = load("speed")["environment"]["cpu"]
    assert cpu.startswith("Intel(R) Xeon(R)"), cpu  # the README names it
    return f"Intel Xeon with AMX, {load('speed')['environment']['threads']} cores"


def prepared_corpus_claims() -> list[str]:
    """docs/benchmarks.md's "A corpus of WMT14's size": its table and findings, from prepared-corpus.json."""
    result = load("prepared-corpus")
    assert result["processes"] == 2 and result["steps"] == 50 and result["environment"]["processor"] == "AMD EPYC"
    rows = {(r["corpus"], r["run"].split()[0]): r for r in result["rows"]}
    gb = lambda n: f"{n / 2**30:.2f}"  # noqa: E731

    def per_rank(row: dict, key: str) -> list[float]:
        return [row["memory"][rank][key] for rank in sorted(row["memory"])]

    claims = [
        f"Measured {result['date'][:10]} on an AMD EPYC, 2 cores, 2 processes of 1 thread each",
    ]
    for (corpus, run), row in rows.items():
        label = "bundled, 100,000 pairs" if corpus == "bundled" else f"synthetic, {row['pairs']:,} pairs"
        claims.append(
            f"| {label} | {'first (prepares)' if run == 'first' else 'second (prepared)'} | "
            f"{row['data_ready_s']:.0f} | {row['loop_start_s']:.0f} | "
            f"{' / '.join(gb(x) for x in per_rank(row, 'uss'))} | "
            f"{' / '.join(gb(x) for x in per_rank(row, 'training_uss'))} |"
        )
    big, again, small = rows["synthetic", "first"], rows["synthetic", "second"], rows["bundled", "second"]
    added = [a - b for a, b in zip(per_rank(again, "training_uss"), per_rank(small, "training_uss"))]
    claims += [
        f"**Preparation: {big['data_ready_s']:.0f} s** (goal ≤ 6 min, "
        f"{'met in this run' if big['data_ready_s'] <= 360 else 'not met in this run'})",
        f"**The second start: {again['data_ready_s']:.0f} s to data, {again['loop_start_s']:.0f} s to the first "
        "step** (goal ≤ 30 s)",
        f"**Memory the data adds: {gb(added[0])} and {gb(added[1])} GB per process** (goal ≤ 1 GB)",
        f"{gb(per_rank(again, 'training_uss')[0])} and {gb(per_rank(again, 'training_uss')[1])} GB on the 4.5M-pair "
        f"corpus against {gb(per_rank(small, 'training_uss')[0])} and {gb(per_rank(small, 'training_uss')[1])} GB",
        f"prepared holds more after preparing ({gb(per_rank(big, 'training_uss')[0])} GB)",
    ]
    return claims


def pilot_rows() -> list[str]:
    """The pilot's table: each run's validation NLL at 250, 500, 750 and 1,000 steps ("—" where it did not run);
    and what the page reads from it: N=6 stalls under multi30k.py's recipe, and under the chosen one its NLL falls
    at every evaluation on both bases, behind the base's; the d128 base learns more slowly per step."""
    runs = load("table3-pilot")["runs"]
    recipes = {
        "multi30k": "`multi30k.py`'s: 300 warm-up steps, peak 1.1e-3, no clipping",
        "warmup1000-7e-4": "1,000 warm-up steps, peak 7e-4, clipped at 1",
    }
    order = ["multi30k:C-N6", "warmup1000-7e-4:base", "warmup1000-7e-4:C-N6"]
    order += ["warmup1000-7e-4:base@d128", "warmup1000-7e-4:C-N6@d128"]
    assert sorted(runs) == sorted(order)  # no 5e-4 run was made
    rows = []
    for key in order:
        nll = {e["step"]: e["valid_nll"] for e in runs[key]["curve"]}
        recipe, rest = key.split(":")
        row, _, base = rest.partition("@")
        cells = " | ".join(f"{nll[s]:.2f}" if s in nll else "—" for s in (250, 500, 750, 1000))
        rows.append(f"| {recipes[recipe]} | {base or 'd256'} | {row} | {cells} |")

    def curve(key: str) -> list[float]:
        return [e["valid_nll"] for e in runs[key]["curve"]]

    for suffix in ("", "@d128"):
        deep, base = curve(f"warmup1000-7e-4:C-N6{suffix}"), curve(f"warmup1000-7e-4:base{suffix}")
        assert all(b < a for a, b in zip(deep, deep[1:])) and all(d > b for d, b in zip(deep, base, strict=True))
    assert all(n > w for n, w in zip(curve("warmup1000-7e-4:base@d128"), curve("warmup1000-7e-4:base"), strict=True))
    return rows


def lr_sweep_claims() -> list[str]:
    """docs/benchmarks.md's learning-rate sweep: its table and footnote as lr_sweep.py writes them from
    lr-sweep.json; and what the pages read from it: 0.3 leads at 1,000 steps on NLL and BLEU, a lower factor
    only learns more slowly, and the base under multi30k.py's recipe is "near 3.6 after 500 steps"."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import lr_sweep

    runs = {r["lr_factor"]: r for r in load("lr-sweep")["runs"]}
    assert sorted(runs) == [0.15, 0.3, 0.5, 0.8]
    end = {f: r["evaluations"][-1] for f, r in runs.items()}
    assert min(end, key=lambda f: end[f]["valid_nll"]) == 0.3
    assert max(end, key=lambda f: end[f]["valid_bleu"]) == 0.3
    assert end[0.15]["valid_nll"] > end[0.3]["valid_nll"]
    assert {e["step"] for r in runs.values() for e in r["evaluations"]} == {500, 1000}
    table = lr_sweep.table(list(runs.values()))
    lines = [line for line in table.splitlines() if line.startswith("| ") or "Machine:" in line]
    halfway = [r["evaluations"][0]["valid_nll"] for r in runs.values()]
    return lines + [
        f"near {runs[0.3]['evaluations'][0]['valid_nll']:.1f} after 500 steps",
        f"At 500 steps the four are close (NLL {min(halfway):.2f} to {max(halfway):.2f}); by 1,000, 0.3 leads",
    ]


def marian_baseline_claims(de_en: dict) -> list[str]:
    """docs/benchmarks.md's Marian baseline, from marian-baseline.json: its test2016 scores, steps, minutes and
    machine; and that the de→en run it is set beside trained in bf16 (the page says they differ in precision)."""
    run = load("marian-baseline")
    training, test = run["training"], run["test"]
    assert run["direction"] == "de-en" and training["epochs"] == 10 and not training["resumed"]
    assert test["split"] == "test_2016_flickr" and test["sentences"] == 1000 and de_en["mixed_precision"] == "bf16"
    return [
        f"de→en {test['bleu']:.2f} sacreBLEU (chrF {test['chrf']:.2f}) after {training['epochs']} epochs, "
        f"{training['steps']:,} steps and {training['train_seconds'] / 60:.0f} minutes of training, in\nfp32 on an "
        f"{run['machine']} (one process of {run['threads']} threads)",
    ]


def suite_time_claims() -> list[str]:
    """docs/tests.md's time of CI's whole run, from test-suite.json (recorded from a fresh clone's `.ci/run`)."""
    run = load("test-suite")
    assert run["failed"] == 0 and run["pytest_seconds"] < run["total_seconds"]
    return [
        f"took {run['total_seconds'] / 60:.0f} minutes ({run['total_seconds']:,} s, of which pytest "
        f"{run['pytest_seconds']:,} s: {run['passed']}\npassed, {run['skipped']} skipped) on an {run['machine']}, "
        f"at commit {run['revision']}",
    ]


def converged_status() -> tuple[str, list[str]]:
    """docs/benchmarks.md's status of Table 3 at convergence, from table3-converged.json: the runs made so far,
    where they stopped, what they cost and what their selected checkpoints score; and the README's line on them."""
    import statistics
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import table3_converged

    rows: dict[str, list[dict]] = {}
    for run in sorted(load("table3-converged")["runs"], key=lambda r: r["seed"]):
        rows.setdefault(run["row"], []).append(run)
    base = rows.pop("base")
    assert all(r["threads"] == 1 for r in base + [r for runs in rows.values() for r in runs])
    seeds = [r["seed"] for r in base]
    assert seeds == list(range(len(seeds))) == list(range(table3_converged.SEEDS["base"]))  # all 5 of the base
    assert all(r["stop"] == "cap" and r["selected"]["steps"] == [r["curve"][-1]["step"]] for r in base)
    steps = {r["curve"][-1]["step"] for r in base}
    assert len(steps) == 1
    drop = statistics.fmean(r["curve"][-2]["valid_nll"] - r["curve"][-1]["valid_nll"] for r in base)
    assert drop > 0  # "still falling at the cap"
    minutes = statistics.fmean(r["train_seconds"] for r in base) / 60

    def spread(runs: list[dict], metric: str, model: str = "selected") -> str:
        values = [r[model][metric] for r in runs]
        if len(values) == 1:
            return f"{values[0]:.2f}"
        return f"{statistics.fmean(values):.2f} ({min(values):.2f}–{max(values):.2f})"

    def listing(items: list[str]) -> str:
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

    report = (RESULTS / "table3-converged.md").read_text()
    others, intervals = [], {}
    for row, runs in rows.items():
        planned = table3_converged.SEEDS[row]
        stops = {r["stop"] for r in runs}
        assert stops <= {"early", "cap"} and len(runs) <= planned
        where = listing([f"{r['curve'][-1]['step']:,}" for r in runs])
        lowest = listing([f"{r['selected']['steps'][0]:,}" for r in runs])
        epochs = listing([str(r["curve"][-1]["epoch"]) for r in runs])
        if len(runs) == planned:  # a row with all its seeds: its interval from the base, as the report gives it
            # a claim's comparison ends with its outcome; one beyond the paper's claims has none
            interval = re.search(
                rf"(?:\(|; |: ){re.escape(row)} − (\S+) BLEU ([^ ]+ \[[^]]+\])(?: \(([a-z ]+)\))?", report
            )
            reference = "the base" if interval.group(1) == "base" else f"`{interval.group(1)}`"
            outcome = interval.group(3)
            intervals[row] = f"from {reference} {interval.group(2)}" + (f", {outcome}" if outcome else "")
            others.append(f"its BLEU minus {reference}'s is {interval.group(2)}" + (f": {outcome}" if outcome else ""))
            ppl_of_base = {r["seed"]: r["selected"]["ppl"] for r in base}
            if all(r["selected"]["ppl"] > ppl_of_base[r["seed"]] for r in runs):
                others.append("its validation perplexity is higher than the\nbase's on every seed")
        others += [
            f"`{row}` ({f'all {planned}' if len(runs) == planned else f'{len(runs)} of its {planned}'} seeds) stopped "
            + ("early" if stops == {"early"} else "at the cap" if stops == {"cap"} else "early or at the cap")
            + f" (step {where}, epoch {epochs}",
            f"lowest validation NLL at step {lowest}",
            f"validation perplexity {spread(runs, 'ppl')} and test2016 sacreBLEU {spread(runs, 'bleu')}",
            f"its last checkpoint scores {spread(runs, 'bleu', 'last')}",
        ]
    bleu = statistics.fmean(r["selected"]["bleu"] for r in base)
    verdicts = re.findall(r"^- (\([^)]*\)) .*: \*\*([^*]+)\*\* \((.*)\)$", report, re.M)
    assert len(verdicts) == len(table3_converged.CLAIMS)
    finals = {"held", "contradicted", "not resolvable at this scale"}
    assert all(v == "not run yet" or v in finals or ", provisional (" in v for _, v, _ in verdicts)
    decided = [
        (label, v, re.findall(r"\S+ − \S+ (?:BLEU|PPL) [+-]?[\d.]+ \[[^]]+\]", rest)) for label, v, rest in verdicts
    ]
    decided = [(label, v, comparisons) for label, v, comparisons in decided if v != "not run yet"]
    verdict_claims = [text for label, verdict, comparisons in decided for text in [f"{label} {verdict}", *comparisons]]
    final = [(label, v, comparisons) for label, v, comparisons in decided if v in finals]
    provisional = [(label, v) for label, v, _ in decided if v not in finals]
    effect = re.search(
        r"\*\*Smallest resolvable difference\*\* \(3 seeds a row, from the base's seeds\): ([\d.]+) BLEU", report
    )
    readme_line = (
        f"the base has run ({len(base)} seeds, test2016 BLEU {bleu:.2f}, at the 20-epoch cap and still improving)"
        + "".join(
            f" and all {len(runs)} seeds of `{row}` (Δ BLEU {intervals[row]})"
            if len(runs) == table3_converged.SEEDS[row]
            else f" and {len(runs)} of `{row}`'s {table3_converged.SEEDS[row]} seeds"
            for row, runs in rows.items()
        )
    )
    if final:
        readme_line += "; verdicts: " + "; ".join(
            f"{label} {verdict} ({', '.join(comparisons)})" for label, verdict, comparisons in final
        )
    if provisional:
        readme_line += (
            (", so no claim has a final verdict" if not final else "")
            + " (provisional: "
            + "; ".join(f"{label} {verdict.split(', provisional')[0]}" for label, verdict in provisional)
        )
    return readme_line, [
        *verdict_claims,
        f"**Status:** {len(base) + sum(map(len, rows.values()))} of the {sum(table3_converged.SEEDS.values())} runs. "
        f"The base's seeds {seeds[0]}–"
        f"{seeds[-1]}, each to the 20-epoch cap ({steps.pop():,} steps",
        f"about {minutes:.0f} minutes of training a run on one thread",
        f"(by {drop:.2f} over the last 250 steps, on average)",
        f"validation perplexity {spread(base, 'ppl')} and test2016 sacreBLEU {spread(base, 'bleu')}",
        *others,
        f"From the base's {len(base)} seeds, the smallest difference the design resolves with 3 seeds a row is "
        f"{effect.group(1)} BLEU",
    ]


def parameters(preset: str, **overrides) -> int:
    """The parameters of a preset with the paper's 37,000-token vocabulary (built on the meta device)."""
    import torch

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    config = getattr(VanillaTransformerConfig, preset)(vocab_size=37000, **overrides)
    with torch.device("meta"):
        return sum(p.numel() for p in VanillaTransformerForConditionalGeneration(config).parameters())


def head_size_claims() -> list[str]:
    """docs/model.md's counts for head sizes: base with ``head_dim=16`` built (on the meta device), and d_k = 16
    with d_v = 64 (row (B), which the config cannot express) as base less what Q and K lose; the divisors of the
    two length penalties from 5 to 10 tokens at α = 0.6."""
    from vanilla_transformer import VanillaTransformerConfig

    base, narrow = parameters("base"), parameters("base", head_dim=16)
    config = VanillaTransformerConfig.base(vocab_size=37000)
    attention_modules = config.encoder_layers + 2 * config.decoder_layers
    heads, d_model = config.encoder_attention_heads, config.d_model
    row_b = base - attention_modules * 2 * d_model * heads * (d_model // heads - 16)  # Q and K only
    power, gnmt = (10 / 5) ** 0.6, ((5 + 10) / 6) ** 0.6 / ((5 + 5) / 6) ** 0.6
    return [
        f"base with `head_dim=16` has {narrow / 1e6:.1f}M parameters; d_k = 16 with d_v = 64\nwould have "
        f"{row_b / 1e6:.1f}M, about as far below row (B)'s 58M as our base's {base / 1e6:.1f}M",
        f"raises the |Y|^α divisor by {100 * (power - 1):.0f} % and GNMT's by {100 * (gnmt - 1):.0f} %",
    ]


def table3_run(row: str, seed: int = 0) -> dict:
    return next(r for r in load("table3")["runs"] if r["row"] == row and r["seed"] == seed)


def table3_findings() -> list[str]:
    """The numbers of docs/benchmarks.md's "What it found" (Table 3 at 750 steps), from table3.json."""

    def b(row: str, seed: int = 0) -> str:
        return f"{table3_run(row, seed)['val']['bleu']:.1f}"

    def p(row: str, digits: int, seed: int = 0) -> str:
        return f"{table3_run(row, seed)['val']['ppl']:.{digits}f}"

    base = [r for r in load("table3")["runs"] if r["row"] == "base"]
    band_ppl = min(r["val"]["ppl"] for r in base)
    minutes = [r["train_seconds"] / 60 for r in base]
    gains = [r["averaged"]["bleu"] - r["val"]["bleu"] for r in sorted(base, key=lambda r: r["seed"])]
    assert min(r["val"]["ppl"] for r in load("table3")["runs"]) == table3_run("D-drop0.0")["val"]["ppl"]
    return [
        f"BLEU {b('D-drop0.0')} without it, {b('D-drop0.1')} at 0.1, "
        f"{span([r['val']['bleu'] for r in base], 1, '')} at the base's 0.3, {b('D-drop0.5')} at",
        f"val PPL was lowest without it ({p('D-drop0.0', 1)})",
        f"one head learned fast (BLEU {b('A-h1')}), 8 and 16 heads fell below the band ({b('A-h8')}, {b('A-h16')})",
        f"Two heads gave BLEU {b('A-h2')} with seed 0",
        f"and {b('A-h2', 1)} with seed 1",
        f"(N=1: {b('C-N1')}, N=2: {b('C-N2')})",
        f"(val PPL {p('C-N6', 0)}, BLEU {b('C-N6')})",
        f"(d_model 128: {b('C-d128')})",
        f"(d_ff 512: {b('C-ff512')})",
        f"PPL ({p('C-d512', 2)}) a hair under the band's {band_ppl:.2f}, for "
        f"{table3_run('C-d512')['train_seconds'] / 60:.0f} minutes of training against the base's "
        f"{span(minutes, 0, '')}",
        f"without it BLEU fell to {b('D-ls0.0')}",
        f"PPL rose above the band ({p('D-ls0.2', 1)}) and BLEU stayed inside it ({b('D-ls0.2')})",
        f"learned faster than the sinusoids (BLEU {b('E-learned')})",
        f"pre-LN learned much faster ({b('X-pre-ln')})",
        f"(PPL {p('X-no-scale', 0)}, BLEU {b('X-no-scale')})",
        f"three vocabulary matrices, {table3_run('X-untied')['params'] / 1e6:.1f}M",
        f"learned much slower ({b('X-untied')})",
        "(" + ", ".join(f"{g:+.1f}".replace("-", "−") for g in gains) + ")",
        f"two heads (PPL {p('A-h2', 2)} against the band's {band_ppl:.2f})",
        f"d_model 512 (PPL {p('C-d512', 2)})",
        f"({table3_run('C-d512')['train_seconds'] / 60:.0f} minutes a seed;",
    ]


def speed_findings() -> list[str]:
    """The numbers of docs/benchmarks.md's "What the speed numbers show", from speed.json."""
    train = {(r["size"], r["precision"]): r for r in load("speed")["train"]}
    peak_bf16 = load("speed")["environment"]["peak_bf16"]
    base_bf16 = train["base", "bf16"]
    step_s = base_bf16["ours_step_ms"] / 1000
    beam = {(r["size"], r["precision"]): r["ratio"] for r in speed_rows("generate", beams=4, batch=32)}
    length = {r["length"]: r for r in load("speed")["length"]}
    buckets, random = load("speed")["epoch"]

    def bf16_over_fp32(size: str) -> float:
        return train[size, "bf16"]["ours_tokens_per_s"] / train[size, "fp32"]["marian_tokens_per_s"]

    def span_ends(values: list[float]) -> tuple[float, float]:
        return min(values), max(values)

    assert buckets["batching"].startswith("token buckets") and random["batching"].startswith("DataCollator")
    return [
        "met** in all four rows, " + " to ".join(f"{x:.2f}×" for x in span_ends([r["ratio"] for r in train.values()])),
        f"met at the base size ({bf16_over_fp32('base'):.2f}×), not at the small size ({bf16_over_fp32('small'):.2f}×)",
        f"of a {train['small', 'bf16']['ours_step_ms']:.0f} ms step",
        f"3× would need about {train['small', 'bf16']['ours_step_ms'] * bf16_over_fp32('small') / 3:.0f} ms.",
        f"{100 * base_bf16['ours_mfu']:.1f} %, not met** (Marian: {100 * base_bf16['marian_mfu']:.1f} %). The step is "
        f"{base_bf16['ours_mfu'] * peak_bf16 * step_s / 1e9:.0f} GFLOP; 50 %\n  would need it in "
        f"{step_s * base_bf16['ours_mfu'] / 0.5:.2f} s, against {step_s:.2f} s.",
        f"In fp32 the base step runs at {100 * train['base', 'fp32']['ours_mfu']:.0f} % of the fp32 peak.",
        f"met for base bf16 ({beam['base', 'bf16']:.2f}×); not met for small fp32 ({beam['small', 'fp32']:.2f}×), "
        f"small bf16\n  ({beam['small', 'bf16']:.2f}×) and base fp32 ({beam['base', 'fp32']:.2f}×).",
        f"at or below Marian's in every row ({span([r['ratio'] for r in speed_rows('generate', beams=1, batch=1)])})",
        f"**Peak training memory: met**, {span([r['ratio'] for r in speed_rows('memory')])} Marian's",
        f"({length[16]['ours_train_us_per_token']:.0f} µs at 16 tokens, {length[256]['ours_train_us_per_token']:.0f} "
        f"at 256), and rises again at 512 ({length[512]['ours_train_us_per_token']:.0f} µs), where attention is only "
        f"{100 * length[512]['attention_flop_share']:.0f} % of",
        f"{length[16]['ours_ms_per_step']:.1f} → {length[512]['ours_ms_per_step']:.1f} ms from 16 to 512 tokens",
        f"{buckets['tokens_per_s'] / random['tokens_per_s']:.1f}× the useful throughput of random batches over a "
        f"Multi30k epoch ({100 * buckets['padding_fraction']:.1f} % padding, not\n  "
        f"{100 * random['padding_fraction']:.1f} %)",
    ]


def claims() -> list[tuple[str, str]]:
    """(page, text the page must contain), each text built from a results file."""
    main_job = load("tatoeba_en_de_small")["test"]
    de_en, en_de = multi30k_row("de-en"), multi30k_row("en-de")
    tatoeba, multi30k = load("length-penalty-tatoeba-en-de"), load("length-penalty-multi30k-de-en")
    identical = [tatoeba["identical_share"], multi30k["identical_share"]]
    base_bf16 = speed_rows("train", size="base", precision="bf16")[0]
    base_fp32 = speed_rows("train", size="base", precision="fp32")[0]
    bf16 = load("bf16-vs-fp32")
    kills, kills2 = load("kill-resume"), load("kill-resume-2processes")
    memory = {r["engine"]: r for r in load("deployment-multi30k-de-en-base")["memory"]}
    readme = [
        f"test sacreBLEU **{main_job['bleu']:.2f}**, chrF {main_job['chrf']:.2f} ({main_job['n']:,} sentences",
        f"before: {before_after('25.91')} / {before_after('46.06')}",
        f"de→en sacreBLEU **{de_en['test']['bleu']:.2f}** (chrF {de_en['test']['chrf']:.2f}",
        f"before: {before_after('40.05')}",
        f"en→de **{en_de['test']['bleu']:.2f}** (chrF {en_de['test']['chrf']:.2f}",
        f"the same {en_de['max_steps']:,} steps in fp32 on an AMD EPYC; with attention biases, "
        f"before: {before_after('38.33')})",
        f"Tatoeba {tatoeba['forms']['power']['bleu']:.2f} / {tatoeba['forms']['gnmt']['bleu']:.2f}, "
        f"Multi30k de→en {multi30k['forms']['power']['bleu']:.2f} / {multi30k['forms']['gnmt']['bleu']:.2f} sacreBLEU",
        f"{round(100 * min(identical))} % of outputs identical"
        if round(100 * min(identical)) == round(100 * max(identical))
        else f"{span([100 * x for x in identical], 0, ' %')} of outputs identical",
        f"paired bootstrap p {tatoeba['paired_bootstrap']['p_value']:.3f} / "
        f"{multi30k['paired_bootstrap']['p_value']:.3f}",
        f"base val BLEU {span(table3_val_bleu('base'), 2, '')} over {len(table3_val_bleu('base'))} seeds",
        f"(none: {table3_val_bleu('D-drop0.0')[0]:.1f}, 0.5: {table3_val_bleu('D-drop0.5')[0]:.1f})",
        f"{span([r['ratio'] for r in speed_rows('train')])} its target tokens/s at the same precision",
        f"base bf16 {base_bf16['ours_tokens_per_s'] / base_fp32['marian_tokens_per_s']:.2f}× Marian fp32",
        f"{span([r['ratio'] for r in speed_rows('generate', beams=4, batch=32)])} its new tokens/s / "
        f"{span([r['ratio'] for r in speed_rows('generate', beams=1, batch=1)])}",
        f"Multi30k model (Table 3's `D-drop0.3`), beam 4, batch 32: "
        f"int8 **{deployment('beam 4, batch 32', 'CTranslate2 int8'):.2f}×**, "
        f"float32 **{deployment('beam 4, batch 32', 'CTranslate2 float32'):.2f}×** its tokens/s (two batches at "
        f"once on 2 cores); greedy, batch 1: {deployment('greedy, batch 1', 'CTranslate2 int8'):.2f}× / "
        f"{deployment('greedy, batch 1', 'CTranslate2 float32'):.2f}× (two sentences at once); "
        f"int8 adds {memory['CTranslate2 int8']['added_vs_marian']:.2f}× Marian's memory",
        f"Main job's model: int8 "
        f"**{deployment('beam 4, batch 32', 'CTranslate2 int8', 'deployment-tatoeba-en-de'):.2f}×**, "
        f"float32 **{deployment('beam 4, batch 32', 'CTranslate2 float32', 'deployment-tatoeba-en-de'):.2f}×**",
        f"Peak training memory against Marian | {span([r['ratio'] for r in speed_rows('memory')])}",
        f"{bf16['speedup_bf16']:.2f}× target tokens/s; "
        f"loss within {100 * bf16['max_relative_gap_train']:.2f} % (training), "
        f"{100 * bf16['max_relative_gap_valid']:.2f} % (validation)",
        f"{kills['kills']} SIGKILLs, {kills['resumes_matching_reference']} resumes all matching the uninterrupted run",
        f"2 processes: {kills2['kills']} SIGKILLs of the whole job, {kills2['resumes_matching_reference']} resumes all "
        f"matching; {'bit-identical' if kills2['final_bit_identical'] else 'NOT bit-identical'}",
        machine_of_speed(),
    ]
    assert en_de["machine"].startswith("AMD EPYC") and en_de["mixed_precision"] == "no"  # as the pages say
    timing = load("table3-base-timing")["runs"]
    assert timing["d256"]["target_tokens"] == timing["d128"]["target_tokens"]  # "the same ... target tokens"
    assert {r["threads"] for r in timing.values()} == {1} and all(r["steps"] == 250 for r in timing.values())
    assert all(r["machine"].startswith("AMD EPYC") for r in timing.values())
    speed = {name: r["target_tokens_per_s"] for name, r in timing.items()}
    epoch = load("speed")["epoch"][0]
    cap_hours = {name: 20 * epoch["target_tokens"] / s / 3600 for name, s in speed.items()}  # MAX_EPOCHS
    assert 33 * cap_hours["d128"] <= 20.5 < 33 * cap_hours["d256"]  # "only its plan fits the 20 CPU-hours"
    benchmarks = (
        table3_findings()
        + speed_findings()
        + [
            f"{de_en['test']['bleu']:.2f} de→en in 60 minutes ({before_after('40.05')} with attention biases)",
            *marian_baseline_claims(de_en),
            f"en→de went from 30.46 to {before_after('38.33')} in 60 minutes",
            f"earlier run's {en_de['max_steps']:,} steps (`--max-steps {en_de['max_steps']}`), which took "
            f"{en_de['loop_seconds']:,.0f} s ({en_de['loop_seconds'] / 60:.0f} minutes)",
            f"250 steps of the base row, the same {timing['d256']['target_tokens']:,} target tokens,",
            f"{speed['d256']:,.0f} target tokens/s and a model of half its width (d128: d_ff 512, 4 heads of 32) "
            f"{speed['d128']:,.0f}, {speed['d128'] / speed['d256']:.2f} times as many.",
            f"An epoch of Multi30k is {epoch['target_tokens']:,} target tokens (in {epoch['batches']} token-bucket",
            f"training on d256 and {cap_hours['d128']:.1f} on d128, and the 33 runs about "
            f"{33 * cap_hours['d256']:.0f} and {33 * cap_hours['d128']:.0f} CPU-hours",
            f"takes about {cap_hours['d256']:.1f} hours of",
            f"trained {de_en['step']:,} steps in {de_en['loop_seconds']:,.0f} s, "
            f"{de_en['step'] / de_en['loop_seconds']:.2f} optimizer steps/s and "
            f"{de_en['target_tokens'] / de_en['loop_seconds']:,.0f} target tokens/s",
        ]
    )
    forms = (tatoeba, multi30k)
    words = {f: [x["forms"][f]["mean_words"] for x in forms] for f in ("gnmt", "power")}
    drops = [x["forms"]["power"]["bleu"] - x["forms"]["gnmt"]["bleu"] for x in forms]
    changed = round(100 * (1 - min(identical)))
    assert changed == round(100 * (1 - max(identical)))  # the page gives one share for both sets
    model_text = [
        f"GNMT's form changed {changed} % of the outputs, made them slightly shorter ({words['gnmt'][0]:.2f} against "
        f"{words['power'][0]:.2f} words; {words['gnmt'][1]:.2f} against\n{words['power'][1]:.2f}, with references of "
        f"{tatoeba['reference_mean_words']:.2f} and {multi30k['reference_mean_words']:.2f}), and scored "
        f"{span(drops, 2, '')} BLEU lower on both sets",
        f"(p {tatoeba['paired_bootstrap']['p_value']:.3f} and {multi30k['paired_bootstrap']['p_value']:.3f})",
        f"end-of-training score, {de_en['test']['bleu']:.2f}, came from the same weights decoded in the training "
        f"process, with one thread; {multi30k['forms']['power']['bleu']:.2f}\nhere, with two.",
    ]
    model = (
        model_text
        + [
            f" {form['sentences']:,} | {form['forms']['power']['bleu']:.2f} | {form['forms']['gnmt']['bleu']:.2f} | "
            f"{100 * form['identical_share']:.1f} % | {form['paired_bootstrap']['p_value']:.3f} |"
            for form in (tatoeba, multi30k)
        ]
        + ["Intel Xeon, 2 cores" if tatoeba["machine"].startswith("Intel(R) Xeon(R)") else tatoeba["machine"]]
        + head_size_claims()
    )
    engines = ("ours", "CTranslate2 float32", "CTranslate2 int8")
    base_batching = load("ctranslate2-batching-multi30k-de-en-base")["quantizations"]
    trained_ratios = [
        q["package_vs_translate_batch"]
        for name in ("multi30k-de-en-base", "tatoeba_en_de")
        for q in load(f"ctranslate2-batching-{name}")["quantizations"].values()
    ]
    quality = {r["engine"]: r for r in load("deployment-multi30k-de-en-base")["bleu"]}
    tatoeba = {r["engine"]: r for r in load("deployment-tatoeba-en-de")["bleu"]}
    main_job_int8 = deployment("beam 4, batch 32", "CTranslate2 int8", "deployment-tatoeba-en-de")
    weak = load("ctranslate2-batching-multi30k-de-en")["quantizations"]
    main_job_model = load("deployment-tatoeba-en-de")
    # the model served: the last checkpoint of Table 3's base as it was then (P_drop 0.3), now row D-drop0.3
    base_run = next(r for r in load("table3-converged")["runs"] if r["row"] == "D-drop0.3" and r["seed"] == 0)
    assert base_run["last"]["bleu"] == quality["ours"]["bleu"] and base_run["renamed_from"] == "base"
    one_worker = load("deployment-multi30k-de-en-base-one-worker")
    one_worker_memory = {r["engine"]: r for r in one_worker["memory"]}["CTranslate2 int8"]
    seconds = {
        (name, r["engine"]): r["seconds"]
        for name in ("deployment-multi30k-de-en-base", "deployment-multi30k-de-en-base-one-worker")
        for r in load(name)["speed"]
        if r["setting"] == "beam 4, batch 32"
    }
    assert one_worker["threads_per_batch"] == 2 and one_worker["threads"] == 2
    slower = (
        seconds["deployment-multi30k-de-en-base-one-worker", "CTranslate2 int8"]
        / seconds["deployment-multi30k-de-en-base", "CTranslate2 int8"]
    )
    # "Every output is the exact path's, on all three models"
    assert all(
        q["identical"] == q["sentences"]
        for name in ("multi30k-de-en-base", "tatoeba_en_de", "multi30k-de-en")
        for q in load(f"ctranslate2-batching-{name}")["quantizations"].values()
    )
    assert all(q["redecoded"] == 0 for q in load("ctranslate2-batching-tatoeba_en_de")["quantizations"].values())
    int8_memory, float32_memory = memory["CTranslate2 int8"], memory["CTranslate2 float32"]
    int8_beam = deployment("beam 4, batch 32", "CTranslate2 int8")
    float32_beam = deployment("beam 4, batch 32", "CTranslate2 float32")
    main_job_float32 = deployment("beam 4, batch 32", "CTranslate2 float32", "deployment-tatoeba-en-de")
    headline = "deployment-multi30k-en-de"  # the headline en→de model, timed with one worker of two threads
    deployment_page = (
        [
            f"| {label}: {setting} ({sentences} sentences) | "
            + " | ".join(
                f"{deployment(setting, e, name):.2f}×" if e == "ours" else f"**{deployment(setting, e, name):.2f}×**"
                for e in engines
            )
            + " |"
            for label, name in (
                ("Multi30k", "deployment-multi30k-de-en-base"),
                ("main job", "deployment-tatoeba-en-de"),
            )
            for setting, sentences in (("beam 4, batch 32", 128), ("greedy, batch 1", 32))
        ]
        + [
            f"| {name} | {q} | {row['identical']:,} / {row['sentences']:,} | {row['redecoded']} | "
            f"{row['package_vs_translate_batch']:.2f}× | {row['package_vs_translate_batch_text']:.2f}× |"
            for name in ("multi30k-de-en-base", "tatoeba_en_de", "multi30k-de-en")
            for q, row in load(f"ctranslate2-batching-{name}")["quantizations"].items()
        ]
        + [
            f"{base_run['params'] / 1e6:.1f}M parameters; its checkpoint at the step cap, "
            f"{base_run['last']['steps'][-1]:,}: {base_run['last']['bleu']:.2f}",
            f"**Met on both ({int8_beam:.2f}× and {main_job_int8:.2f}×).**",
            f"the same CTranslate2 int8 took\n{slower:.1f} times as long on the Multi30k model",
            f"7.6M parameters) reached only "
            f"{deployment('beam 4, batch 32', 'CTranslate2 int8', headline):.2f}× (int8) and "
            f"{deployment('beam 4, batch 32', 'CTranslate2 float32', headline):.2f}× (float32)",
            f"int8 is only {int8_beam / float32_beam:.2f}× (Multi30k) and "
            f"{main_job_int8 / main_job_float32:.2f}× (main job) float32",
            f"CTranslate2 int8 adds {int8_memory['added_rss_mb']:.0f} MB to the process after its imports, "
            f"{int8_memory['added_vs_marian']:.2f}× what Marian adds ({memory['Marian']['added_rss_mb']:.0f} MB); "
            f"float32 adds\n{float32_memory['added_rss_mb']:.0f} MB ({float32_memory['added_vs_marian']:.2f}×).",
            f"int8 adds {one_worker_memory['added_rss_mb']:.0f} MB ({one_worker_memory['added_vs_marian']:.2f}×)",
            f"The whole process' peak is {int8_memory['peak_rss_mb']:.0f} MB for int8 against "
            f"{memory['Marian']['peak_rss_mb']:.0f} MB for\nMarian ({int8_memory['peak_vs_marian']:.2f}×)",
            f"trained 15 minutes to {load('multi30k-15min')['results'][0]['test']['bleu']:.2f}\nsacreBLEU",
            f"takes {span(trained_ratios, 2, '×')}\n`translate_batch`'s time on the same tokens",
            f"The exact path (batches of one limit each) takes {base_batching['int8']['exact_vs_package']:.2f}× "
            f"(int8) and {base_batching['float32']['exact_vs_package']:.2f}×\n(float32) the package's time on the "
            f"Multi30k model",
            f"on Multi30k (1,000 sentences), float32 gives\n{quality['CTranslate2 float32']['same_as_ours']} of "
            f"`generate()`'s translations and {quality['CTranslate2 float32']['bleu']:.2f} sacreBLEU against "
            f"{quality['ours']['bleu']:.2f}; int8 gives {quality['CTranslate2 int8']['same_as_ours']} and\n"
            f"{quality['CTranslate2 int8']['bleu']:.2f}.",
            f"On Tatoeba ({tatoeba['ours']['sentences']:,} sentences), float32 gives "
            f"{tatoeba['CTranslate2 float32']['same_as_ours']:,} and {tatoeba['CTranslate2 float32']['bleu']:.2f} "
            f"against {tatoeba['ours']['bleu']:.2f};\nint8 gives {tatoeba['CTranslate2 int8']['same_as_ours']:,} and "
            f"{tatoeba['CTranslate2 int8']['bleu']:.2f}.",
            f"the README's `bash scripts/main.sh` on the same machine ({main_job_model['parameters'] / 1e6:.1f}M\n"
            f"  parameters; {tatoeba['ours']['bleu']:.2f} sacreBLEU on the bundled Tatoeba test split",
            f"On the weaker de→en model, {weak['int8']['redecoded']} (int8) and {weak['float32']['redecoded']} "
            f"(float32) of {weak['int8']['sentences']:,} sentences run into their limit",
            f"the package takes {weak['int8']['package_vs_translate_batch']:.2f}× and "
            f"{weak['float32']['package_vs_translate_batch']:.2f}× `translate_batch`'s time",
            f"gives {quality['ours, early_stopping=True']['same_as_ours']} and "
            f"{tatoeba['ours, early_stopping=True']['same_as_ours']:,} of them",
        ]
    )
    reliability = [
        f"measured **{kills2['kills']} kills of\nthe whole job**, "
        f"{kills2['kills_during_checkpoint_writes']} of them during a "
        f"checkpoint write, and **{kills2['resumes']} resumes, all {kills2['resumes_matching_reference']} matching**",
        f"`python benchmarks/kill_resume.py` (200 steps, a checkpoint every 4) measured **{kills['kills']} kills**, "
        f"{kills['kills_during_checkpoint_writes']} of them during a\ncheckpoint write and "
        f"{kills['kills_during_rotations']} "
        f"during a rotation, and **{kills['resumes']} resumes, all {kills['resumes_matching_reference']} matching**",
    ]
    assert kills2["processes"] == 2 and kills2["steps"] == 200 and kills["steps"] == 200
    run = load("tatoeba_en_de_small")
    main_job_config = yaml.safe_load((ROOT / "configs" / "tatoeba_en_de_small.yaml").read_text(encoding="utf-8"))
    manifest = json.loads((ROOT / "data" / "tatoeba_en_de" / "MANIFEST.json").read_text(encoding="utf-8"))
    training = [
        f"trained {run['step']} steps, {run['target_tokens']:,} target tokens in {run['loop_seconds'] / 60:.1f} min "
        f"({run['stop_reason']}); averaged {len(run['averaged_checkpoints'])} checkpoints",
        f"test ({main_job['n']} sentences, beam search): sacreBLEU {main_job['bleu']:.2f}  "
        f"{main_job['bleu_signature']}",
        f"chrF {main_job['chrf']:.2f}  {main_job['chrf_signature']}",
        f"among them {main_job['seconds']:.0f} s of beam search over the test split",
        f"Training stops at its {main_job_config['max_minutes']}-minute budget (`max_minutes`)",
        f"train: {manifest['counts']['train']:,} pairs kept, {run['dropped']['train']} dropped",
        f"step {run['step']} | ... | "
        + " | ".join(f"{k} {run[k]:.4g}" for k in ("valid_loss", "valid_nll", "valid_ppl", "valid_bleu", "valid_chrf"))
        + " | ...",
        f"trained at {bf16['bf16']['target_tokens_per_s']:,.0f} target tokens/s against",
        f"{bf16['fp32']['target_tokens_per_s']:,.0f} in fp32 ({bf16['speedup_bf16']:.2f}×)",
        f"within {100 * bf16['max_relative_gap_train']:.2f} % of fp32's in training (10-step means) and "
        f"{100 * bf16['max_relative_gap_valid']:.2f} % in",
    ]
    benchmarks += prepared_corpus_claims()
    benchmarks += pilot_rows()
    benchmarks += lr_sweep_claims()
    readme_line, status = converged_status()
    benchmarks += status
    readme.append(readme_line)
    benchmarks.append(f"en→de went from 30.46 to {before_after('38.33')} in 60 minutes")
    big = parameters("big")
    training.append(
        f"big preset's {big / 1e6:.0f}M parameters (with the paper's 37,000-token vocabulary), their gradients and "
        f"Adam's two\nmoments take about {4 * 4 * big / 1e9:.1f} GB in fp32"
    )
    emulated = load("bf16-vs-fp32-amd-emulated")
    assert emulated["environment"]["threads"] == 1 and emulated["environment"]["machine"].startswith("AMD EPYC")
    training.append(
        f"took {emulated['bf16']['seconds_per_step']:.1f} s against {emulated['fp32']['seconds_per_step']:.2f} s in "
        f"fp32 (one thread, AMD EPYC with AVX2 only; {emulated['steps']} steps each"
    )
    slower = emulated["bf16"]["seconds_per_step"] / emulated["fp32"]["seconds_per_step"]
    benchmarks += [
        f"where emulated bf16 is about {slower:.0f} times slower",
        f"a bf16 training step of the Multi30k model took {emulated['bf16']['seconds_per_step']:.1f} s against "
        f"{emulated['fp32']['seconds_per_step']:.2f} s in fp32",
    ]
    trainer = {r["row"]: r for r in load("trainer-speed")["rows"]}
    machine = load("trainer-speed")["environment"]
    readme.append(
        f"for the same loss without logits ({trainer['ours_fused']['ratio_to_marian']:.2f}× Marian's step, not "
        f"{trainer['ours_label_smoother']['ratio_to_marian']:.2f}×)"
    )
    ratios = {name: f"{row['ratio_to_marian']:.2f}" for name, row in trainer.items()}
    benchmarks += [
        f"| `MarianMTModel`, `Seq2SeqTrainer` (logits + `LabelSmoother`) | {ratios['marian']} |",
        f"| ours, `Seq2SeqTrainer` (logits + `LabelSmoother`) | {ratios['ours_label_smoother']} |",
        f"| ours, `TranslationSeq2SeqTrainer` (the model's fused loss) | **{ratios['ours_fused']}** |",
        f"| ours, the package's own step | {ratios['ours_package_step']} |",
        f"The {trainer['ours_fused']['ratio_to_marian'] - trainer['ours_label_smoother']['ratio_to_marian']:.1f}× gap "
        "to plain `Seq2SeqTrainer` is the loss",
    ]
    transformers_page = [
        f"runs at {trainer['ours_fused']['ratio_to_marian']:.2f}× `MarianMTModel`'s, against "
        f"{trainer['ours_label_smoother']['ratio_to_marian']:.2f}× through `LabelSmoother` ({machine['cpu']}, "
        f"{machine['threads']}\n  thread{'s' if machine['threads'] > 1 else ''};",
    ]
    batching = {
        name: load(f"ctranslate2-batching-{name}")["quantizations"] for name in ("tatoeba_en_de", "multi30k-de-en")
    }
    ratios = {
        name: ", ".join(f"{q['package_vs_translate_batch']:.2f}×" for q in (b["int8"], b["float32"]))
        for name, b in batching.items()
    }
    redecoded = {name: f"{b['int8']['redecoded']}, {b['float32']['redecoded']}" for name, b in batching.items()}
    prepared = {(r["corpus"], r["run"].split()[0]): r["data_ready_s"] for r in load("prepared-corpus")["rows"]}
    layouts = {
        label: {
            "speed": {(r["setting"], r["engine"]): r for r in load(name)["speed"]},
            "int8_adds": {r["engine"]: r for r in load(name)["memory"]}["CTranslate2 int8"]["added_rss_mb"],
        }
        for label, name in (
            ("one worker of two threads (before)", "deployment-multi30k-de-en-base-one-worker"),
            ("two workers of one thread (now)", "deployment-multi30k-de-en-base"),
        )
    }
    beam, greedy = "beam 4, batch 32", "greedy, batch 1"
    performance_log = [
        f"| {label} | {run['speed'][beam, 'CTranslate2 int8']['seconds']:.2f} s | "
        f"{run['speed'][beam, 'CTranslate2 float32']['seconds']:.2f} s | "
        f"{run['speed'][beam, 'CTranslate2 int8']['vs_marian']:.2f}× | {run['int8_adds']:.0f} |"
        for label, run in layouts.items()
    ] + [
        "Marian took " + " and ".join(f"{run['speed'][beam, 'Marian']['seconds']:.2f} s" for run in layouts.values()),
        "went from "
        + " to ".join(f"{run['speed'][greedy, 'CTranslate2 int8']['vs_marian']:.2f}×" for run in layouts.values()),
        f"[prepared-corpus.md](../benchmarks/results/prepared-corpus.md) took {prepared['synthetic', 'first']:.0f} s "
        f"and {prepared['bundled', 'first']:.0f} s.",
        f"to {span([r['ratio'] for r in speed_rows('generate', beams=4, batch=32)])} (see",
        f"| the same, on two workers; a second decoding queued as soon as its batch returns | "
        f"{ratios['tatoeba_en_de']} | {redecoded['tatoeba_en_de']} | "
        f"{ratios['multi30k-de-en']} | {redecoded['multi30k-de-en']} |",
    ]
    pictures = load("pictures-model")
    assert pictures["machine"] == "AMD EPYC, 2 cores" and pictures["stop_reason"] == "max_steps"
    pictures_page = [
        f"trained to the committed\nrun's {pictures['step']:,} steps: `bash scripts/main.sh --max_steps "
        f"{pictures['step']} --max_minutes 30` took {pictures['loop_seconds'] / 60:.1f} minutes of training on 2\n"
        f"AMD EPYC cores and scored {pictures['test']['bleu']:.2f} sacreBLEU on the Tatoeba test split (the "
        f"committed run: {main_job['bleu']:.2f})",
    ]
    explorer_page = [
        f"(`bash scripts/main.sh --max_steps {pictures['step']} --max_minutes 30`: "
        f"{pictures['loop_seconds'] / 60:.1f} minutes of training\non 2 AMD EPYC cores, "
        f"{pictures['test']['bleu']:.2f} sacreBLEU on the Tatoeba test split)",
    ]
    assert pictures["step"] == run["step"]  # "the committed run's steps"
    return (
        [("README.md", text) for text in readme]
        + [("docs/reliability.md", text) for text in reliability]
        + [("docs/benchmarks.md", text) for text in benchmarks]
        + [("docs/model.md", text) for text in model]
        + [("docs/deployment.md", text) for text in deployment_page]
        + [("docs/training.md", text) for text in training]
        + [("docs/transformers.md", text) for text in transformers_page]
        + [("docs/performance-log.md", text) for text in performance_log]
        + [("docs/pictures.md", text) for text in pictures_page]
        + [("docs/explorer.md", text) for text in explorer_page]
        + [("docs/tests.md", text) for text in suite_time_claims()]
    )


def unmatched(claimed: list[tuple[str, str]], pages: dict[str, str]) -> list[tuple[str, str]]:
    """The claims whose text is not in its page."""
    return [(where, text) for where, text in claimed if text not in pages[where]]


@pytest.mark.parametrize("where, text", claims(), ids=lambda value: str(value)[:60])
def test_the_page_says_what_the_results_file_says(where, text):
    assert not unmatched([(where, text)], {where: page(where)}), f"{where} should say, from its results file: {text}"


def test_a_changed_number_is_caught():
    """One digit of the README's headline changed: exactly the claim that quotes it fails."""
    claimed = claims()
    bleu = f"{multi30k_row('de-en')['test']['bleu']:.2f}"
    readme = page("README.md")
    assert readme.count(f"**{bleu}**") == 1
    wrong = readme.replace(f"**{bleu}**", f"**{bleu[:-1]}{(int(bleu[-1]) + 1) % 10}**")
    pages = {name: page(name) for name in {where for where, _ in claimed}} | {"README.md": wrong}
    assert [text for _, text in unmatched(claimed, pages)] == [
        t for w, t in claimed if w == "README.md" and f"**{bleu}**" in t
    ]


def after_moving_the_fast_paths() -> dict[str, float]:
    """The "after 2" run of the performance log's table on moving the fast paths: its rows, by the table's labels."""
    run = load("speed-train-memory-generate-fp32")
    rows = {f"train {r['size']} {r['precision']}": r["ratio"] for r in run["train"]}
    rows |= {f"peak memory {r['size']} {r['precision']} (lower is better)": r["ratio"] for r in run["memory"]}
    for r in run["generate"]:
        search = "greedy" if r["beams"] == 1 else f"beam {r['beams']}"
        rows[f"generate {r['size']} {r['precision']} {search} batch {r['batch']}"] = r["ratio"]
    return rows


def test_the_performance_logs_after_column_is_its_results_file():
    """Each row of the table's "after 2" column (the 5th cell) is the committed run's ratio to Marian."""
    section = page("docs/performance-log.md").split("## Moving the fast paths out of the model file", 1)[1]
    lines = {line.split(" | ")[0].lstrip("| "): line for line in section.splitlines() if line.startswith("| ")}
    expected = after_moving_the_fast_paths()
    assert len(expected) == 12
    for label, ratio in expected.items():
        cells = [cell.strip() for cell in lines[label].strip("|").split("|")]
        assert cells[4] == f"{ratio:.2f}", f"docs/performance-log.md, {label}: after 2 should read {ratio:.2f}"


MEASURED = re.compile(r"\d[\d,]*(?:\.\d+)?(?:–\d[\d,]*(?:\.\d+)?)?\s?(?:×|%)|\d+\.\d+")


def test_every_measured_number_of_the_readmes_results_table_is_checked():
    """Each decimal, ratio or share in the "result" column lies inside a claim's text in its row."""
    claimed = [text for where, text in claims() if where == "README.md"]
    section = page("README.md").split("## Results", 1)[1].split("\n## ", 1)[0]
    unchecked = []
    for row in (line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what")):
        cell_start = row.index(" | ") + 3
        cell = row[cell_start : row.index(" | ", cell_start)]
        spans = [(m.start(), m.end()) for text in claimed for m in re.finditer(re.escape(text), row)]
        for number in MEASURED.finditer(cell):
            start, end = cell_start + number.start(), cell_start + number.end()
            if not any(a <= start and end <= b for a, b in spans):
                unchecked.append(number.group(0))
    assert not unchecked, f"numbers in the README's results table that no claim checks: {unchecked}"


def test_replaced_results_are_those_of_the_commit_the_page_names():
    """docs/benchmarks.md's earlier 60-minute runs, since replaced, against the results file at the commit it names
    (git history; a clone without it skips, saying so)."""
    shown = subprocess.run(
        ["git", "show", "9c96900:benchmarks/results/multi30k-60min.json"], cwd=ROOT, capture_output=True, text=True
    )
    if shown.returncode != 0:
        pytest.skip(f"this clone has no commit 9c96900 (a shallow clone?): {shown.stderr.strip()}")
    rows = {r["direction"]: r["test"] for r in json.loads(shown.stdout)["results"]}
    de_en, en_de = rows["de-en"], rows["en-de"]
    text = (
        f"file: de-en {de_en['bleu']:.2f} sacreBLEU (chrF {de_en['chrf']:.2f}) and en-de {en_de['bleu']:.2f} "
        f"(chrF {en_de['chrf']:.2f}), both in it at commit 9c96900"
    )
    assert text in page("docs/benchmarks.md")
    assert f"en→de went from {en_de['bleu']:.2f} to" in page("docs/benchmarks.md")
