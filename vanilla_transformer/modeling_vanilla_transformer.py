"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers 5 model.

Read top to bottom, this file follows the paper:

    §3.5   positional encoding            -> sinusoidal_position_encoding,
                                             VanillaTransformerSinusoidalPositionalEncoding
    §3.2.1 scaled dot-product attention   -> eager_attention_forward (or SDPA through ALL_ATTENTION_FUNCTIONS)
    §3.2.2 multi-head attention           -> VanillaTransformerAttention
    §3.3   position-wise feed-forward     -> VanillaTransformerFeedForward
    §3.1   encoder and decoder layers     -> VanillaTransformerEncoderLayer, VanillaTransformerDecoderLayer
           (each sub-layer: LayerNorm(x + Dropout(Sublayer(x))), §3.1 and §5.4)
    §3.1   encoder and decoder stacks     -> VanillaTransformerEncoder, VanillaTransformerDecoder
    §3.4   shared embeddings × √d_model   -> VanillaTransformerModel (one matrix, `shared`)
    §3.4   pre-softmax linear layer, tied -> VanillaTransformerForConditionalGeneration.lm_head
    §6.1   at most source length + 50     -> VanillaTransformerSourceLengthLimit, `generate`
    §6.1   beam 4, α 0.6                  -> PAPER_DECODING (the package's checkpoints' generation_config.json)

Then the transformers plumbing: input checks, label shifting, outputs. Hidden states and attention weights
are recorded as transformers' own models record them (``_can_record_outputs``, ``capture_outputs``), and
keyword arguments (``TransformersKwargs``) pass through every layer to the attention function.

Speed lives beside this file, behind named calls: ``kernels_vanilla_transformer.py`` (dropout on CPUs,
the block-wise label-smoothed loss) and ``generation_vanilla_transformer.py`` (the in-place beam search the
model class inherits, and ``attention_for_grouped_beams``, the one hook in the attention below, taken only
when the beam search passes ``beams_per_encoder_row``). Each equals the plain expression named in its
docstring, and the beam search runs only where it was tested.

