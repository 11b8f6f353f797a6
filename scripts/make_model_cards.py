"""Generate model_cards/ from the committed results files, and check that it is up to date.

    python scripts/make_model_cards.py            # writes model_cards/*.md
    python scripts/make_model_cards.py --check    # exit 1 if a card differs from what its inputs give

Two kinds of card, built with the pieces of ``vanilla_transformer.cards``:

* **trained-model cards**: one per committed results file: the README's main job (from
  ``model_cards/results/``) and each direction of every ``benchmarks/results/multi30k-<minutes>min.json``.
  Every score in them is read from the results file of the command the card names.
* **preset cards** (``base``, ``big``): the architecture of Table 3, the parameter count computed by
  building the model on the meta device, the paper's recipe; no scores, because these presets were not
  trained by this project.

The main job's card is skipped until its results are committed. To add them, after a run of the command
the card names (``bash scripts/main.sh`` with no extra arguments), copy its two files unchanged::

    mkdir -p model_cards/results
    cp outputs/tatoeba_en_de/results.json      model_cards/results/tatoeba_en_de_small.json
    cp outputs/tatoeba_en_de/train_config.json model_cards/results/tatoeba_en_de_small.train_config.json
    python scripts/make_model_cards.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard, ModelCardData

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.cards import CITATION, TAGS, architecture_table, assemble_card, build_model_card
from vanilla_transformer.loading import preset_config
from vanilla_transformer.training_config import PRESETS, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from multi30k import DATASET as MULTI30K_DATASET  # noqa: E402
from multi30k import train_config as multi30k_train_config  # noqa: E402  (benchmarks/multi30k.py)

CARDS_DIR = "model_cards"
PRESET_VOCAB_SIZE = 37000  # the paper's shared WMT14 en-de BPE vocabulary (§5.1), as in the README's size table
BASE_RECIPE = "configs/wmt14_en_de_base.yaml"

# ------------------------------------------------------------------ Multi30k benchmark provenance
# Each row of a results file that benchmarks/multi30k.py writes records its recipe, the command and the
# process layout. Rows written before it did are read with the recipe of the script's revision that wrote
# them, spelled out here; files written by one old revision only are pinned to it.
_OLD_RECIPE = {"max_tokens_per_step": 2500, "warmup_steps": 300, "lr_factor": 0.8}
MULTI30K_REVISIONS: dict[str, dict[str, Any]] = {
    # dc96f83: the first version (fp32; dropout 0.1); it wrote benchmarks/results/multi30k-10min.json
    "dc96f83": {**_OLD_RECIPE, "dropout": 0.1, "eval_every": 500, "save_every": 100, "mixed_precision": "no"},
    # 7f25c8f: bf16 by default (--mixed-precision no for fp32), dropout 0.3; records mixed_precision per row
    "7f25c8f": {**_OLD_RECIPE, "dropout": 0.3, "eval_every": 1000, "save_every": 250, "mixed_precision": None},
}
MULTI30K_UNRECORDED = "7f25c8f"  # the revision of rows that record no recipe, unless their file is pinned
MULTI30K_PINNED: dict[str, dict[str, str]] = {
    "multi30k-10min.json": {
        "revision": "dc96f83",
        "command": "python benchmarks/multi30k.py --minutes 10",
        "note": "results committed on 2026-12-02 in dc96f83 together with the version of the script that wrote them",
    },
}
MULTI30K_DATA = "../shared/data/multi30k"  # the benchmark's default --data, relative to the repository root

# The README's main job. Its run writes outputs/tatoeba_en_de/{results,train_config}.json (not committed);
# verbatim copies of both under model_cards/results/ are the committed inputs of its card.
MAIN_JOB = {
    "name": "vanilla-transformer-tatoeba-en-de-small",
    "results": "model_cards/results/tatoeba_en_de_small.json",
    "train_config": "model_cards/results/tatoeba_en_de_small.train_config.json",
    "config": "configs/tatoeba_en_de_small.yaml",
    "command": "bash scripts/main.sh",
}


# ------------------------------------------------------------------ preset cards
def parameter_count(model_config: Any) -> int:
    """Parameters of the model ``model_config`` describes, built on the meta device (tied matrices counted once)."""
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(model_config)
    return sum(p.numel() for p in model.parameters())


def build_preset_card(preset: str, root: str | Path = ".") -> ModelCard:
    """The card of a Table 3 preset: architecture, parameter count, the paper's recipe; no scores."""
    mc = preset_config(preset, vocab_size=PRESET_VOCAB_SIZE)
    total = parameter_count(mc)
    embedding = mc.vocab_size * mc.d_model
    recipe = TrainConfig.from_file(Path(root) / BASE_RECIPE)
    launch = (
        "accelerate launch --config_file configs/accelerate/8gpu.yaml "
        f"-m vanilla_transformer train --config {BASE_RECIPE}"
    )
    if preset == "base":
        recipe_text = f"""`{BASE_RECIPE}` is the paper's base recipe for WMT 2014 English→German; run it with

```bash
{launch}
```

- Data: Hub dataset `{recipe.dataset_name}` (configuration `{recipe.dataset_config_name}`), \
{recipe.source_lang}→{recipe.target_lang}, validation
  `{recipe.validation_split}`, test `{recipe.test_split}`; a joint byte-level BPE of \
{recipe.vocab_size:,} tokens trained on the
  training split; pairs longer than {recipe.max_length} tokens dropped.
- Batches of at most {recipe.max_tokens} padded tokens per side and process × \
{recipe.gradient_accumulation_steps} accumulation
  (on fewer GPUs than the accelerate configuration's, raise the accumulation to keep the batch size).
- Adam(β1 {recipe.adam_beta1}, β2 {recipe.adam_beta2}, ε {recipe.adam_epsilon}), \
{recipe.warmup_steps} warm-up steps then inverse
  square root, lr_factor {recipe.lr_factor}; label smoothing {recipe.label_smoothing_factor}; \
mixed precision `{recipe.mixed_precision}`.
- {recipe.max_steps:,} steps, a checkpoint every {recipe.save_steps} steps, \
average of the last {recipe.average_last} (§6.1);
  test split scored with beam 4, length penalty 0.6, maximum output length = source length + 50."""
    else:
        recipe_text = f"""No recipe file for the big model ships with the package. The base recipe with the paper's
big-model settings (the big preset, 300,000 steps, average of the last 20 checkpoints, §6.1) is

```bash
{launch} \\
    --preset big --max_steps 300000 --save_total_limit 20 --average_last 20 --output_dir outputs/wmt14_en_de_big
```

(not run by this project). Everything else is as in `{BASE_RECIPE}`: Hub dataset `{recipe.dataset_name}`
(`{recipe.dataset_config_name}`), a joint BPE of {recipe.vocab_size:,} tokens, \
Adam(β1 {recipe.adam_beta1}, β2 {recipe.adam_beta2},
ε {recipe.adam_epsilon}), {recipe.warmup_steps} warm-up steps then inverse square root, label smoothing
{recipe.label_smoothing_factor}, a checkpoint every {recipe.save_steps} steps."""
    name = f"vanilla-transformer-{preset}"
    data = ModelCardData(
        language=["en", "de"],
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="translation",
        tags=[*TAGS, f"transformer-{preset}"],
        datasets=[recipe.dataset_name],
        model_name=name,
    )
    body = f"""
# {name}

The **{preset}** configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017,
Table 3), as `VanillaTransformerConfig.{preset}()` of the `vanilla_transformer` package.

**Not trained here.** This card describes a configuration and the recipe to train it. This project has not
trained this model at this size and publishes no weights and no scores for it: there are no evaluation results
in this card. Measured scores of models this project did train are in the other cards of `model_cards/`.

## Architecture

| setting | value |
|---|---|
{architecture_table(mc)}
| parameters with a {mc.vocab_size:,}-token vocabulary | {total:,} (tied matrices counted once) |
| of which the shared embedding matrix | {embedding:,} |

The parameter count was computed by `python scripts/make_model_cards.py`, which builds
`VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.{preset}(vocab_size={mc.vocab_size}))` on the meta
device and counts its parameters.

```python
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

config = VanillaTransformerConfig.{preset}(vocab_size=len(tokenizer))  # sizes of Table 3; any can be overridden
model = VanillaTransformerForConditionalGeneration(config)
```

## Training recipe

{recipe_text}

## Intended use

A starting point for training the paper's {preset} model on WMT-scale data with GPUs, and a reference for its
exact architecture in `transformers`. It is not a translation model until it has been trained.

## Limitations

- No weights, no scores: nothing in this card has been measured on a translation task by this project.
- The recipe needs the Hugging Face Hub (for `{recipe.dataset_name}`) and GPUs; \
its tokenizer is a byte-level BPE trained
  by the package, not the paper's BPE, so results would not be identical to the paper's.
- sacreBLEU, which the package reports, is not comparable to the paper's tokenised, compound-split BLEU.

## Licence

Code: Apache-2.0. A model trained with the recipe is also subject to the terms of the WMT 2014 corpora.

## Citation

```bibtex
{CITATION}
```
"""
    return assemble_card(data, body)


