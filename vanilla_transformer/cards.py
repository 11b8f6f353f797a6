"""Model cards of trained models, built from real settings and measured scores (Hub metadata + readable text).

:func:`write_model_card` writes the card of a training run into its ``final/`` folder (the training
command calls it); :func:`build_model_card` builds it from the run's ``TrainConfig``, the trained
model's configuration and the run's summary (its ``results.json``). Cards use huggingface_hub's
``ModelCard`` / ``ModelCardData``, with the measured sacreBLEU and chrF in the ``model-index`` metadata
so that the Hub renders them. Every score in a card is read from the summary; nothing is typed in by hand.
What a card says about the data comes from the run too: the corpus folder's ``dataset_card.json``
(:data:`DATASET_CARD`, e.g. ``data/tatoeba_en_de/dataset_card.json``), or only the data's name.

``scripts/make_model_cards.py`` builds the cards of ``model_cards/`` from the committed results files
with the same pieces.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .loading import preset_config

__all__ = [
    "CITATION",
    "DATASET_CARD",
    "TAGS",
    "architecture_table",
    "assemble_card",
    "build_model_card",
    "dataset_description",
    "write_model_card",
]

CITATION = """@inproceedings{vaswani2017attention,
  title     = {Attention Is All You Need},
  author    = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and
               Gomez, Aidan N. and Kaiser, {\\L}ukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems 30},
  year      = {2017}
}"""

TAGS = ["translation", "vanilla-transformer", "attention-is-all-you-need", "custom_code"]

#: The file of a corpus folder that describes its data set for model cards: a JSON object with ``title`` (how the
#: card names the data), ``hub_id`` (the Hub dataset id of the ``datasets`` metadata, or null), ``about``,
#: ``licence``, ``caveat`` (a limitation, for the reverse direction) and ``citation`` (BibTeX, or null).
DATASET_CARD = "dataset_card.json"
_DATASET_FIELDS = ("hub_id", "title", "about", "licence", "caveat", "citation")


# ------------------------------------------------------------------ pieces shared by the cards
def dataset_description(config: Any) -> dict[str, str | None]:
    """What a card says about the run's data: the corpus folder's :data:`DATASET_CARD` (the folder of
    ``config.train_file`` when the pairs were given as files, else ``config.dataset_name``), or, without one,
    only the name the run gave (a Hub dataset or a folder of someone else's data: its own terms apply).

    Raises:
        ValueError: the folder's :data:`DATASET_CARD` is not a JSON object of the known fields, with a title.
    """
    source = (
        Path(str(config.train_file)).parent if getattr(config, "train_file", None) else Path(str(config.dataset_name))
    )
    path = source / DATASET_CARD
    if path.is_file():
        described = json.loads(path.read_text(encoding="utf-8"))
        unknown = set(described) - set(_DATASET_FIELDS) if isinstance(described, dict) else set()
        if not isinstance(described, dict) or unknown or not described.get("title"):
            raise ValueError(
                f"{path} must be a JSON object with a title and only the fields {', '.join(_DATASET_FIELDS)}"
                f"{f'; unknown: {sorted(unknown)}' if unknown else ''}. Fix the file or remove it."
            )
        return {field: described.get(field) for field in _DATASET_FIELDS}
    return {
        "hub_id": None,
        "title": f"`{config.dataset_name}`",
        "about": None,
        "licence": "see the data's own terms",
        "caveat": None,
        "citation": None,
    }


def architecture_table(model_config: Any) -> str:
    """The rows of a Markdown table of ``model_config`` (a ``VanillaTransformerConfig``): sizes, and the paper's
    choices or deviations."""
    norm = "pre-LN (deviation)" if model_config.norm_first else "post-LN, as in the paper"
    positions = "learned (deviation)" if model_config.position_embedding_type == "learned" else "sinusoidal (§3.5)"
    scaled = "scaled by √d_model (§3.4)" if model_config.scale_embedding else "not scaled (deviation)"
    shared = (
        "one matrix for source, target and output layer (§3.4)"
        if model_config.tie_word_embeddings
        else "separate matrices (deviation)"
    )
    head_dim = getattr(model_config, "head_dim", None)  # d_k = d_v; None or d_model / heads: the paper's (no row)
    papers = {
        model_config.d_model // model_config.encoder_attention_heads,
        model_config.d_model // model_config.decoder_attention_heads,
    }
    differs = head_dim is not None and {head_dim} != papers
    head_size = (
        f"| head size d_k = d_v | {head_dim} (set with head_dim; the paper's is d_model / heads) |\n" if differs else ""
    )
    biases = (
        "| attention projections | with biases (attention_bias; deviation) |\n"
        if getattr(model_config, "attention_bias", False)
        else ""
    )
    return (
        f"| d_model | {model_config.d_model} |\n"
        f"| layers (encoder + decoder) | {model_config.encoder_layers} + {model_config.decoder_layers} |\n"
        f"| attention heads (encoder / decoder) | {model_config.encoder_attention_heads} / "
        f"{model_config.decoder_attention_heads} |\n"
        f"{head_size}"
        f"{biases}"
        f"| d_ff (encoder / decoder) | {model_config.encoder_ffn_dim} / {model_config.decoder_ffn_dim} |\n"
        f"| dropout P_drop (residual, embeddings) | {model_config.dropout} |\n"
        f"| attention / activation dropout | {model_config.attention_dropout} / {model_config.activation_dropout} |\n"
        f"| layer norm | {norm} |\n"
        f"| positions | {positions} |\n"
        f"| embeddings | {shared}, {scaled} |"
    )


def _eval_results(config: Any, test: dict, dataset: dict) -> list[EvalResult]:
    """model-index entries: the test split's sacreBLEU and chrF exactly as measured, signatures as metric_config."""
    pair = f"{config.source_lang}-{config.target_lang}"
    dataset_type = dataset["hub_id"] or Path(str(config.dataset_name)).name
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


def assemble_card(data: ModelCardData, body: str) -> ModelCard:
    """A card of Hub metadata ``data`` and Markdown ``body``."""
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
    dataset: dict[str, str | None] | None = None,
    name: str | None = None,
    command: str | None = None,
    provenance: list[str] | None = None,
) -> ModelCard:
    """A card for a model trained by ``vanilla_transformer.training.train`` with ``config``.

    Every number in it comes from ``summary`` (what the run measured: the training command's
    ``results.json``) or from the settings (``config``, ``model_config``). ``model_config`` is the trained
    model's configuration (``None``: the sizes ``config`` asks for; the vocabulary size is then unknown).
    ``dataset`` describes the data (the fields of :data:`DATASET_CARD`); by default
    :func:`dataset_description` reads it from the run's corpus folder. ``command`` names the command that
    measured the scores and ``provenance`` adds lines about where the results file comes from (versions,
    revision); both default to the training run itself.
    """
    pair = f"{config.source_lang}-{config.target_lang}"
    overrides = ", ".join(f"{k}={v}" for k, v in config.config_overrides.items()) or "none"
    dataset = dict(dataset) if dataset is not None else dataset_description(config)
    if dataset_name:
        dataset = {**dataset, "hub_id": dataset_name}
    name = name or f"vanilla-transformer-{pair}"
    test = summary.get("test")
    data = ModelCardData(
        language=[config.source_lang, config.target_lang],
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
    sizes = model_config if known_vocab else preset_config(config.preset, **config.config_overrides)
    if config.tokenizer_name:
        vocab = f"the tokenizer `{config.tokenizer_name}`" + (f", {sizes.vocab_size} tokens" if known_vocab else "")
    elif known_vocab:
        vocab = f"{sizes.vocab_size} tokens, a joint byte-level BPE of both languages trained on the training split"
    else:
        vocab = (
            "a joint byte-level BPE of both languages trained on the training split "
            f"(vocab_size {config.vocab_size} requested)"
        )
    origin = (
        f"initialised from `{config.model_name_or_path}`"
        if config.model_name_or_path
        else f"`{config.preset}` preset of Table 3 with overrides {overrides}"
    )
    if command:
        measured_by = f"Measured by `{command}`"
    else:
        measured_by = "Measured by the training run that wrote this folder (`vanilla_transformer.training.train`)"
    provenance_text = f"{measured_by}; every score and training statistic below is read from that command's results."
    if provenance:
        provenance_text += "\n\n" + "\n".join(provenance)
    stats = [
        f"{summary['step']} optimizer steps"
        + (f" (stopped by `{summary['stop_reason']}`)" if summary.get("stop_reason") else "")
    ]
    if "target_tokens" in summary:
        stats.append(f"{summary['target_tokens']:,} target tokens")
    if "loop_seconds" in summary:
        stats.append(f"{summary['loop_seconds'] / 60:.1f} minutes in the training loop")
    averaged = summary.get("averaged_checkpoints")
    averaged_text = (
        f"averaged checkpoints: {', '.join(averaged)}"
        if averaged
        else f"averaged the last saved checkpoints (at most average_last = {config.average_last}; "
        "this results file does not list them)"
    )
    valid = ""
    if "valid_loss" in summary:
        valid = f"\n- At the last validation: loss {summary['valid_loss']:.3f}, perplexity {summary['valid_ppl']:.2f}"
        if "valid_bleu" in summary:
            valid += (
                f", sacreBLEU {summary['valid_bleu']:.2f} on up to the first {config.eval_bleu_sentences} "
                f"`{config.validation_split}` sentences"
            )
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
    hardware = (
        "The wall-clock budget makes the result depend on the hardware the command ran on."
        if config.max_minutes
        else "A budget of optimizer steps, not of time: another machine trains the same steps, at its own speed."
    )
    budget = f"{config.max_steps:,} steps" + (
        f" or {config.max_minutes:g} minutes, whichever comes first" if config.max_minutes else ""
    )
    n = summary.get("processes", 1)  # results written before it was recorded: one process
    processes = "1 process" if n == 1 else f"{n} data-parallel processes"
    clipping = f"gradient clipping at norm {config.max_grad_norm}" if config.max_grad_norm else "no gradient clipping"
    caveat = f"\n- {dataset['caveat']}" if dataset.get("caveat") and config.source_lang == "de" else ""
    body = f"""
# {name}

The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), \
{config.source_lang}→{config.target_lang}, trained
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
{architecture_table(sizes)}
| vocabulary | {vocab} |

## Training recipe

- Data: `{config.dataset_name}`, splits `{config.train_split}` / `{config.validation_split}` / \
`{config.test_split}`, pairs longer
  than {config.max_length} tokens on either side dropped (never truncated).
- Batches of sentence pairs of similar length, at most {config.max_tokens} padded tokens per side
  × {config.gradient_accumulation_steps} accumulation × {processes} (§5.1), seed {config.seed}.
- Adam(β1 {config.adam_beta1}, β2 {config.adam_beta2}, ε {config.adam_epsilon}), the paper's learning rate with
  {config.warmup_steps} warm-up steps, × lr_factor {config.lr_factor} (§5.3); \
label smoothing {config.label_smoothing_factor} (§5.4);
  {clipping}; mixed precision `{config.mixed_precision}`.
- Budget: {budget}; checkpoints every {config.save_steps} steps and at the stop; {averaged_text} (§6.1).

What the run did:

- {"; ".join(stats)}{valid}{dropped}

## Intended use

Research and teaching: a faithful, small-scale reproduction of the paper's model and recipe as a native
`transformers` model, a baseline for experiments at this scale, and a test of the code. Not for
translating text that matters to someone: use a production translation system for that.

## How to use

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("<this folder or repo>", trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained("<this folder or repo>", trust_remote_code=True)
batch = tokenizer(["..."], return_tensors="pt")
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

## Limitations

- A small model trained briefly on a small corpus: expect errors on text unlike its training data (names,
  long or rare sentences, other domains and registers), and omissions or invented content.
- One run with one seed: the variation between runs was not measured.
- {hardware}
- The training data's biases (for instance gender in translations of neutral sentences) carry into the output.{caveat}
- {_NOT_COMPARABLE}

## Licence

Code and model files: Apache-2.0. Training data: {dataset["title"]}: {dataset["licence"]}. Check that the data's
terms allow your use of a model trained on it.

## Citation

{_citations(dataset)}
"""
    return assemble_card(data, body)


def write_model_card(folder: str | Path, config: Any, model_config: Any, summary: dict) -> Path:
    """The training command's card: ``folder/README.md`` from the run's settings and scores."""
    card = build_model_card(config, model_config, summary)
    path = Path(folder) / "README.md"
    card.save(path)
    return path
