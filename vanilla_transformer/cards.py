"""Model cards written from the real settings and scores of a run (Hub metadata + readable text).

Uses huggingface_hub's ``ModelCard`` / ``ModelCardData`` for the metadata block (``model-index`` with
the measured sacreBLEU), so the Hub renders the results; the text is a short template filled in here.
"""

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


def build_model_card(config: Any, model_config: Any, summary: dict, dataset_name: str | None = None) -> ModelCard:
    """A card for a model trained by ``vanilla_transformer.training.train`` with ``config``.

    Every number in it comes from ``summary`` (what the run measured) or the configurations.
    """
    pair = f"{config.src_lang}-{config.tgt_lang}"
    dataset_name = dataset_name or Path(str(config.data)).name
    results = []
    test = summary.get("test")
    if test:
        for metric, key in (("sacrebleu", "bleu"), ("chrf", "chrf")):
            results.append(
                EvalResult(
                    task_type="translation",
                    task_name=f"Translation {pair}",
                    dataset_type=dataset_name,
                    dataset_name=f"{dataset_name} ({config.test_split})",
                    dataset_split=config.test_split,
                    metric_type=metric,
                    metric_name=f"{metric} ({test[key + '_signature']})",
                    metric_value=round(float(test[key]), 2),
                )
            )
    data = ModelCardData(
        language=[config.src_lang, config.tgt_lang],
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "vanilla-transformer", "attention-is-all-you-need", "custom_code"],
        model_name=f"vanilla-transformer-{pair}",
        eval_results=results or None,
    )
    sizes = (
        f"d_model {model_config.d_model}, {model_config.encoder_layers}+{model_config.decoder_layers} layers, "
        f"{model_config.encoder_attention_heads} heads, d_ff {model_config.encoder_ffn_dim}, "
        f"vocabulary {model_config.vocab_size}, dropout {model_config.dropout}"
    )
    score_lines = (
        f"| sacreBLEU | {test['bleu']:.2f} | `{test['bleu_signature']}` |\n| chrF | {test['chrf']:.2f} | `{test['chrf_signature']}` |"
        if test
        else "| (no test split was scored) | | |"
    )
    content = f"""---
{data.to_yaml()}
---

# vanilla-transformer {pair}

The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), trained with the
`vanilla_transformer` package's recipe (§5 of the paper) on `{config.data}`.

## Model
{config.preset} preset with overrides {config.model or "none"}: {sizes}. Post-LN, sinusoidal positions,
one embedding matrix shared by source, target and output layer.

## Training
{summary.get("step")} steps ({summary.get("stop_reason", "max_steps")}), {summary.get("target_tokens", 0):,} target tokens, in {summary.get("loop_seconds", 0) / 60:.1f} minutes;
Adam(0.9, 0.98, 1e-9), warm-up {config.warmup_steps} steps then inverse square root (lr factor {config.lr_factor}),
label smoothing {config.label_smoothing}, at most {config.max_tokens} tokens per batch and side
× {config.gradient_accumulation} accumulation, mixed precision `{config.mixed_precision}`, seed {config.seed};
averaged checkpoints: {", ".join(summary.get("averaged_checkpoints", [])) or "none"}.

## Results
Beam 4, length penalty 0.6, maximum output length = source length + 50, on {test["n"] if test else 0} sentences
of the `{config.test_split}` split:

| metric | score | signature |
|---|---|---|
{score_lines}

## Use
```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("<this folder or repo>")
model = AutoModelForSeq2SeqLM.from_pretrained("<this folder or repo>", trust_remote_code=True)
batch = tokenizer(["..."], return_tensors="pt")
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

## Limitations
A small model trained briefly on the data named above: expect errors on text unlike that data
(names, long or rare sentences, other domains). Not for any use where a wrong translation can cause harm.

## Citation
```bibtex
{CITATION}
```
"""
    return ModelCard(content)


def write_model_card(folder: str | Path, config: Any, model_config: Any, summary: dict) -> Path:
    card = build_model_card(config, model_config, summary)
    path = Path(folder) / "README.md"
    card.save(path)
    return path