This file travels to the Hub with every checkpoint (``trust_remote_code=True``): it imports only torch,
transformers, the standard library and, relatively, its siblings. Layout and attribute names follow
transformers' Marian model (``q_proj``, ``self_attn``, ``encoder_attn``, ``fc1``, ``final_layer_norm``,
``embed_tokens``, ``lm_head`` ...), so that the library's machinery (weight tying, attention dispatch,
gradient checkpointing, ``generate``) works unmodified.
"""

import contextlib
import contextvars
import copy
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation.logits_process import LogitsProcessorList
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .generation_vanilla_transformer import (
    InPlaceLogitsProcessor,
    VanillaTransformerGenerationMixin,
    attention_for_grouped_beams,
    checked_length_penalty_form,
)
from .kernels_vanilla_transformer import apply_dropout, dropout_add, linear_cross_entropy_sums

logger = logging.get_logger(__name__)


# --------------------------------------------------------------------------------------------
# §3.5 Positional encoding
# --------------------------------------------------------------------------------------------
def sinusoidal_position_encoding(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Sines fill the even dimensions and cosines the odd ones (interleaved, as in the paper; Marian
    and fairseq put all sines first). Computed in float64 so that large positions stay exact in float32.
    Returns a float32 tensor of shape ``[len(positions), d_model]``.
    """
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device)
    angles = positions.to(torch.float64)[:, None] / torch.pow(10000.0, two_i / d_model)[None, :]
    pe = torch.zeros(positions.shape[0], d_model, dtype=torch.float64, device=positions.device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.to(torch.float32)


class VanillaTransformerSinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoids (§3.5), precomputed for ``max_position_embeddings`` positions.

    Positions past the table are computed on the fly, so any input length works (the paper chose
    sinusoids because they "may allow the model to extrapolate to sequence lengths longer than the
    ones encountered during training"). The table is a non-persistent buffer: it is not saved in
    checkpoints and ``_init_weights`` recomputes it after ``from_pretrained``.
    """

    def __init__(self, num_positions: int, d_model: int):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("pe", sinusoidal_position_encoding(torch.arange(num_positions), d_model), persistent=False)

    def forward(self, seq_len: int, past_len: int | torch.Tensor = 0) -> torch.Tensor:
        """Encodings of positions ``past_len … past_len + seq_len - 1``: shape ``[seq_len, d_model]``.
        (A static cache gives ``past_len`` as a tensor: the encodings are then computed, not looked up.)"""
        if isinstance(past_len, int) and past_len + seq_len <= self.pe.shape[0]:
            return self.pe[past_len : past_len + seq_len]
        positions = torch.arange(seq_len, device=self.pe.device) + past_len
        return sinusoidal_position_encoding(positions, self.d_model).to(self.pe.dtype)


class VanillaTransformerLearnedPositionalEmbedding(nn.Embedding):
    """Learned absolute positions (deviation: Table 3 row (E)); limited to ``max_position_embeddings``."""

    def forward(self, seq_len: int, past_len: int | torch.Tensor = 0) -> torch.Tensor:
        if isinstance(past_len, int) and past_len + seq_len > self.num_embeddings:
            raise ValueError(
                f"Sequence of {past_len + seq_len} positions is longer than "
                f"max_position_embeddings={self.num_embeddings} "
                f"of this model's learned positions. Shorten or split the input; sinusoidal positions "
                f"(position_embedding_type='sinusoidal') have no such limit."
            )
        return F.embedding(torch.arange(seq_len, device=self.weight.device) + past_len, self.weight)


# --------------------------------------------------------------------------------------------
# §3.2.1 Scaled dot-product attention:  softmax(Q Kᵀ / √d_k) V
# --------------------------------------------------------------------------------------------
def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,  # [B, H, T_q, d_k]
    key: torch.Tensor,  # [B, H, T_k, d_k]
    value: torch.Tensor,  # [B, H, T_k, d_v]
    attention_mask: torch.Tensor | None,  # [B, 1, T_q, T_k]: additive float (eager's), or True where allowed (SDPA's)
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference implementation, which also returns the attention weights (``output_attentions``, pictures).

    It takes the masks every backend is given, so that it can stand in for SDPA when weights are asked for: an
    additive float mask, a boolean one, or none, which for decoder self-attention (``module.is_causal``) means
    the causal mask, as SDPA reads it."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [B, H, T_q, T_k]
    q_len, k_len = scores.shape[-2:]
    if attention_mask is None and getattr(module, "is_causal", False) and q_len > 1:
        attention_mask = torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).tril(k_len - q_len)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = apply_dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value)  # [B, H, T_q, d_v]
    return output.transpose(1, 2).contiguous(), weights  # [B, T_q, H, d_v]


# --------------------------------------------------------------------------------------------
# §3.2.2 Multi-head attention:  Concat(head_1, …, head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
# --------------------------------------------------------------------------------------------
def attention_head_size(config: VanillaTransformerConfig, num_heads: int) -> int:
    """d_k = d_v of one head: ``config.head_dim`` (d_model / h unless set), or d_model / h of this stack when the
    stacks' head counts differ and ``head_dim`` was left out."""
    return config.head_dim or config.d_model // num_heads


class VanillaTransformerAttention(nn.Module):
    """Multi-head attention used three ways (§3.2.3): encoder self-attention, masked decoder
    self-attention (``is_causal=True``) and encoder–decoder attention (``key_value_states`` given).

    The h per-head projections W_i^Q, W_i^K, W_i^V (each d_model × d_k) are stored side by side as one
    ``d_model × h·d_k`` matrix each for Q, K, V, and W^O as one ``h·d_k × d_model`` matrix. With the
    paper's d_k = d_v = d_model / h (``config.head_dim``) all four are ``d_model × d_model``. As in the
    paper's equations and tensor2tensor, they are matrices alone, without biases; ``config.attention_bias``
    adds them, as Marian and fairseq have them.
    """

    def __init__(self, config: VanillaTransformerConfig, num_heads: int, is_causal: bool = False, layer_idx: int = 0):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = attention_head_size(config, num_heads)  # d_k = d_v (the paper: d_model / h)
        self.scaling = self.head_dim**-0.5  # 1 / √d_k
        self.dropout = config.attention_dropout
        # SDPA reads this attribute when it gets no mask; it must be False outside decoder self-attention.
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        heads_width = num_heads * self.head_dim  # h·d_k: d_model in the paper
        bias = config.attention_bias  # the paper: none
        self.q_proj = nn.Linear(config.d_model, heads_width, bias=bias)  # W^Q
        self.k_proj = nn.Linear(config.d_model, heads_width, bias=bias)  # W^K
        self.v_proj = nn.Linear(config.d_model, heads_width, bias=bias)  # W^V
        self.out_proj = nn.Linear(heads_width, config.d_model, bias=bias)  # W^O

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, T_q, d_model]
        key_value_states: torch.Tensor | None = None,  # encoder output [B, T_k, d_model] for cross-attention
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        beams_per_encoder_row: int = 1,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        r"""
        beams_per_encoder_row: in encoder–decoder attention, how many consecutive rows of ``hidden_states`` (a
            sentence's beams) share one row of ``key_value_states`` (the sentence's encoder output); the beam
            search of ``generation_vanilla_transformer.py`` passes its beam count. 1: one row each.
        """
        is_cross_attention = key_value_states is not None
        batch, q_len = hidden_states.shape[:2]
        query = self.q_proj(hidden_states).view(batch, q_len, -1, self.head_dim).transpose(1, 2)  # [B, H, T_q, d_k]

        # Key/value cache: decoder self-attention appends this step's K,V; cross-attention projects the
        # encoder output once (first decoding step) and reuses it afterwards.
        layer_cache, cross_ready = None, False
        if cache is not None:
            if isinstance(cache, EncoderDecoderCache):
                cross_ready = is_cross_attention and cache.is_updated.get(self.layer_idx, False)
                layer_cache = cache.cross_attention_cache if is_cross_attention else cache.self_attention_cache
            else:
                layer_cache = cache
        if cross_ready:
            key = layer_cache.layers[self.layer_idx].keys
            value = layer_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross_attention else hidden_states
            kv_shape = (*source.shape[:2], -1, self.head_dim)
            key = self.k_proj(source).view(kv_shape).transpose(1, 2)  # [B, H, T_k, d_k]
            value = self.v_proj(source).view(kv_shape).transpose(1, 2)  # [B, H, T_k, d_v]
            if layer_cache is not None:
                key, value = layer_cache.update(key, value, self.layer_idx)
                if is_cross_attention and isinstance(cache, EncoderDecoderCache):
                    cache.is_updated[self.layer_idx] = True

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if kwargs.get("output_attentions"):  # the weights asked for exist only in the eager computation
            attention_interface = eager_attention_forward
        if is_cross_attention and beams_per_encoder_row > 1:  # the fast-path hook (generation_vanilla_transformer)
            attention_interface = partial(attention_for_grouped_beams, attention_interface, beams_per_encoder_row)
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = output.reshape(batch, q_len, -1).contiguous()  # Concat(head_1, …, head_h): [B, T_q, h·d_v]
        return self.out_proj(output), weights  # · W^O


# --------------------------------------------------------------------------------------------
# §3.3 Position-wise feed-forward network:  FFN(x) = max(0, x W_1 + b_1) W_2 + b_2
# --------------------------------------------------------------------------------------------
class VanillaTransformerFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, activation_dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.activation_dropout = activation_dropout  # not in the paper; 0 by default

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = F.relu(self.fc1(hidden_states))  # [B, T, d_ff]
        hidden_states = apply_dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)  # [B, T, d_model]


