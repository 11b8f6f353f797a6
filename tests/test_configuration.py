import json

import pytest

from vanilla_transformer import VanillaTransformerConfig


def test_base_and_big_presets_match_table_3():
    base, big = VanillaTransformerConfig.base(), VanillaTransformerConfig.big()
    assert (base.d_model, base.encoder_ffn_dim, base.encoder_attention_heads, base.dropout) == (512, 2048, 8, 0.1)
    assert (big.d_model, big.decoder_ffn_dim, big.decoder_attention_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert base.encoder_layers == base.decoder_layers == big.encoder_layers == big.decoder_layers == 6
    assert VanillaTransformerConfig.big(dropout=0.1).dropout == 0.1  # overrides win


def test_paper_defaults_and_deviation_flags_off():
    config = VanillaTransformerConfig()
    assert config.model_type == "vanilla_transformer"
    assert config.is_encoder_decoder and config.tie_word_embeddings and config.scale_embedding and config.use_cache
    assert not config.norm_first and config.position_embedding_type == "sinusoidal"
    assert config.attention_dropout == 0.0 and config.activation_dropout == 0.0
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (512, 8, 6)


def test_round_trip_through_json(tmp_path):
    config = VanillaTransformerConfig.big(vocab_size=1234, norm_first=True, position_embedding_type="learned")
    config.save_pretrained(tmp_path)
    loaded = VanillaTransformerConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        (dict(d_model=100), "encoder_attention_heads", "divisible"),
        (dict(decoder_attention_heads=3), "decoder_attention_heads", "divisible"),
        (dict(encoder_layers=-1), "encoder_layers", "positive"),
        (dict(vocab_size=0), "vocab_size", "positive"),
        (dict(dropout=1.0), "dropout", "[0, 1)"),
        (dict(attention_dropout=-0.1), "attention_dropout", "[0, 1)"),
        (dict(pad_token_id=37000), "pad_token_id", "vocab_size=37000"),
        (dict(vocab_size=10, eos_token_id=10), "eos_token_id", "vocab_size=10"),
        (dict(position_embedding_type="rotary"), "position_embedding_type", "sinusoidal"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps", "> 0"),
    ],
)
def test_invalid_values_name_field_and_rule(overrides, field, words):
    with pytest.raises(ValueError) as error:
        VanillaTransformerConfig(**overrides)
    assert f"`{field}`" in str(error.value) and words in str(error.value)


def test_wrong_types_are_rejected_with_the_field_name():
    # transformers' @strict dataclass validation checks field types before our value rules run.
    with pytest.raises(Exception, match="d_model.*expected int"):
        VanillaTransformerConfig(d_model="512")


# ------------------------------------------------------------------ head_dim: d_k = d_v apart from d_model / h
def test_head_dim_left_out_is_the_papers_d_model_over_h_held_as_a_number():
    """As transformers' configs with a head_dim: the resolved int, which its generic tests and caches read."""
    assert VanillaTransformerConfig().head_dim == 64
    assert VanillaTransformerConfig.base().head_dim == 64 and VanillaTransformerConfig.big().head_dim == 64
    assert VanillaTransformerConfig(d_model=32, encoder_attention_heads=4, decoder_attention_heads=4).head_dim == 8
    # different head counts: each stack's heads are d_model / its h, which one number cannot say
    assert VanillaTransformerConfig(d_model=32, encoder_attention_heads=4, decoder_attention_heads=8).head_dim is None


@pytest.mark.parametrize("value, words", [(0, "positive integer or None"), (-8, "positive integer or None")])
def test_head_dim_must_be_positive(value, words):
    with pytest.raises(ValueError) as error:
        VanillaTransformerConfig(head_dim=value)
    assert "`head_dim`" in str(error.value) and words in str(error.value)


@pytest.mark.parametrize("value", [True, 16.0, "16"])
def test_head_dim_must_be_an_int(value):
    # transformers' @strict validation refuses the type first (a bool is not taken for an int either)
    with pytest.raises(Exception, match="head_dim.*expected int"):
        VanillaTransformerConfig(head_dim=value)


def test_head_dim_lifts_the_rule_that_heads_divide_d_model():
    with pytest.raises(ValueError, match="`encoder_attention_heads` = 3 is invalid.*divisible.*or set head_dim"):
        VanillaTransformerConfig(d_model=32, encoder_attention_heads=3, decoder_attention_heads=4)
    config = VanillaTransformerConfig(d_model=32, encoder_attention_heads=3, decoder_attention_heads=5, head_dim=12)
    assert (config.encoder_attention_heads, config.decoder_attention_heads, config.head_dim) == (3, 5, 12)


def test_head_dim_survives_a_round_trip_and_old_config_files_load_without_it(tmp_path):
    config = VanillaTransformerConfig(d_model=32, encoder_attention_heads=3, decoder_attention_heads=3, head_dim=12)
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["head_dim"] == 12
    loaded = VanillaTransformerConfig.from_pretrained(tmp_path)
    assert loaded.head_dim == 12 and loaded.to_dict() == config.to_dict()
    # a config.json written before the field existed: the paper's rule, as before
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["head_dim"]
    saved["encoder_attention_heads"] = saved["decoder_attention_heads"] = 4
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert VanillaTransformerConfig.from_pretrained(tmp_path).head_dim == 32 // 4
    saved["head_dim"] = None  # written when None meant d_model / h: the same rule
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert VanillaTransformerConfig.from_pretrained(tmp_path).head_dim == 32 // 4
