"""Model cards generated from real settings and measured scores (Hub metadata + readable text).

Two kinds of card, both built here from one template family with huggingface_hub's ``ModelCard`` /
``ModelCardData`` (``model-index`` with the measured sacreBLEU and chrF, so the Hub renders them):

* **trained-model cards**: the training command writes one into its ``final/`` folder
  (:func:`write_model_card`), and :func:`generate_cards` writes one per committed results file into
  ``model_cards/`` (the README's main job from ``model_cards/results/``, each direction of every
  ``benchmarks/results/multi30k-<minutes>min.json``). Every score in them is read from the results file
  of the command the card names; nothing is typed in by hand.
* **preset cards** (``base``, ``big``): the architecture of Table 3, the parameter count computed by
  building the model on the meta device, the paper's recipe; no scores, because these presets were not
  trained by this project.

Regenerate the folder (and check it is up to date) with::

    python -m vanilla_transformer.cards            # writes model_cards/*.md
    python -m vanilla_transformer.cards --check    # exit 1 if a card differs from what its inputs give

The main job's card is skipped until its results are committed. To add them, after a run of the command
the card names (``bash scripts/main.sh`` with no extra arguments), copy its two files unchanged::

    mkdir -p model_cards/results
    cp outputs/tatoeba_en_de/results.json      model_cards/results/tatoeba_en_de_small.json
    cp outputs/tatoeba_en_de/train_config.json model_cards/results/tatoeba_en_de_small.train_config.json
    python -m vanilla_transformer.cards
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

CITATION = """@inproceedings{vaswani2017attention,
  title     = {Attention Is All You Need},
  author    = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and
               Gomez, Aidan N. and Kaiser, {\\L}ukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems 30},
  year      = {2017}
}"""

TAGS = ["translation", "vanilla-transformer", "attention-is-all-you-need", "custom_code"]
CARDS_DIR = "model_cards"
PRESET_VOCAB_SIZE = 37000  # the paper's shared WMT14 en-de BPE vocabulary (§5.1), as in the README's size table
BASE_RECIPE = "configs/wmt14_en_de_base.yaml"

# Data sets, by the last component of ``TrainConfig.data``. ``hub_id`` goes into the ``datasets`` metadata.
DATASETS: dict[str, dict[str, str | None]] = {
    "tatoeba_en_de": {
        "hub_id": "tatoeba",
        "title": "Tatoeba English–German, the fixed split bundled in `data/tatoeba_en_de`",
        "about": (
            "short everyday sentences written and translated by volunteers of the Tatoeba project (taken from "
            "manythings.org/anki), split so that no English sentence occurs in two splits; how the split was "
            "made is in `data/tatoeba_en_de/README.md`"
        ),
        "licence": (
            "Creative Commons Attribution 2.0 (CC BY 2.0, https://creativecommons.org/licenses/by/2.0/); "
            "attribution: www.manythings.org/anki and tatoeba.org"
        ),
        "caveat": (
            "The split is by English sentence: for de→en, some German test sentences also occur in the training "
            "split (counted in `data/tatoeba_en_de/README.md`)."
        ),
        "citation": None,
    },
    "multi30k": {
        "hub_id": "multi30k",
        "title": "Multi30k (WMT 2016 multimodal translation, task 1), English–German",
        "about": (
            "English descriptions of Flickr30K images and their German translations: the `train`, `val` and "
            "`test_2016_flickr` files of the official repository (https://github.com/multi30k/dataset, commit "
            "a3d2e0d26b56f3846f66a952536ffed4e401d05a), untokenised; provenance in `shared/data/multi30k/SOURCE.md`"
        ),
        "licence": (
            "no explicit licence for the text; the source provides it for non-commercial research and "
            "educational use only (it is partly derived from Flickr30K, whose images fall under the Flickr "
            "Terms of Use), and asks users to cite Elliott et al. (2016)"
        ),
        "caveat": None,
        "citation": """@inproceedings{elliott2016multi30k,
  title     = {Multi30K: Multilingual English-German Image Descriptions},
  author    = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  pages     = {70--74},
  year      = {2016},
  doi       = {10.18653/v1/W16-3210}
}""",
    },
    "wmt14": {
        "hub_id": "wmt14",
        "title": "WMT 2014 English–German (Hub dataset `wmt14`, configuration `de-en`)",
        "about": "train / validation (newstest2013) / test (newstest2014) of the Hub dataset `wmt14`",
        "licence": "the terms of each WMT 2014 corpus (see the dataset's page on the Hub)",
        "caveat": None,
        "citation": None,
    },
}

# ------------------------------------------------------------------ Multi30k benchmark provenance
# Each row of a results file that benchmarks/multi30k.py writes records its recipe (the settings below), the
# command and the process layout. Rows written before it did are read with the recipe of the script's revision
# that wrote them, spelled out here; files written by one old revision only are pinned to it.
MULTI30K_MODEL = {
    "d_model": 256, "encoder_layers": 3, "decoder_layers": 3, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024,
}  # fmt: skip
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
MULTI30K_DATA = "../shared/data/multi30k"  # the script's default --data, relative to the repository root

# The README's main job. Its run writes outputs/tatoeba_en_de/{results,train_config}.json (not committed);
# verbatim copies of both under model_cards/results/ are the committed inputs of its card.
MAIN_JOB = {
    "name": "vanilla-transformer-tatoeba-en-de-small",
    "results": "model_cards/results/tatoeba_en_de_small.json",
    "train_config": "model_cards/results/tatoeba_en_de_small.train_config.json",
    "config": "configs/tatoeba_en_de_small.yaml",
    "command": "bash scripts/main.sh",
}


# ------------------------------------------------------------------ pieces shared by the cards
def _dataset(config: Any) -> dict[str, str | None]:
    key = Path(str(config.data)).name
    if key in DATASETS:
        return DATASETS[key]
    return {"hub_id": None, "title": f"`{config.data}`", "about": None, "licence": "see the data's own terms",
            "caveat": None, "citation": None}  # fmt: skip


def _resolved_model_config(config: Any) -> Any:
    """The model sizes a TrainConfig asks for (its preset plus overrides); the vocabulary is the tokenizer's."""
    from .configuration_vanilla_transformer import VanillaTransformerConfig

    return getattr(VanillaTransformerConfig, config.preset)(**config.model)