# --------------------------------------------------------------------------------------------
# §3.1 Encoder and decoder layers. Each sub-layer is wrapped as LayerNorm(x + Dropout(Sublayer(x)))
# (post-LN, §3.1 + §5.4 "Residual Dropout"); norm_first=True gives x + Dropout(Sublayer(LayerNorm(x))).
# --------------------------------------------------------------------------------------------
class VanillaTransformerLayer(GradientCheckpointingLayer):
    """What encoder and decoder layers share: the residual connection around each sub-layer."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.norm_first = config.norm_first
        self.dropout = config.dropout

    def _sublayer_input(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        return norm(x) if self.norm_first else x

    def _residual(self, x: torch.Tensor, sublayer_output: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """LayerNorm(x + Dropout(Sublayer(x))), or x + Dropout(Sublayer(LayerNorm(x))) with norm_first."""
        x = dropout_add(x, sublayer_output, p=self.dropout, training=self.training)
        return x if self.norm_first else norm(x)


class VanillaTransformerEncoderLayer(VanillaTransformerLayer):
    """Self-attention, then feed-forward."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int = 0):
        super().__init__(config)
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config.d_model, config.encoder_ffn_dim, config.activation_dropout)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        x = self._sublayer_input(hidden_states, self.self_attn_layer_norm)
        attn_output, _ = self.self_attn(x, attention_mask=attention_mask, **kwargs)
        hidden_states = self._residual(hidden_states, attn_output, self.self_attn_layer_norm)

        x = self._sublayer_input(hidden_states, self.final_layer_norm)
        return self._residual(hidden_states, self.ffn(x), self.final_layer_norm)


