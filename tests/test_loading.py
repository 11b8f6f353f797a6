"""Models and tokenizers: presets of Table 3, fresh models that fit their tokenizer, saved folders."""

import pytest
import torch
from conftest import SENTENCES

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.loading import (
    load_model,
    load_model_and_tokenizer,
    load_tokenizer,
    new_model,
    preset_config,
)
from vanilla_transformer.tokenization import train_joint_bpe
from vanilla_transformer.training_config import PRESETS

TINY = {
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}


def test_presets_are_the_configurations_of_table_3_with_overrides():
    assert PRESETS == ("base", "big")
    assert preset_config("base").to_dict() == VanillaTransformerConfig.base().to_dict()
    big = preset_config("big", d_model=512, dropout=0.2)
    assert (big.d_model, big.dropout, big.encoder_ffn_dim) == (512, 0.2, VanillaTransformerConfig.big().encoder_ffn_dim)
    with pytest.raises(ValueError, match="preset must be one of 'base', 'big', got 'huge'"):
        preset_config("huge")


def test_a_new_model_takes_its_vocabulary_and_special_ids_from_the_tokenizer(sentence_tokenizer):
    model = new_model("base", sentence_tokenizer, **TINY)
    assert model.config.vocab_size == len(sentence_tokenizer) and model.config.d_model == 32
    ids = (
        sentence_tokenizer.pad_token_id,
        sentence_tokenizer.bos_token_id,
        sentence_tokenizer.eos_token_id,
        sentence_tokenizer.bos_token_id,
    )
    assert (
        model.config.pad_token_id,
        model.config.bos_token_id,
        model.config.eos_token_id,
        model.config.decoder_start_token_id,
    ) == ids
    with pytest.raises(ValueError, match="Tokenizer and model config do not match"):
        new_model(
            "base", sentence_tokenizer, vocab_size=100, **TINY
        )  # a vocabulary smaller than the sentence_tokenizer's


def test_a_saved_folder_loads_in_eval_mode_with_its_tokenizer(saved, sentence_tokenizer):
    model, loaded = load_model_and_tokenizer(saved)
    assert isinstance(model, VanillaTransformerForConditionalGeneration) and not model.training
    assert loaded.get_vocab() == sentence_tokenizer.get_vocab()
    reference = VanillaTransformerForConditionalGeneration.from_pretrained(saved)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    eager, _ = load_model_and_tokenizer(saved, attn_implementation="eager", device="cpu")
    assert eager.config._attn_implementation == "eager" and next(eager.parameters()).device.type == "cpu"


def test_the_tokenizer_may_come_from_another_folder(saved, sentence_tokenizer, tmp_path):
    load_model(saved).save_pretrained(tmp_path / "model")  # a model folder without a tokenizer
    with pytest.raises(ValueError, match="No tokenizer.json in .*model'"):
        load_model_and_tokenizer(tmp_path / "model")
    model, loaded = load_model_and_tokenizer(tmp_path / "model", tokenizer=saved)
    assert len(loaded) == len(sentence_tokenizer) == model.config.vocab_size


def test_what_is_not_a_saved_model_or_a_fitting_tokenizer_is_refused(saved, tmp_path):
    with pytest.raises(ValueError, match="is not a saved model folder .no config.json in it."):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="No tokenizer.json"):
        load_tokenizer(tmp_path)
    other = train_joint_bpe(SENTENCES * 3 + ["Völlig andere Wörter hier."] * 3, vocab_size=400)
    other.save_pretrained(tmp_path / "other")
    assert len(other) > len(load_tokenizer(saved))
    with pytest.raises(ValueError, match="Tokenizer and model config do not match"):
        load_model_and_tokenizer(saved, tokenizer=tmp_path / "other")