def parameter_count(model_config: Any) -> int:
    """Parameters of the model ``model_config`` describes, built on the meta device (tied matrices counted once)."""
    import torch

    from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(model_config)
    return sum(p.numel() for p in model.parameters())


def _architecture(mc: Any) -> str:
    norm = "pre-LN (deviation)" if mc.norm_first else "post-LN, as in the paper"
    positions = "learned (deviation)" if mc.position_embedding_type == "learned" else "sinusoidal (§3.5)"
    scaled = "scaled by √d_model (§3.4)" if mc.scale_embedding else "not scaled (deviation)"
    shared = "one matrix for source, target and output layer (§3.4)" if mc.tie_word_embeddings else "separate matrices (deviation)"
    return (
        f"| d_model | {mc.d_model} |\n"
        f"| layers (encoder + decoder) | {mc.encoder_layers} + {mc.decoder_layers} |\n"
        f"| attention heads (encoder / decoder) | {mc.encoder_attention_heads} / {mc.decoder_attention_heads} |\n"
        f"| d_ff (encoder / decoder) | {mc.encoder_ffn_dim} / {mc.decoder_ffn_dim} |\n"
        f"| dropout P_drop (residual, embeddings) | {mc.dropout} |\n"
        f"| attention / activation dropout | {mc.attention_dropout} / {mc.activation_dropout} |\n"
        f"| layer norm | {norm} |\n"
        f"| positions | {positions} |\n"
        f"| embeddings | {shared}, {scaled} |"
    )


def _eval_results(config: Any, test: dict, dataset: dict) -> list[EvalResult]:
    """model-index entries: the test split's sacreBLEU and chrF exactly as measured, signatures as metric_config."""
    pair = f"{config.src_lang}-{config.tgt_lang}"
    dataset_type = dataset["hub_id"] or Path(str(config.data)).name
    return [
        EvalResult(
            task_type="translation",
            task_name=f"Translation {pair}",
            dataset_type=dataset_type,
            dataset_name=f"{dataset_type} {pair} ({config.test_split})",
            dataset_split=config.test_split,
            metric_type=metric,
            metric_name=label,
            metric_config=test[f"{key}_signature"],
            metric_value=float(test[key]),
        )
        for metric, label, key in (("sacrebleu", "sacreBLEU", "bleu"), ("chrf", "chrF", "chrf"))
    ]


