"""The model card of a trained folder: Hub metadata with exactly the measured scores, settings read from the
run. The committed cards of model_cards/ are tested in test_make_model_cards.py."""

import dataclasses

from huggingface_hub import ModelCard

from vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.cards import architecture_table, build_model_card, write_model_card
from vanilla_transformer.training_config import TrainConfig

TEST = {
    "bleu": 12.3456,
    "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
    "chrf": 30.5,
    "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0",
    "n": 17,
}
# the shape of a training run's summary (values made up for this test only)
SUMMARY = {
    "step": 7,
    "target_tokens": 1234,
    "loop_seconds": 60.0,
    "stop_reason": "max_minutes",
    "processes": 2,
    "averaged_checkpoints": ["checkpoint-5", "checkpoint-7"],
    "valid_loss": 4.5,
    "valid_ppl": 54.6,
    "valid_bleu": 3.21,
    "dropped": {"train": 3},
    "test": TEST,
}


def test_the_card_of_a_training_run_carries_its_measured_scores(tmp_path):
    config = TrainConfig(dataset_name="data/tatoeba_en_de", config_overrides={"d_model": 64}, max_minutes=6)
    model_config = VanillaTransformerConfig.base(vocab_size=500, d_model=64)
    path = write_model_card(tmp_path, config=config, model_config=model_config, summary=SUMMARY)
    assert path == tmp_path / "README.md"
    card = ModelCard.load(path)
    assert card.data.model_name == "vanilla-transformer-en-de" and card.data.datasets == ["tatoeba"]
    assert card.data.pipeline_tag == "translation" and "custom_code" in card.data.tags
    results = {r.metric_type: r for r in card.data.eval_results}
    assert (results["sacrebleu"].metric_value, results["chrf"].metric_value) == (12.3456, 30.5)  # exactly as measured
    assert results["sacrebleu"].metric_config == TEST["bleu_signature"] and results["sacrebleu"].dataset_split == "test"
    for text in (
        "| sacreBLEU | 12.35 |",
        "17 sentences of the `test` split",
        "1,000 steps or 6 minutes",
        "checkpoint-5, checkpoint-7",
        "× 2 data-parallel processes",
        "train 3",
        "| vocabulary | 500 tokens",
        "Measured by the training run that wrote this folder",
        "CC BY 2.0",
        "not comparable",
    ):
        assert text in card.text, text
    assert "The wall-clock budget makes the result depend on the hardware" in card.text
    steps_only = build_model_card(dataclasses.replace(config, max_minutes=None), model_config, SUMMARY)
    assert "A budget of optimizer steps, not of time" in steps_only.text and "wall-clock" not in steps_only.text


def test_without_a_test_split_or_a_model_the_card_invents_nothing():
    """training.py calls write_model_card(folder, config=, model_config=, summary=); build_model_card takes
    (config, model_config, summary) positionally. Without a test split there are no eval results; without the
    model's configuration the sizes are the preset's with the overrides, and the vocabulary is not known."""
    config = TrainConfig(
        dataset_name="somewhere/else", preset="big", config_overrides={"d_model": 256}, tokenizer_name="tok"
    )
    card = build_model_card(config, None, {"step": 3})
    assert card.data.eval_results is None and card.data.datasets is None
    assert "| (no test split was scored) | |" in card.text and "see the data's own terms" in card.text
    assert "| d_model | 256 |" in card.text and "| attention heads (encoder / decoder) | 16 / 16 |" in card.text
    assert "| vocabulary | the tokenizer `tok` |" in card.text


def test_the_architecture_table_names_every_deviation_from_the_paper():
    paper = architecture_table(VanillaTransformerConfig.base())
    assert "post-LN, as in the paper" in paper and "sinusoidal (§3.5)" in paper and "deviation" not in paper
    changed = architecture_table(
        VanillaTransformerConfig(
            norm_first=True, position_embedding_type="learned", scale_embedding=False, tie_word_embeddings=False
        )
    )
    assert changed.count("deviation") == 4


def test_the_architecture_table_shows_a_head_size_only_when_head_dim_is_set():
    assert "head size" not in architecture_table(VanillaTransformerConfig.base())  # d_model / heads, as in the paper
    table = architecture_table(VanillaTransformerConfig.base(head_dim=32))
    assert "| head size d_k = d_v | 32 (set with head_dim; the paper's is d_model / heads) |" in table