class VanillaTransformerDecoderLayer(VanillaTransformerLayer):
    """Masked self-attention, then encoder–decoder attention, then feed-forward."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int = 0):
        super().__init__(config)
        heads = config.decoder_attention_heads
        self.self_attn = VanillaTransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VanillaTransformerAttention(config, heads, is_causal=False, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config.d_model, config.decoder_ffn_dim, config.activation_dropout)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,  # positional, for gradient checkpointing
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        beams_per_encoder_row: int = 1,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        x = self._sublayer_input(hidden_states, self.self_attn_layer_norm)
        attn_output, _ = self.self_attn(x, attention_mask=attention_mask, cache=cache, **kwargs)
        hidden_states = self._residual(hidden_states, attn_output, self.self_attn_layer_norm)

        x = self._sublayer_input(hidden_states, self.encoder_attn_layer_norm)
        attn_output, _ = self.encoder_attn(
            x,
            key_value_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            cache=cache,
            beams_per_encoder_row=beams_per_encoder_row,
            **kwargs,
        )
        hidden_states = self._residual(hidden_states, attn_output, self.encoder_attn_layer_norm)

        x = self._sublayer_input(hidden_states, self.final_layer_norm)
        return self._residual(hidden_states, self.ffn(x), self.final_layer_norm)


# --------------------------------------------------------------------------------------------
# The base class: initialisation and the flags transformers reads.
# --------------------------------------------------------------------------------------------
class VanillaTransformerPreTrainedModel(PreTrainedModel):
    """Initialisation and the flags transformers reads."""

    config: VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True  # checked on CPU against eager (tests/test_modeling.py)
    _can_compile_fullgraph = True  # static cache; one graph under torch.compile(fullgraph=True) (tested)
    # flash attention: not declared until it has been checked on a GPU (docs/transformers.md).

    def _init_weights(self, module: nn.Module) -> None:
        """The paper gives no initialisation; we use the common choice of its reference code
        (tensor2tensor, fairseq): Xavier-uniform linear layers with zero biases, and token embeddings
        ~ N(0, d_model^-0.5) so that embeddings × √d_model have unit variance.

        Constant tensors (the sinusoid table) are recomputed here: ``from_pretrained`` leaves
        non-persistent buffers uninitialised and relies on this method to fill them.
        """
        std = self.config.init_std if self.config.init_std is not None else self.config.d_model**-0.5
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, VanillaTransformerSinusoidalPositionalEncoding):
            init.copy_(module.pe, sinusoidal_position_encoding(torch.arange(module.pe.shape[0]), module.d_model))


# --------------------------------------------------------------------------------------------
# §3.1 The two stacks. Inputs: embeddings × √d_model (§3.4) + positions (§3.5), then dropout (§5.4).
# Hidden states and attention weights are recorded as transformers' models record them (`_can_record_outputs`).
# --------------------------------------------------------------------------------------------
def position_encoding_for(config: VanillaTransformerConfig) -> nn.Module:
    """The sinusoids of §3.5, or learned positions (``position_embedding_type="learned"``)."""
    if config.position_embedding_type == "learned":
        return VanillaTransformerLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
    return VanillaTransformerSinusoidalPositionalEncoding(config.max_position_embeddings, config.d_model)


class VanillaTransformerEncoder(VanillaTransformerPreTrainedModel):
    """N identical layers of bidirectional self-attention + FFN."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = position_encoding_for(config)
        self.layers = nn.ModuleList(VanillaTransformerEncoderLayer(config, i) for i in range(config.encoder_layers))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of `input_ids` or `inputs_embeds` to the encoder.")
        if input_ids is not None:
            _check_ids("input_ids", input_ids, self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)  # [B, S, d_model]
        elif inputs_embeds.shape[0] * inputs_embeds.shape[1] == 0:
            raise ValueError(f"`inputs_embeds` is empty (shape {tuple(inputs_embeds.shape)}).")
        _check_mask("attention_mask", attention_mask, inputs_embeds.shape[:2])
        _check_flex_head_size(self.config, inputs_embeds.device)

        positions = self.embed_positions(inputs_embeds.shape[1])  # [S, d_model]
        hidden_states = inputs_embeds * self.embed_scale + positions.to(inputs_embeds.dtype)
        hidden_states = apply_dropout(hidden_states, p=self.config.dropout, training=self.training)

        # Padding mask only (the encoder is not causal); None when nothing is padded (SDPA fast path).
        mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            allow_is_bidirectional_skip=attention_mask is None,  # a given mask is used, not read (a device sync)
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(VanillaTransformerPreTrainedModel):
    """N identical layers of masked self-attention + encoder–decoder attention + FFN."""

    _can_record_outputs = {
        "hidden_states": OutputRecorder(VanillaTransformerDecoderLayer, num_hidden_layers_key="decoder_layers"),
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = position_encoding_for(config)
        self.layers = nn.ModuleList(VanillaTransformerDecoderLayer(config, i) for i in range(config.decoder_layers))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of `decoder_input_ids` or `decoder_inputs_embeds` to the decoder.")
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` (the encoder's output).")
        if input_ids is not None:
            _check_ids("decoder_input_ids", input_ids, self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)  # [B, T, d_model]
        batch, seq_len = inputs_embeds.shape[:2]
        _check_flex_head_size(self.config, inputs_embeds.device)
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        # An int, or a tensor for a static cache, whose mask generate() prepares before the call (4-D, as is).
        past_len = cache.get_seq_length() if cache is not None else 0
        mask_2d = attention_mask is not None and attention_mask.dim() == 2
        prepared = attention_mask is not None and attention_mask.dim() == 4
        if attention_mask is not None and not prepared and isinstance(past_len, int):
            if (
                not mask_2d
                or attention_mask.shape[0] != batch
                or attention_mask.shape[1] not in (seq_len, past_len + seq_len)
            ):
                _check_mask("decoder_attention_mask", attention_mask, torch.Size((batch, past_len + seq_len)))

        positions = self.embed_positions(seq_len, past_len)  # positions continue after the cached ones
        hidden_states = inputs_embeds * self.embed_scale + positions.to(inputs_embeds.dtype)
        hidden_states = apply_dropout(hidden_states, p=self.config.dropout, training=self.training)

        if mask_2d and attention_mask.shape[1] == seq_len and isinstance(past_len, int) and past_len:
            attention_mask = F.pad(attention_mask, (past_len, 0), value=1)
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        # §3.2.3: mask out (set to -inf) attention to subsequent positions, plus target padding.
        # A given mask is used as it is: deciding whether it could be skipped would read it back from the device.
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            cache=self_cache,
            allow_is_causal_skip=attention_mask is None,
        )
        cross_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
            allow_is_bidirectional_skip=encoder_attention_mask is None,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,
                encoder_attention_mask=cross_mask,
                cache=cache,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, cache=cache if use_cache else None
        )


# --------------------------------------------------------------------------------------------
# §3.4 The encoder–decoder with one embedding matrix shared by source and target.
# --------------------------------------------------------------------------------------------
class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """Encoder–decoder returning the decoder's last hidden states (no output layer)."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        # Tied (§3.4), `shared` is the one matrix behind both stacks' embed_tokens (and the output layer).
        # Untied (tie_word_embeddings=False), each stack keeps its own matrix and nothing is shared.
        self.shared = nn.Embedding(config.vocab_size, config.d_model) if config.tie_word_embeddings else None
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared if self.shared is not None else self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Tied: the shared matrix of both stacks. Untied: the source embedding (the decoder keeps its own)."""
        if self.shared is not None:
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    @can_return_tuple  # return_dict=False (argument or config): the output's to_tuple(), as every transformers model
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                return_dict=True,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):  # a tuple, as return_dict=False gives it
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        encoder_hidden = encoder_outputs.last_hidden_state
        _check_mask("attention_mask", attention_mask, encoder_hidden.shape[:2])

        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_hidden,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            # whatever config.return_dict says: this forward's own output is what can_return_tuple turns
            return_dict=True,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_hidden,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# --------------------------------------------------------------------------------------------
# §3.4 The pre-softmax linear layer, tied to the shared embedding; the loss (§5.4); decoding (§6.1).
# --------------------------------------------------------------------------------------------
class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, VanillaTransformerGenerationMixin):
    """The encoder–decoder plus the pre-softmax linear layer, tied to the shared embedding (§3.4).

    ``labels`` → mean cross-entropy over positions whose label is not -100 (decoder inputs are the
    labels shifted right), label-smoothed (§5.4) when ``smoothing`` is given (the training command
    does so, and so does the package's ``TranslationSeq2SeqTrainer`` in training, with ``skip_logits``).
    The model keeps no state between calls: a training loop that wants the loss's logits kept in one
    place from step to step passes its own ``loss_workspace``.
    """

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
    # The loss honours `num_items_in_batch` (gradient accumulation in transformers' Trainer).
    accepts_loss_kwargs = True

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # transformers' decoding defaults, plus the paper's per-sentence length limit (§6.1, see `generate`),
        # saved to generation_config.json. The paper's beam 4 and α 0.6 (PAPER_DECODING) are the package's
        # checkpoints' own: they travel in their generation_config.json, as a checkpoint's decoding settings do.
        token_ids = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
        self.generation_config = GenerationConfig(
            **{name: getattr(config, name) for name in token_ids},
            source_length_offset=SOURCE_LENGTH_OFFSET,
            length_penalty_form=LENGTH_PENALTY_FORM,
        )

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Used by ``DataCollatorForSeq2Seq(model=...)`` to add ``decoder_input_ids`` to batches."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        smoothing: float = 0.0,
        skip_logits: bool = False,
        loss_workspace: dict | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> "VanillaTransformerSeq2SeqLMOutput":
        r"""
        labels: target ids (-100 = ignored); the loss is their cross-entropy, averaged over the
            non-ignored tokens, or summed and divided by ``num_items_in_batch`` when it is given
            (how transformers' Trainer normalises over gradient-accumulation steps).
        smoothing: the label smoothing ε_ls of §5.4 for the loss; ``nll_loss`` is then the unsmoothed
            loss. (Not named ``label_smoothing``: transformers' Trainer takes every ``forward`` argument
            whose name contains "label" for a label column.)
        skip_logits: with ``labels``, compute the same loss and gradients without the logits, block by
            block (``linear_cross_entropy_sums``): less memory and time. The training command uses it.
        loss_workspace: with ``skip_logits``, a dict the caller keeps from step to step, in which the loss keeps
            the logits between its forward and backward passes (instead of computing them twice) and reuses
            that memory at every step. The model holds none itself.
        """
        if skip_logits and labels is None:
            raise ValueError(
                "skip_logits=True needs `labels`: without them there is no loss to compute instead of the logits."
            )
        if labels is not None:
            _check_ids("labels", labels, self.config.vocab_size, allow=-100)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )
        hidden = outputs.last_hidden_state  # [B, T, d_model]
        logits = loss = nll_loss = None
        if labels is not None and labels.shape != hidden.shape[:2]:
            raise ValueError(
                f"`labels` has shape {tuple(labels.shape)} but the decoder produced {tuple(hidden.shape[:2])} "
                f"positions; `labels` and `decoder_input_ids` must have the same shape."
            )
        if not skip_logits:
            logits = self.lm_head(hidden)  # [B, T, vocab]; softmax is left to the loss / generate
        if labels is not None:
            labels = labels.to(hidden.device)
            if skip_logits:  # fast path: the same sums without the logits (kernels_vanilla_transformer)
                smoothed, nll = linear_cross_entropy_sums(
                    hidden, self.lm_head.weight, labels, smoothing, workspace=loss_workspace
                )
            else:
                flat_logits, flat_labels = logits.float().flatten(0, 1), labels.flatten()
                smoothed = F.cross_entropy(
                    flat_logits, flat_labels, ignore_index=-100, label_smoothing=smoothing, reduction="sum"
                )
                with torch.no_grad():
                    nll = (
                        F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum")
                        if smoothing
                        else smoothed
                    )
            if num_items_in_batch is None:  # the mean over target tokens, as F.cross_entropy's default
                num_items_in_batch = (labels != -100).sum()
            denominator = torch.as_tensor(num_items_in_batch, device=smoothed.device)
            loss, nll_loss = smoothed / denominator, nll.detach() / denominator

        return VanillaTransformerSeq2SeqLMOutput(
            loss=loss,
            nll_loss=nll_loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    @torch.no_grad()
    def generate(self, inputs=None, generation_config=None, logits_processor=None, **kwargs):
        """``GenerationMixin.generate`` with the paper's length limit (§6.1).

        When the caller sets no length (no ``max_length`` / ``max_new_tokens`` in the arguments or
        in the generation config) and the generation config has ``source_length_offset`` (50 by
        default), each sentence may produce at most *its source length + offset* tokens.
        """
        config = generation_config if generation_config is not None else self.generation_config
        if "length_penalty_form" in kwargs and not hasattr(config, "length_penalty_form"):
            # a generation config saved before the field existed: transformers passes only known fields on
            config = copy.deepcopy(config)
            config.length_penalty_form = kwargs.pop("length_penalty_form")
            generation_config = config
        checked_length_penalty_form(kwargs.get("length_penalty_form", getattr(config, "length_penalty_form", None)))
        # The ids are checked here, once per call: the decoding steps read nothing back to check their own.
        source = inputs if inputs is not None else kwargs.get("input_ids")
        if source is not None:
            _check_ids("input_ids", source, self.config.vocab_size)
        if kwargs.get("decoder_input_ids") is not None:
            _check_ids("decoder_input_ids", kwargs["decoder_input_ids"], self.config.vocab_size)
        offset = getattr(config, "source_length_offset", None)
        length_given = any(kwargs.get(k) is not None for k in ("max_length", "max_new_tokens")) or (
            config.max_length is not None or config.max_new_tokens is not None
        )
        if offset is not None and not length_given:
            limits = self._source_lengths(inputs, kwargs) + offset
            positions = self.config.max_position_embeddings
            if self.config.position_embedding_type == "learned" and int(limits.max()) > positions:
                # learned positions stop at the table's end: without this the decoder would fail mid-batch
                logger.warning(
                    f"Output length limited to max_position_embeddings={positions} (learned positions) for the "
                    f"sentences whose source length + {offset} is longer; pass max_new_tokens to choose a limit."
                )
                limits = limits.clamp(max=positions)
            kwargs["max_new_tokens"] = int(limits.max())
            limit = VanillaTransformerSourceLengthLimit(limits, self.config.eos_token_id)
            logits_processor = LogitsProcessorList([*(logits_processor or []), limit])
        with input_values_checked():
            output = super().generate(inputs, generation_config, logits_processor, **kwargs)
        num_beams = kwargs.get("num_beams") or config.num_beams or 1
        if num_beams > 1:
            # For transformers' own beam search, which runs where the in-place one does not (sampling, returned
            # scores, static caches, other processors): it fills finished rows with `pad_token_id or
            # eos_token_id` (5.24, generation/utils.py), so with </s> when the pad id is 0, as ours is. Pad them as
            # greedy search and the in-place beam search do, so that counting non-pad tokens counts the output.
            sequences = output if isinstance(output, torch.Tensor) else output.sequences
            eos, pad = kwargs.get("eos_token_id", config.eos_token_id), kwargs.get("pad_token_id", config.pad_token_id)
            if eos is not None and pad is not None:
                new = sequences[:, 1:]  # a view: column 0 is the decoder start token, which may be </s> too
                ended = torch.isin(new, torch.as_tensor(eos, device=new.device)).long()
                new.masked_fill_(ended.cumsum(-1) - ended > 0, pad)
            # Also transformers' loop (a returned cache means return_dict_in_generate, which the in-place loop
            # leaves to it): its cache holds the beams still running at the last step, not the returned ones;
            # rebuild it so that a next generate() continues the returned sequences.
            if getattr(output, "cache", None) is not None:
                source = {"input_ids": inputs if inputs is not None else kwargs.get("input_ids"), **kwargs}
                output.cache = self._cache_of_sequences(sequences, output.cache, num_beams, source)
        return output

    def _source_lengths(self, inputs: torch.Tensor | None, kwargs: dict) -> torch.Tensor:
        """Number of real (non-padding) source tokens per sentence."""
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        mask = kwargs.get("attention_mask")
        if mask is not None:
            return mask.sum(-1).long()
        if input_ids is not None:
            _check_ids("input_ids", input_ids, self.config.vocab_size)
            return (input_ids != self.config.pad_token_id).sum(-1).long()
        encoder_outputs = kwargs.get("encoder_outputs")
        if encoder_outputs is not None:
            hidden = encoder_outputs[0]
            return torch.full((hidden.shape[0],), hidden.shape[1], dtype=torch.long)
        raise ValueError("generate() needs `input_ids` (or `inputs`), or `encoder_outputs`.")

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained``, plus two things for people who have only transformers:

        * an ``AutoModel`` entry in ``auto_map`` (transformers writes only the class being saved), so
          that ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` works too;
        * the translation pipeline: ``pipeline_vanilla_transformer.py`` (this file's sibling) is copied
          next to the weights and named under ``custom_pipelines`` in ``config.json``, exactly as
          transformers' ``Pipeline.save_pretrained`` does, so that
          ``pipeline("vanilla-translation", model=folder, trust_remote_code=True)`` works. (A copy loaded
          as remote code has no pipeline file beside it; it then saves the model alone.)
        """
        if self._auto_class is not None:
            module = VanillaTransformerModel.__module__.rsplit(".", 1)[-1]
            auto_map = dict(getattr(self.config, "auto_map", None) or {})
            auto_map.setdefault("AutoModel", f"{module}.VanillaTransformerModel")
            self.config.auto_map = auto_map
            pipeline_file = Path(__file__).with_name(PIPELINE_FILE)
            if pipeline_file.is_file() and not os.path.isfile(save_directory):
                self.config.custom_pipelines = {
                    **(getattr(self.config, "custom_pipelines", None) or {}),
                    **CUSTOM_PIPELINES,
                }
                if kwargs.get("is_main_process", args[0] if args else True):
                    os.makedirs(save_directory, exist_ok=True)
                    shutil.copyfile(pipeline_file, Path(save_directory) / PIPELINE_FILE)
        return super().save_pretrained(save_directory, *args, **kwargs)


# --------------------------------------------------------------------------------------------
# §6.1 Decoding limit: "maximum output length ... input length + 50".
# --------------------------------------------------------------------------------------------
class VanillaTransformerSourceLengthLimit(InPlaceLogitsProcessor):
    """Force end-of-sentence once a row has produced ``limit[i]`` tokens (its source length + offset).

    ``max_new_tokens`` can only bound the whole batch; this keeps the paper's per-sentence limit,
    so a sentence gets the same translation alone and inside a padded batch.
    """

    def __init__(self, limits: torch.Tensor, eos_token_id: int):
        self.limits = limits  # [batch], tokens allowed per source sentence, eos included
        self.eos_token_id = eos_token_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return self.mask_(input_ids, scores, copy=True)

    def mask_(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, copy: bool = False) -> torch.FloatTensor:
        """``__call__``, written into ``scores`` (``copy``: into a copy, made only when a row changes)."""
        generated = input_ids.shape[1] - 1  # every row starts with decoder_start_token_id
        limits = self.limits.to(input_ids.device).repeat_interleave(input_ids.shape[0] // self.limits.shape[0])
        last = (generated + 1 >= limits)[:, None]  # this token is the last one allowed; no branch on it (a sync)
        scores = scores.masked_fill(last, -float("inf")) if copy else scores.masked_fill_(last, -float("inf"))
        scores[:, self.eos_token_id].masked_fill_(last[:, 0], 0.0)
        return scores


# --------------------------------------------------------------------------------------------
# transformers plumbing: input checks, teacher forcing, outputs, the pipeline saved with the model.
# --------------------------------------------------------------------------------------------
_IDS_CHECKED_BY_CALLER = contextvars.ContextVar("vanilla_transformer_ids_checked_by_caller", default=False)


@contextlib.contextmanager
def input_values_checked():
    """Within this block the model does not read token ids back to check their range; it still checks their
    dtypes and shapes. For loops that checked their ids once, so that a step need not wait for the device:
    ``generate`` (which checks its inputs, then decodes the model's own choices) and the training loop (whose
    ids come from a tokenizer that was checked against the model)."""
    token = _IDS_CHECKED_BY_CALLER.set(True)
    try:
        yield
    finally:
        _IDS_CHECKED_BY_CALLER.reset(token)


def _check_ids(name: str, ids: torch.Tensor, vocab_size: int, allow: int | None = None) -> None:
    """Raise a ValueError if ``ids`` is not a non-empty integer tensor of ids in [0, vocab_size).

    Skipped while ``torch.compile`` or ``torch.export`` traces the model: the range check reads token values,
    which would break the graph (eager calls, the tests among them, check as always). The range check is
    skipped within :func:`input_values_checked`."""
    if torch.compiler.is_compiling():
        return
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"`{name}` must be a torch.Tensor of token ids, got {type(ids).__name__}.")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(
            f"`{name}` must hold integer token ids (torch.long), got dtype {ids.dtype}. "
            f"Use the tokenizer's output or call `.long()`."
        )
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape [batch, sequence], got {tuple(ids.shape)}.")
    if ids.numel() == 0:
        raise ValueError(
            f"`{name}` is empty (shape {tuple(ids.shape)}): give at least one sequence of at least one token."
        )
    if _IDS_CHECKED_BY_CALLER.get():
        return
    checked = ids if allow is None else ids[ids != allow]
    if checked.numel() and (checked.min() < 0 or checked.max() >= vocab_size):
        bad = checked[(checked < 0) | (checked >= vocab_size)][0].item()
        raise ValueError(
            f"`{name}` holds token id {bad}, outside the model's vocabulary [0, {vocab_size}). "
            f"Check that the tokenizer matches the model (len(tokenizer) <= config.vocab_size)."
        )


def _check_flex_head_size(config: VanillaTransformerConfig, device: torch.device) -> None:
    """torch 2.13's flex attention kernel for CPUs gave wrong (at times NaN) outputs for head sizes 8 and 16
    and exact ones from 32 on (tests/test_modeling.py): refuse the sizes below 32 there. The head size is the
    attention's own, ``config.head_dim`` (d_model / heads unless set)."""
    if config._attn_implementation != "flex_attention" or device.type != "cpu":
        return
    heads = (config.encoder_attention_heads, config.decoder_attention_heads)
    head_size = min(attention_head_size(config, h) for h in heads)
    if head_size < 32:
        default = all(config.d_model == h * attention_head_size(config, h) for h in heads)
        source = "d_model / heads" if default else f"head_dim={head_size}"
        raise ValueError(
            f"flex_attention on a CPU needs a head size of at least 32, this model has head size {head_size} "
            f"({source}): torch's CPU kernel gave wrong outputs for smaller heads. Use attn_implementation='sdpa' "
            f"or 'eager', or run on a GPU."
        )


def _check_mask(name: str, mask: torch.Tensor | None, shape: torch.Size) -> None:
    if mask is not None and mask.shape != shape:
        raise ValueError(
            f"`{name}` has shape {tuple(mask.shape)} but its ids have shape {tuple(shape)}; "
            f"they must be equal (one 1/0 per token). Pad ids and mask together, e.g. with the tokenizer."
        )


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: the decoder reads ``[start, y_1, ..., y_{n-1}]`` to predict ``[y_1, ..., y_n]``.

    Label positions set to -100 (ignored by the loss) become padding.
    """
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    shifted.masked_fill_(shifted == -100, pad_token_id)
    return shifted


@dataclass
class VanillaTransformerSeq2SeqLMOutput(Seq2SeqLMOutput):
    """``Seq2SeqLMOutput`` plus ``nll_loss``: the unsmoothed cross-entropy, normalised as ``loss``
    (equal to ``loss`` when ``smoothing`` is 0). ``logits`` is None when ``skip_logits=True``."""

    nll_loss: torch.FloatTensor | None = None


#: §6.1: "We set the maximum output length during inference to input length + 50".
SOURCE_LENGTH_OFFSET = 50
#: §6.1: "length penalty α = 0.6", citing GNMT, whose penalty is ((5 + |Y|) / 6)^α. By default beam search divides by
#: |Y|^α, as transformers and CTranslate2 do: measured on two test sets, GNMT's form did not translate better, and
#: |Y|^α keeps every engine's tokens the same (the project's docs/model.md, "The length penalty").
#: ``generation_config.length_penalty_form = "gnmt"`` gives the paper's
#: (``generation_vanilla_transformer.LENGTH_PENALTY_FORMS``).
LENGTH_PENALTY_FORM = "power"
#: §6.1: "beam search with a beam size of 4 and length penalty α = 0.6" — the decoding settings of the
#: checkpoints the package makes (``loading.new_model``), saved in their ``generation_config.json``.
PAPER_DECODING = {"num_beams": 4, "length_penalty": 0.6, "source_length_offset": SOURCE_LENGTH_OFFSET}

# The translation pipeline that travels with saved models (pipeline_vanilla_transformer.py), as
# transformers' Pipeline.save_pretrained names it in config.json.
PIPELINE_FILE = "pipeline_vanilla_transformer.py"
CUSTOM_PIPELINES = {
    "vanilla-translation": {
        "impl": "pipeline_vanilla_transformer.VanillaTranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


__all__ = [
    "VanillaTransformerPreTrainedModel",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
    "sinusoidal_position_encoding",
    "shift_tokens_right",
    "input_values_checked",
    "PAPER_DECODING",
]
