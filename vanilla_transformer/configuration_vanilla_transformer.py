"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

This file travels to the Hub with every checkpoint (``trust_remote_code=True``): it may import
only torch, transformers, the standard library and, relatively, its sibling modeling file.

Defaults are the paper's *base* model (Table 3, row "base"). ``VanillaTransformerConfig.big()``
gives the *big* model. Anything that departs from the paper is a flag that is off by default:

* ``norm_first``: pre-LayerNorm blocks ``x + Dropout(Sublayer(LayerNorm(x)))`` plus a final
  LayerNorm on each stack, instead of the paper's post-LayerNorm ``LayerNorm(x + Dropout(Sublayer(x)))``.
* ``position_embedding_type="learned"``: learned absolute positions (the paper's Table 3 row (E)
  variant) instead of the sinusoids of §3.5.
* ``attention_dropout`` / ``activation_dropout``: dropout on attention weights / inside the FFN,
  which the paper does not use (0 by default).
* ``attention_bias=True``: biases on the attention projections W^Q, W^K, W^V and W^O, as Marian and
  fairseq have them. The paper's equations (§3.2.2) and tensor2tensor, its reference code, have none.
  A ``config.json`` saved before this field existed says nothing of it; its model had the biases, so
  loading it sets ``attention_bias=True`` (see ``from_dict``).

One more switch is not a deviation but a variation in the manner of the paper's Table 3:

* ``head_dim``: the size d_k = d_v of every attention head. Left out (``None``), it is the paper's
  rule d_k = d_v = d_model / h, and the config holds that number, as transformers' configs do (it stays
  ``None`` only when the two stacks have different head counts, each then d_model / its h); when set,
  the h heads together are h·d_k wide, which need not equal d_model: smaller (or larger) heads with h
  fixed. (Table 3's row (B) shrank d_k alone and kept d_v = 64, its 58M / 60M parameters; ``head_dim``
  sets d_k and d_v together.)