def _card(data: ModelCardData, body: str) -> ModelCard:
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body.strip()}\n")


def _citations(dataset: dict) -> str:
    blocks = [CITATION] + ([dataset["citation"]] if dataset.get("citation") else [])
    return "\n\n".join(f"```bibtex\n{block}\n```" for block in blocks)


_NOT_COMPARABLE = (
    "The scores are detokenised sacreBLEU / chrF with the signatures shown. They are **not comparable** to the "
    "paper's BLEU, which is tokenised BLEU with compound splitting on WMT 2014 newstest2014 (and a far larger "
    "model, corpus and compute budget)."
)


# ------------------------------------------------------------------ trained-model cards
def build_model_card(
    config: Any,
    model_config: Any,
    summary: dict,
    dataset_name: str | None = None,
    *,
    name: str | None = None,
    command: str | None = None,
    provenance: list[str] | None = None,
) -> ModelCard:
    """A card for a model trained by ``vanilla_transformer.training.train`` with ``config``.

    Every number in it comes from ``summary`` (what the run measured: the training command's
    ``results.json``) or from the settings (``config``, ``model_config``). ``model_config`` is the trained
    model's configuration (``None``: the sizes ``config`` asks for; the vocabulary size is then unknown).
    ``command`` names the command that measured the scores and ``provenance`` adds lines about where the
    results file comes from (versions, revision); both default to the training run itself.
    """
    pair = f"{config.src_lang}-{config.tgt_lang}"
    overrides = ", ".join(f"{k}={v}" for k, v in config.model.items()) or "none"
    dataset = _dataset(config)
    if dataset_name:
        dataset = {**dataset, "hub_id": dataset_name}
    name = name or f"vanilla-transformer-{pair}"
    test = summary.get("test")
    data = ModelCardData(
        language=[config.src_lang, config.tgt_lang],
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="translation",
        tags=TAGS,
        datasets=[dataset["hub_id"]] if dataset["hub_id"] else None,
        metrics=["sacrebleu", "chrf"],
        model_name=name,
        eval_results=_eval_results(config, test, dataset) if test else None,
    )
    known_vocab = model_config is not None
    mc = model_config if known_vocab else _resolved_model_config(config)
    if config.tokenizer:
        vocab = f"the tokenizer `{config.tokenizer}`" + (f", {mc.vocab_size} tokens" if known_vocab else "")
    elif known_vocab:
        vocab = f"{mc.vocab_size} tokens, a joint byte-level BPE of both languages trained on the training split"
    else:
        vocab = f"a joint byte-level BPE of both languages trained on the training split (vocab_size {config.vocab_size} requested)"
    origin = (
        f"initialised from `{config.init_from}`"
        if config.init_from
        else f"`{config.preset}` preset of Table 3 with overrides {overrides}"
    )
    if command:
        measured_by = f"Measured by `{command}`"
    else:
        measured_by = "Measured by the training run that wrote this folder (`vanilla_transformer.training.train`)"
    provenance_text = f"{measured_by}; every score and training statistic below is read from that command's results."
    if provenance:
        provenance_text += "\n\n" + "\n".join(provenance)
    stats = [f"{summary['step']} optimizer steps" + (f" (stopped by `{summary['stop_reason']}`)" if summary.get("stop_reason") else "")]
    if "target_tokens" in summary:
        stats.append(f"{summary['target_tokens']:,} target tokens")
    if "loop_seconds" in summary:
        stats.append(f"{summary['loop_seconds'] / 60:.1f} minutes in the training loop")
    averaged = summary.get("averaged_checkpoints")
    averaged_text = (
        f"averaged checkpoints: {', '.join(averaged)}"
        if averaged
        else f"averaged the last saved checkpoints (at most average_last = {config.average_last}; this results file does not list them)"
    )
    valid = ""
    if "valid_loss" in summary:
        valid = f"\n- At the last validation: loss {summary['valid_loss']:.3f}, perplexity {summary['valid_ppl']:.2f}"
        if "valid_bleu" in summary:
            valid += (f", sacreBLEU {summary['valid_bleu']:.2f} on up to the first {config.eval_bleu_sentences} "
                      f"`{config.valid_split}` sentences")  # fmt: skip
    dropped = ""
    if summary.get("dropped"):
        dropped = "\n- Pairs dropped (empty or longer than max_length): " + ", ".join(
            f"{split} {n:,}" for split, n in summary["dropped"].items()
        )
    if test:
        scores = (
            f"| sacreBLEU | {test['bleu']:.2f} |\n| chrF | {test['chrf']:.2f} |\n\n"
            f"Signatures: sacreBLEU `{test['bleu_signature']}`, chrF `{test['chrf_signature']}`."
        )
        n_sentences = f"{test['n']} sentences of"
    else:
        scores, n_sentences = "| (no test split was scored) | |", "no sentences of"
    budget = f"{config.max_steps:,} steps" + (f" or {config.max_minutes:g} minutes, whichever comes first" if config.max_minutes else "")
    n = summary.get("processes", 1)  # results written before it was recorded: one process
    processes = "1 process" if n == 1 else f"{n} data-parallel processes"
    clipping = f"gradient clipping at norm {config.max_grad_norm}" if config.max_grad_norm else "no gradient clipping"
    caveat = f"\n- {dataset['caveat']}" if dataset.get("caveat") and config.src_lang == "de" else ""
    body = f"""
# {name}

The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), {config.src_lang}→{config.tgt_lang}, trained
from scratch with the `vanilla_transformer` package's implementation of the paper's recipe (§5) on
{dataset["title"]}.

{provenance_text}

## Results

{n_sentences} the `{config.test_split}` split, beam 4, length penalty 0.6, maximum output length = source
length + 50 (the paper's decoding, §6.1); scores rounded here, exact in the metadata:

| metric | score |
|---|---|
{scores}

{_NOT_COMPARABLE}

## Model

The paper's architecture, {origin}:

| setting | value |
|---|---|
{_architecture(mc)}
| vocabulary | {vocab} |

## Training recipe

- Data: `{config.data}`, splits `{config.train_split}` / `{config.valid_split}` / `{config.test_split}`, pairs longer
  than {config.max_length} tokens on either side dropped (never truncated).
- Batches of sentence pairs of similar length, at most {config.max_tokens} padded tokens per side
  × {config.gradient_accumulation} accumulation × {processes} (§5.1), seed {config.seed}.
- Adam(β1 {config.adam_beta1}, β2 {config.adam_beta2}, ε {config.adam_epsilon}), the paper's learning rate with
  {config.warmup_steps} warm-up steps, × lr_factor {config.lr_factor} (§5.3); label smoothing {config.label_smoothing} (§5.4);
  {clipping}; mixed precision `{config.mixed_precision}`.
- Budget: {budget}; checkpoints every {config.save_every} steps and at the stop; {averaged_text} (§6.1).

What the run did:

- {"; ".join(stats)}{valid}{dropped}

## Intended use

Research and teaching: a faithful, small-scale reproduction of the paper's model and recipe as a native
`transformers` model, a baseline for experiments at this scale, and a test of the code. Not for
translating text that matters to someone: use a production translation system for that.

## How to use

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("<this folder or repo>")
model = AutoModelForSeq2SeqLM.from_pretrained("<this folder or repo>", trust_remote_code=True)
batch = tokenizer(["..."], return_tensors="pt")
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

## Limitations

- A small model trained briefly on a small corpus: expect errors on text unlike its training data (names,
  long or rare sentences, other domains and registers), and omissions or invented content.
- One run with one seed: the variation between runs was not measured.
- The wall-clock budget makes the result depend on the hardware the command ran on.
- The training data's biases (for instance gender in translations of neutral sentences) carry into the output.{caveat}
- {_NOT_COMPARABLE}

## Licence

Code and model files: Apache-2.0. Training data: {dataset["title"]}: {dataset["licence"]}. Check that the data's
terms allow your use of a model trained on it.

## Citation

{_citations(dataset)}
"""
    return _card(data, body)