# ------------------------------------------------------------------ cards from committed results files
def _environment_line(environment: dict | None, test: dict) -> str:
    version = test["bleu_signature"].rsplit("version:", 1)[-1]
    if not environment:
        return f"- Environment: not recorded in the results file (sacreBLEU {version}, from the signature)."
    env = ", ".join(f"{k} {v}" for k, v in environment.items())
    return f"- Environment recorded in the results file: {env}; sacreBLEU {version} (from the signature)."


def multi30k_cards(results_path: str | Path, root: str | Path = ".") -> dict[str, ModelCard]:
    """One card per direction of a ``benchmarks/results/multi30k-<minutes>min.json``, keyed by file name."""
    root, results_path = Path(root), Path(results_path)
    report = json.loads(results_path.read_text(encoding="utf-8"))
    pinned = MULTI30K_PINNED.get(results_path.name, {})
    relative = results_path.resolve().relative_to(root.resolve()).as_posix()
    cards = {}
    for row in report["results"]:
        if "recipe" in row:  # rows written since the script records its recipe, command and processes
            config = multi30k_train_config(
                row["direction"],
                row["minutes"],
                row["recipe"],
                row["mixed_precision"],
                row["processes"],
                MULTI30K_DATA,
                max_steps=row.get("max_steps"),
            )
            command = row["command"]
            source = (
                f"- Results file: `{relative}` (this row: run on {row['date']} "
                f"at commit {row.get('revision') or 'unknown'}, "
                f"{row['processes']} × {row['threads_per_process']} (processes × threads each)"
                + (f", on {row['machine']}" if row.get("machine") else "")
                + (f"; resumed {len(row['resumed'])} time(s)" if row.get("resumed") else "")
                + ")."
            )
        else:
            revision = pinned.get("revision", MULTI30K_UNRECORDED)
            recipe = MULTI30K_REVISIONS[revision]
            mixed_precision = recipe["mixed_precision"] or row.get("mixed_precision") or "bf16"
            config = multi30k_train_config(row["direction"], row["minutes"], recipe, mixed_precision, 1, MULTI30K_DATA)
            command = pinned.get("command") or f"python benchmarks/multi30k.py --minutes {row['minutes']:g}" + (
                f" --mixed_precision {config.mixed_precision}" if config.mixed_precision != "bf16" else ""
            )
            if pinned:
                source = (
                    f"- Results file: `{relative}` ({pinned['note']}); "
                    f"settings of `benchmarks/multi30k.py` at {revision}."
                )
            elif row.get("date"):
                source = (
                    f"- Results file: `{relative}` (this row: run on {row['date']} "
                    f"at commit {row.get('revision') or 'unknown'}, "
                    f"1 process); settings of `benchmarks/multi30k.py` at {revision}."
                )
            else:
                source = (
                    f"- Results file: `{relative}` (it records no date or code revision); settings of "
                    f"`benchmarks/multi30k.py` at {revision}."
                )
        name = f"vanilla-transformer-multi30k-{row['direction']}-{row['minutes']:g}min"
        cards[f"{name}.md"] = build_model_card(
            config,
            None,
            row,
            dataset=MULTI30K_DATASET,
            name=name,
            command=command,
            provenance=[source, _environment_line(report.get("environment"), row["test"])],
        )
    return cards