"""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig


@strict
class VanillaTransformerConfig(PreTrainedConfig):
    r"""Sizes and switches of the encoder–decoder Transformer.

    Args:
        vocab_size: size of the joint source/target vocabulary (the paper: ~37,000 BPE tokens).
        d_model: width of every sub-layer output and embedding (§3.1, d_model = 512).
        encoder_layers / decoder_layers: number of identical layers N in each stack (N = 6).
        encoder_attention_heads / decoder_attention_heads: parallel attention heads h (§3.2.2, h = 8).
        head_dim: size d_k = d_v of every attention head of both stacks. ``None`` (default): d_model / h
            (§3.2.2, 64), stored resolved, so that ``config.head_dim`` is the number (it stays ``None`` when the
            stacks' head counts differ, each stack then d_model / its own h). When set, Q, K and V project
            d_model to h·d_k and the output projection maps h·d_k back to d_model; h need not divide d_model,
            and the stacks' h may differ (not a deviation).
        encoder_ffn_dim / decoder_ffn_dim: inner size d_ff of the position-wise FFN (§3.3, 2048).
        dropout: P_drop, applied to each sub-layer output and to embeddings + positions (§5.4, 0.1).
        attention_dropout: dropout on attention probabilities (not in the paper; 0).
        activation_dropout: dropout after the FFN's ReLU (not in the paper; 0).
        attention_bias: biases on the attention projections W^Q, W^K, W^V, W^O (not in the paper's equations
            of §3.2.2 nor in tensor2tensor; Marian and fairseq have them). ``False`` by default.
        max_position_embeddings: rows of the precomputed sinusoid table, or of the learned table
            when ``position_embedding_type="learned"``. Sinusoids are computed for any position, so
            longer inputs still work with the default; learned positions cannot go past it.
        layer_norm_eps: epsilon of every LayerNorm.
        init_std: standard deviation of the token embedding initialisation (``None``: d_model**-0.5,
            which makes embeddings × √d_model unit-variance).
        scale_embedding: multiply token embeddings by √d_model (§3.4).
        tie_word_embeddings: one matrix for source embedding, target embedding and pre-softmax
            layer (§3.4).
        norm_first: pre-LN instead of the paper's post-LN (deviation, off by default).
        position_embedding_type: ``"sinusoidal"`` (§3.5) or ``"learned"`` (deviation).
        pad_token_id / bos_token_id / eos_token_id / unk_token_id / decoder_start_token_id: special
            token ids, shared with the tokenizer.
    """

    model_type = "vanilla_transformer"
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    head_dim: int | None = None
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    attention_bias: bool = False
    max_position_embeddings: int = 1024
    layer_norm_eps: float = 1e-5
    init_std: float | None = None
    scale_embedding: bool = True
    tie_word_embeddings: bool = True
    norm_first: bool = False
    position_embedding_type: str = "sinusoidal"
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    unk_token_id: int | None = 3
    decoder_start_token_id: int | None = 1

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self._check_values()
        if self.head_dim is None and self.encoder_attention_heads == self.decoder_attention_heads:
            self.head_dim = self.d_model // self.encoder_attention_heads  # d_model / h, held as the number

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> "VanillaTransformerConfig":
        """``PreTrainedConfig.from_dict``, except that a saved config (it names its ``transformers_version``)
        without ``attention_bias`` comes from before that field existed, when every attention projection had a
        bias: it loads with ``attention_bias=True``, so that its checkpoint's biases are used, not dropped."""
        if "transformers_version" in config_dict and "attention_bias" not in config_dict:
            config_dict = {**config_dict, "attention_bias": True}
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_json_file(cls, json_file) -> "VanillaTransformerConfig":
        """``PreTrainedConfig.from_json_file`` through :meth:`from_dict` (transformers' builds the class directly),
        so that a ``config.json`` from before ``attention_bias`` existed loads with its biases here too."""
        return cls.from_dict(cls._dict_from_json_file(json_file))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs) -> "VanillaTransformerConfig":
        """``PreTrainedConfig.from_pretrained``, except that a ``config.json`` of another ``model_type``
        is an error (transformers only warns, then builds this model from foreign settings)."""
        config_dict, _ = cls.get_config_dict(pretrained_model_name_or_path, **dict(kwargs))
        found = config_dict.get("model_type")
        if found is not None and found != cls.model_type:
            raise ValueError(
                f"{pretrained_model_name_or_path} holds a config.json of model_type '{found}', not "
                f"'{cls.model_type}': it is not a checkpoint of this model. Load it with the classes of "
                f"'{found}' (e.g. AutoModelForSeq2SeqLM), or point to a folder saved by this package."
            )
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    # ------------------------------------------------------------------ presets (Table 3)
    @classmethod
    def base(cls, **overrides) -> "VanillaTransformerConfig":
        """Transformer (base): N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (Table 3)."""
        values = dict(
            d_model=512,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            encoder_ffn_dim=2048,
            decoder_ffn_dim=2048,
            dropout=0.1,
        )
        return cls(**{**values, **overrides})

    @classmethod
    def big(cls, **overrides) -> "VanillaTransformerConfig":
        """Transformer (big): N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (Table 3)."""
        values = dict(
            d_model=1024,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=16,
            decoder_attention_heads=16,
            encoder_ffn_dim=4096,
            decoder_ffn_dim=4096,
            dropout=0.3,
        )
        return cls(**{**values, **overrides})

    # ------------------------------------------------------------------ validation
    def _check_values(self) -> None:
        """Raise a ``ValueError`` naming the field and the rule it breaks."""

        def fail(field: str, rule: str, fix: str) -> None:
            raise ValueError(
                f"VanillaTransformerConfig: `{field}` = {getattr(self, field)!r} is invalid: {rule}. {fix}"
            )

        sizes = (
            "vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
        )
        for field in sizes:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                fail(field, f"it must be an int, got {type(value).__name__}", "Pass a whole number such as 512.")
            if value <= 0:
                fail(field, "it must be a positive integer", "Use a size of at least 1.")
        if self.head_dim is not None:  # d_k = d_v; None: d_model / heads
            if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool):
                fail(
                    "head_dim",
                    f"it must be an int or None, got {type(self.head_dim).__name__}",
                    "Pass a whole number such as 64, or None for d_model / heads.",
                )
            if self.head_dim <= 0:
                fail(
                    "head_dim",
                    "it must be a positive integer or None",
                    "Use a head size of at least 1, or None for d_model / heads.",
                )
        for field in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.head_dim is None and self.d_model % getattr(self, field) != 0:
                fail(
                    field,
                    f"d_model ({self.d_model}) must be divisible by the number of heads when head_dim is None "
                    f"(d_k = d_model / h)",
                    "Choose a head count that divides d_model (the paper: d_model=512 with 8 heads), or set head_dim.",
                )
        for field in ("dropout", "attention_dropout", "activation_dropout", "layer_norm_eps"):
            if not isinstance(getattr(self, field), (int, float)) or isinstance(getattr(self, field), bool):
                fail(field, "it must be a number", "Pass a float such as 0.1.")
        for field in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, field) < 1.0:
                fail(field, "a dropout probability must lie in [0, 1)", "The paper uses 0.1 (base) or 0.3 (big).")
        if self.layer_norm_eps <= 0:
            fail("layer_norm_eps", "it must be > 0", "The default is 1e-5.")
        if self.init_std is not None and self.init_std <= 0:
            fail("init_std", "it must be > 0 or None", "Use None for d_model**-0.5.")
        if self.position_embedding_type not in ("sinusoidal", "learned"):
            fail("position_embedding_type", "it must be 'sinusoidal' (the paper) or 'learned'", "")
        for field in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id", "decoder_start_token_id"):
            value = getattr(self, field)
            if value is not None and not 0 <= value < self.vocab_size:
                fail(
                    field,
                    f"a token id must lie in [0, vocab_size={self.vocab_size})",
                    "Use the tokenizer's id for this token and a vocab_size at least len(tokenizer).",
                )
        if self.pad_token_id is None:
            fail(
                "pad_token_id", "the model pads batches and shifts labels with it", "Set it to the tokenizer's pad id."
            )
        if self.decoder_start_token_id is None:
            fail(
                "decoder_start_token_id",
                "generation starts every target with it",
                "Set it to the tokenizer's bos id (or eos, as Marian does).",
            )


__all__ = ["VanillaTransformerConfig"]