def write_model_card(folder: str | Path, config: Any, model_config: Any, summary: dict) -> Path:
    """The training command's card: ``folder/README.md`` from the run's settings and scores."""
    card = build_model_card(config, model_config, summary)
    path = Path(folder) / "README.md"
    card.save(path)
    return path


# ------------------------------------------------------------------ preset cards
def build_preset_card(preset: str, root: str | Path = ".") -> ModelCard:
    """The card of a Table 3 preset: architecture, parameter count, the paper's recipe; no scores."""
    from .configuration_vanilla_transformer import VanillaTransformerConfig
    from .training import TrainConfig

    mc = getattr(VanillaTransformerConfig, preset)(vocab_size=PRESET_VOCAB_SIZE)
    total = parameter_count(mc)
    embedding = mc.vocab_size * mc.d_model
    recipe = TrainConfig.from_file(Path(root) / BASE_RECIPE)
    launch = f"accelerate launch --config_file configs/accelerate/8gpu.yaml -m vanilla_transformer train --config {BASE_RECIPE}"
    if preset == "base":
        recipe_text = f"""`{BASE_RECIPE}` is the paper's base recipe for WMT 2014 English→German; run it with

```bash
{launch}
```

- Data: Hub dataset `{recipe.data}` (configuration `{recipe.hub_config}`), {recipe.src_lang}→{recipe.tgt_lang}, validation
  `{recipe.valid_split}`, test `{recipe.test_split}`; a joint byte-level BPE of {recipe.vocab_size:,} tokens trained on the
  training split; pairs longer than {recipe.max_length} tokens dropped.
- Batches of at most {recipe.max_tokens} padded tokens per side and process × {recipe.gradient_accumulation} accumulation
  (on fewer GPUs than the accelerate configuration's, raise the accumulation to keep the batch size).
- Adam(β1 {recipe.adam_beta1}, β2 {recipe.adam_beta2}, ε {recipe.adam_epsilon}), {recipe.warmup_steps} warm-up steps then inverse
  square root, lr_factor {recipe.lr_factor}; label smoothing {recipe.label_smoothing}; mixed precision `{recipe.mixed_precision}`.
- {recipe.max_steps:,} steps, a checkpoint every {recipe.save_every} steps, average of the last {recipe.average_last} (§6.1);
  test split scored with beam 4, length penalty 0.6, maximum output length = source length + 50."""
    else:
        recipe_text = f"""No recipe file for the big model ships with the package. The base recipe with the paper's
big-model settings (the big preset, 300,000 steps, average of the last 20 checkpoints, §6.1) is

```bash
{launch} \\
    --preset big --max-steps 300000 --keep-checkpoints 20 --average-last 20 --output-dir outputs/wmt14_en_de_big
```

(not run by this project). Everything else is as in `{BASE_RECIPE}`: Hub dataset `{recipe.data}`
(`{recipe.hub_config}`), a joint BPE of {recipe.vocab_size:,} tokens, Adam(β1 {recipe.adam_beta1}, β2 {recipe.adam_beta2},
ε {recipe.adam_epsilon}), {recipe.warmup_steps} warm-up steps then inverse square root, label smoothing
{recipe.label_smoothing}, a checkpoint every {recipe.save_every} steps."""
    name = f"vanilla-transformer-{preset}"
    data = ModelCardData(
        language=["en", "de"],
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="translation",
        tags=[*TAGS, f"transformer-{preset}"],
        datasets=[recipe.data],
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
{_architecture(mc)}
| parameters with a {mc.vocab_size:,}-token vocabulary | {total:,} (tied matrices counted once) |
| of which the shared embedding matrix | {embedding:,} |

The parameter count was computed by `python -m vanilla_transformer.cards`, which builds
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
- The recipe needs the Hugging Face Hub (for `{recipe.data}`) and GPUs; its tokenizer is a byte-level BPE trained
  by the package, not the paper's BPE, so results would not be identical to the paper's.
- sacreBLEU, which the package reports, is not comparable to the paper's tokenised, compound-split BLEU.

## Licence

Code: Apache-2.0. A model trained with the recipe is also subject to the terms of the WMT 2014 corpora.

## Citation

```bibtex
{CITATION}
```
"""
    return _card(data, body)


# ------------------------------------------------------------------ cards from committed results files
def multi30k_train_config(direction: str, minutes: float, recipe: dict, mixed_precision: str, processes: int = 1,
                          data: str = MULTI30K_DATA, output_dir: str | None = None):  # fmt: skip
    """The TrainConfig that ``benchmarks/multi30k.py`` trains ``direction`` with, given its recipe, in each
    of its ``processes`` (which share the recipe's tokens per step)."""
    from .training import TrainConfig

    src, tgt = direction.split("-")
    return TrainConfig(
        data=data, src_lang=src, tgt_lang=tgt, valid_split="validation", test_split="test_2016_flickr",
        vocab_size=8000, model={**MULTI30K_MODEL, "dropout": recipe["dropout"]},
        max_tokens=recipe["max_tokens_per_step"] // processes,
        warmup_steps=recipe["warmup_steps"], lr_factor=recipe["lr_factor"], max_steps=10**6, max_minutes=minutes,
        eval_every=recipe["eval_every"], eval_bleu_sentences=100, save_every=recipe["save_every"], keep_checkpoints=5,
        average_last=5, mixed_precision=mixed_precision,
        output_dir=output_dir or f"outputs/multi30k-{direction}-{minutes:g}min",
    )  # fmt: skip


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
            config = multi30k_train_config(row["direction"], row["minutes"], row["recipe"], row["mixed_precision"], row["processes"])
            command = row["command"]
            source = (f"- Results file: `{relative}` (this row: run on {row['date']} at commit {row.get('revision') or 'unknown'}, "
                      f"{row['processes']} × {row['threads_per_process']} (processes × threads each))."  # fmt: skip
            )
        else:
            revision = pinned.get("revision", MULTI30K_UNRECORDED)
            recipe = MULTI30K_REVISIONS[revision]
            config = multi30k_train_config(row["direction"], row["minutes"], recipe,
                                           recipe["mixed_precision"] or row.get("mixed_precision") or "bf16")  # fmt: skip
            command = pinned.get("command") or f"python benchmarks/multi30k.py --minutes {row['minutes']:g}" + (
                f" --mixed-precision {config.mixed_precision}" if config.mixed_precision != "bf16" else ""
            )
            if pinned:
                source = f"- Results file: `{relative}` ({pinned['note']}); settings of `benchmarks/multi30k.py` at {revision}."
            elif row.get("date"):
                source = (f"- Results file: `{relative}` (this row: run on {row['date']} at commit {row.get('revision') or 'unknown'}, "
                          f"1 process); settings of `benchmarks/multi30k.py` at {revision}.")  # fmt: skip
            else:
                source = (f"- Results file: `{relative}` (it records no date or code revision); settings of "
                          f"`benchmarks/multi30k.py` at {revision}.")  # fmt: skip
        name = f"vanilla-transformer-multi30k-{row['direction']}-{row['minutes']:g}min"
        cards[f"{name}.md"] = build_model_card(
            config, None, row, name=name, command=command,
            provenance=[source, _environment_line(report.get("environment"), row["test"])],
        )  # fmt: skip
    return cards


def main_job_card(root: str | Path = ".") -> dict[str, ModelCard]:
    """The README's main job's card, from the committed copy of its results file (none if it is missing)."""
    from .training import TrainConfig

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
    card = build_model_card(config, None, summary, name=MAIN_JOB["name"], command=MAIN_JOB["command"], provenance=provenance)
    return {f"{MAIN_JOB['name']}.md": card}


def generate_cards(root: str | Path = ".") -> dict[str, str]:
    """Every card of ``model_cards/``, as file name -> text, from the committed inputs under ``root``."""
    root = Path(root)
    cards: dict[str, ModelCard] = {}
    for preset in ("base", "big"):
        cards[f"vanilla-transformer-{preset}.md"] = build_preset_card(preset, root)
    cards.update(main_job_card(root))
    for path in sorted((root / "benchmarks" / "results").glob("multi30k-*min.json")):
        cards.update(multi30k_cards(path, root))
    return {name: str(card) for name, card in sorted(cards.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate model_cards/ from the committed results files.")
    parser.add_argument("--root", default=".", help="repository root (default: the current folder)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a card is missing or differs")
    args = parser.parse_args(argv)
    root = Path(args.root)
    folder = root / CARDS_DIR
    cards = generate_cards(root)
    if not (root / MAIN_JOB["results"]).is_file():
        print(f"skipped the main job's card: {MAIN_JOB['results']} is missing (see this module's docstring)")
    stale = sorted(p.name for p in folder.glob("*.md") if p.name not in cards) if folder.is_dir() else []
    if args.check:
        differ = [n for n, text in cards.items() if not (folder / n).is_file() or (folder / n).read_bytes() != text.encode()]
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