def main_job_card(root: str | Path = ".") -> dict[str, ModelCard]:
    """The README's main job's card, from the committed copy of its results file (none if it is missing)."""
    root = Path(root)
    results = root / MAIN_JOB["results"]
    if not results.is_file():
        return {}
    summary = json.loads(results.read_text(encoding="utf-8"))
    settings = root / MAIN_JOB["train_config"]
    if settings.is_file():
        config = TrainConfig.from_file(settings)
        settings_line = f"- Settings: `{MAIN_JOB['train_config']}` (the run's `train_config.json`)."
    else:
        config = TrainConfig.from_file(root / MAIN_JOB["config"], output_dir="outputs/tatoeba_en_de")
        settings_line = f"- Settings: `{MAIN_JOB['config']}` (what `{MAIN_JOB['command']}` trains with)."
    provenance = [
        f"- Results file: `{MAIN_JOB['results']}`, a copy of the run's `outputs/tatoeba_en_de/results.json`.",
        settings_line,
        _environment_line(None, summary["test"]),
    ]
    card = build_model_card(
        config, None, summary, name=MAIN_JOB["name"], command=MAIN_JOB["command"], provenance=provenance
    )
    return {f"{MAIN_JOB['name']}.md": card}


def generate_cards(root: str | Path = ".") -> dict[str, str]:
    """Every card of ``model_cards/``, as file name -> text, from the committed inputs under ``root``."""
    root = Path(root)
    cards: dict[str, ModelCard] = {}
    for preset in PRESETS:
        cards[f"vanilla-transformer-{preset}.md"] = build_preset_card(preset, root)
    cards.update(main_job_card(root))
    for path in sorted((root / "benchmarks" / "results").glob("multi30k-*min.json")):
        cards.update(multi30k_cards(path, root))
    return {name: str(card) for name, card in sorted(cards.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description="Generate model_cards/ from the committed results files."
    )
    parser.add_argument("--root", default=".", help="repository root (default: the current folder)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a card is missing or differs")
    args = parser.parse_args(argv)
    root = Path(args.root)
    folder = root / CARDS_DIR
    cards = generate_cards(root)
    if not (root / MAIN_JOB["results"]).is_file():
        print(f"skipped the main job's card: {MAIN_JOB['results']} is missing (see this script's docstring)")
    stale = sorted(p.name for p in folder.glob("*.md") if p.name not in cards) if folder.is_dir() else []
    if args.check:
        differ = [
            n for n, text in cards.items() if not (folder / n).is_file() or (folder / n).read_bytes() != text.encode()
        ]
        for name in differ + stale:
            print(f"out of date: {CARDS_DIR}/{name}")
        return 1 if differ or stale else 0
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in cards.items():
        with open(folder / name, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        print(f"wrote {CARDS_DIR}/{name}")
    for name in stale:
        print(f"stale (no input produces it any more; delete it): {CARDS_DIR}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
