"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers 5 model.

Read top to bottom, this file follows the paper:

    §3.5  positional encoding          -> sinusoidal_position_encoding, VanillaTransformerSinusoidalPositionalEncoding
    §3.2.1 scaled dot-product attention -> eager_attention_forward (or SDPA through ALL_ATTENTION_FUNCTIONS)
    §3.2.2 multi-head attention         -> VanillaTransformerAttention
    §3.3  position-wise feed-forward    -> VanillaTransformerFeedForward
    §3.1  encoder / decoder layers      -> VanillaTransformerEncoderLayer, VanillaTransformerDecoderLayer
          (residual + LayerNorm: LayerNorm(x + Dropout(Sublayer(x))), §3.1 and §5.4)
    §3.1  encoder / decoder stacks      -> VanillaTransformerEncoder, VanillaTransformerDecoder
    §3.4  shared embeddings × √d_model  -> VanillaTransformerModel (one matrix `shared`)
    §3.4  pre-softmax linear (tied)     -> VanillaTransformerForConditionalGeneration.lm_head
    §6.1  beam 4, α 0.6, max = source length + 50 -> VanillaTransformerForConditionalGeneration.generate

This file travels to the Hub with every checkpoint (``trust_remote_code=True``): it imports only
torch, transformers, the standard library and, relatively, its configuration sibling.
Layout and attribute names follow transformers' Marian model (``q_proj``, ``self_attn``,
``encoder_attn``, ``fc1``, ``final_layer_norm``, ``embed_tokens``, ``lm_head`` ...), so that the
library's machinery (weight tying, attention dispatch, gradient checkpointing, ``generate``) works
unmodified.
"""


import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation.logits_process import (
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
)
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_vanilla_transformer import VanillaTransformerConfig


# --------------------------------------------------------------------------------------------
# Input checks: bad ids or masks must fail here with a message, not deep inside torch.
# --------------------------------------------------------------------------------------------
def _check_ids(name: str, ids: torch.Tensor, vocab_size: int, allow: int | None = None) -> None:
    """Raise a ValueError if ``ids`` is not a non-empty integer tensor of ids in [0, vocab_size)."""
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
    checked = ids if allow is None else ids[ids != allow]
    if checked.numel() and (checked.min() < 0 or checked.max() >= vocab_size):
        bad = checked[(checked < 0) | (checked >= vocab_size)][0].item()
        raise ValueError(
            f"`{name}` holds token id {bad}, outside the model's vocabulary [0, {vocab_size}). "
            f"Check that the tokenizer matches the model (len(tokenizer) <= config.vocab_size)."
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


# --------------------------------------------------------------------------------------------
# §3.5 Positional encoding
# --------------------------------------------------------------------------------------------
def sinusoidal_position_encoding(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Sines fill the even dimensions and cosines the odd ones (interleaved, as in the paper; Marian
    and fairseq put all sines first). Computed in float64 so that large positions stay exact in float32.
    Returns a float32 tensor of shape ``[len(positions), d_model]``.
    """
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angles = positions.to(torch.float64)[:, None] / torch.pow(10000.0, two_i / d_model)[None, :]
    pe = torch.zeros(len(positions), d_model, dtype=torch.float64)
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

    def forward(self, seq_len: int, past_len: int = 0) -> torch.Tensor:
        """Encodings of positions ``past_len … past_len + seq_len - 1``: shape ``[seq_len, d_model]``."""
        end = past_len + seq_len
        if end <= self.pe.shape[0]:
            return self.pe[past_len:end]
        positions = torch.arange(past_len, end)
        return sinusoidal_position_encoding(positions, self.d_model).to(self.pe.device, self.pe.dtype)


class VanillaTransformerLearnedPositionalEmbedding(nn.Embedding):
    """Learned absolute positions (deviation: Table 3 row (E)); limited to ``max_position_embeddings``."""

    def forward(self, seq_len: int, past_len: int = 0) -> torch.Tensor:
        end = past_len + seq_len
        if end > self.num_embeddings:
            raise ValueError(
                f"Sequence of {end} positions is longer than max_position_embeddings={self.num_embeddings} "
                f"of this model's learned positions. Shorten or split the input; sinusoidal positions "
                f"(position_embedding_type='sinusoidal') have no such limit."
            )
        return self.weight[past_len:end]


# --------------------------------------------------------------------------------------------
# §3.2.1 Scaled dot-product attention:  softmax(Q Kᵀ / √d_k) V
# --------------------------------------------------------------------------------------------
def _dropout(x: torch.Tensor, p: float, training: bool, add_to: torch.Tensor | None = None) -> torch.Tensor:
    """``F.dropout(x)``, or ``add_to + F.dropout(x)`` (a residual connection) when ``add_to`` is given:
    zero each element with probability p, scale the rest by 1/(1-p). On GPUs this is ``F.dropout``; on
    CPUs the mask comes from ``_cpu_keep_mask`` and is applied in one product (``addcmul`` for the sum)."""
    if not training or p == 0.0:
        return x if add_to is None else add_to + x
    if x.device.type != "cpu":
        x = F.dropout(x, p=p, training=True)
        return x if add_to is None else add_to + x
    dtype = x.dtype if add_to is None else torch.promote_types(x.dtype, add_to.dtype)
    mask = _cpu_keep_mask(x.shape, p, dtype)
    return x * mask if add_to is None else torch.addcmul(add_to, x, mask)


def _cpu_keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """Dropout's multiplier on a CPU: 0 with probability p, else 1/(1-p), in ``dtype``.

    torch's CPU random numbers cost one Mersenne-Twister draw per element (``torch.rand`` and
    ``bernoulli_`` alike: 1.2 ms for a 64 × 26 × 256 mask on 2 cores, up to 9 % of a training step).
    Here each draw of 64 random bits (``random_`` over the full int64 range) gives four uniform 16-bit
    integers, one per element: 0.4 ms. An element is dropped when its integer falls among the lowest
    ``round(p · 65536)`` of the 65,536 values, so p is used to within 2⁻¹⁷, and the kept elements are
    scaled by the exact inverse of the keep rate, so every element's expectation is unchanged."""
    dropped = round(p * 65536)
    numel = math.prod(shape)
    bits = torch.empty((numel + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # full 64-bit range
    mask = torch.empty(shape, dtype=dtype)
    torch.ge(bits.view(torch.int16)[:numel].view(shape), dropped - 32768, out=mask)  # 1 or 0; int16: -32768 … 32767
    return mask.mul_(65536 / (65536 - dropped))


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,  # [B, H, T_q, d_k]
    key: torch.Tensor,  # [B, H, T_k, d_k]
    value: torch.Tensor,  # [B, H, T_k, d_v]
    attention_mask: torch.Tensor | None,  # additive float mask [B, 1, T_q, T_k] (0 or -inf)
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference implementation; returns the attention weights (used for pictures)."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [B, H, T_q, T_k]
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = _dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value)  # [B, H, T_q, d_v]
    return output.transpose(1, 2).contiguous(), weights  # [B, T_q, H, d_v]


# --------------------------------------------------------------------------------------------
# §3.2.2 Multi-head attention:  Concat(head_1, …, head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
# --------------------------------------------------------------------------------------------
class VanillaTransformerAttention(nn.Module):
    """Multi-head attention used three ways (§3.2.3): encoder self-attention, masked decoder
    self-attention (``is_causal=True``) and encoder–decoder attention (``key_value_states`` given).

    The h per-head projections are stored as one ``d_model × d_model`` matrix each for Q, K, V.
    The projections carry biases, as in Marian, fairseq and tensor2tensor's reference code.
    """

    def __init__(self, config: VanillaTransformerConfig, num_heads: int, is_causal: bool = False, layer_idx: int = 0):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads  # d_k = d_v = d_model / h
        self.scaling = self.head_dim**-0.5  # 1 / √d_k
        self.dropout = config.attention_dropout
        # SDPA reads this attribute when it gets no mask; it must be False outside decoder self-attention.
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,  # [B, T_q, d_model]
        key_value_states: torch.Tensor | None = None,  # encoder output [B, T_k, d_model] for cross-attention
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
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

        # Encoder-decoder attention where `group` consecutive decoder rows share one encoder row (the
        # beams of a sentence, in beam search): their queries become one row's `group × T_q` queries,
        # so the keys and values are projected, kept and read once per sentence, not once per beam.
        group = batch // key.shape[0]
        if group > 1:
            query = query.reshape(-1, group, *query.shape[1:]).transpose(1, 2).flatten(2, 3)  # [B/g, H, g·T_q, d_k]

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
        )
        output = output.reshape(batch, q_len, -1).contiguous()  # Concat(head_1, …, head_h); [B/g, g·T_q, …] → [B, T_q, …]
        if group > 1 and weights is not None:  # back to one row per decoder row: [B, H, T_q, T_k]
            weights = weights.unflatten(2, (group, q_len)).transpose(1, 2).flatten(0, 1)
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
        hidden_states = F.relu(self.fc1(hidden_states))
        hidden_states = _dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


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
        x = _dropout(sublayer_output, p=self.dropout, training=self.training, add_to=x)
        return x if self.norm_first else norm(x)


class VanillaTransformerEncoderLayer(VanillaTransformerLayer):
    """Self-attention, then feed-forward."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int = 0):
        super().__init__(config)
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config.d_model, config.encoder_ffn_dim, config.activation_dropout)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None):
        x = self._sublayer_input(hidden_states, self.self_attn_layer_norm)
        attn_output, attn_weights = self.self_attn(x, attention_mask=attention_mask)
        hidden_states = self._residual(hidden_states, attn_output, self.self_attn_layer_norm)

        x = self._sublayer_input(hidden_states, self.final_layer_norm)
        hidden_states = self._residual(hidden_states, self.ffn(x), self.final_layer_norm)
        return hidden_states, attn_weights


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
        use_cache: bool = False,
    ):
        x = self._sublayer_input(hidden_states, self.self_attn_layer_norm)
        attn_output, self_weights = self.self_attn(x, attention_mask=attention_mask, cache=cache)
        hidden_states = self._residual(hidden_states, attn_output, self.self_attn_layer_norm)

        x = self._sublayer_input(hidden_states, self.encoder_attn_layer_norm)
        attn_output, cross_weights = self.encoder_attn(
            x, key_value_states=encoder_hidden_states, attention_mask=encoder_attention_mask, cache=cache
        )
        hidden_states = self._residual(hidden_states, attn_output, self.encoder_attn_layer_norm)

        x = self._sublayer_input(hidden_states, self.final_layer_norm)
        hidden_states = self._residual(hidden_states, self.ffn(x), self.final_layer_norm)
        return hidden_states, self_weights, cross_weights


# --------------------------------------------------------------------------------------------
# Base class: initialisation and the flags transformers reads.
# --------------------------------------------------------------------------------------------
class VanillaTransformerPreTrainedModel(PreTrainedModel):
    config: VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _supports_sdpa = True
    # flash / flex attention: not enabled until tested on a GPU.

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

    def _require_eager_for_attentions(self, output_attentions: bool) -> None:
        if output_attentions and self.config._attn_implementation != "eager":
            raise ValueError(
                f"output_attentions=True needs attention weights, which the '{self.config._attn_implementation}' "
                f"attention does not return. Load the model with attn_implementation='eager' or call "
                f"model.set_attn_implementation('eager') first."
            )


def _positions(config: VanillaTransformerConfig) -> nn.Module:
    if config.position_embedding_type == "learned":
        return VanillaTransformerLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
    return VanillaTransformerSinusoidalPositionalEncoding(config.max_position_embeddings, config.d_model)


# --------------------------------------------------------------------------------------------
# §3.1 The two stacks. Inputs: embeddings × √d_model (§3.4) + positions (§3.5), then dropout (§5.4).
# --------------------------------------------------------------------------------------------
class VanillaTransformerEncoder(nn.Module):
    """N identical layers of bidirectional self-attention + FFN."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = _positions(config)
        self.layers = nn.ModuleList(VanillaTransformerEncoderLayer(config, i) for i in range(config.encoder_layers))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        **kwargs,
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of `input_ids` or `inputs_embeds` to the encoder.")
        if input_ids is not None:
            _check_ids("input_ids", input_ids, self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)
        elif inputs_embeds.shape[0] * inputs_embeds.shape[1] == 0:
            raise ValueError(f"`inputs_embeds` is empty (shape {tuple(inputs_embeds.shape)}).")
        _check_mask("attention_mask", attention_mask, inputs_embeds.shape[:2])

        positions = self.embed_positions(inputs_embeds.shape[1])  # [T, d_model]
        hidden_states = inputs_embeds * self.embed_scale + positions.to(inputs_embeds.dtype)
        hidden_states = _dropout(hidden_states, p=self.config.dropout, training=self.training)

        # Padding mask only (the encoder is not causal); None when nothing is padded (SDPA fast path).
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask)

        all_hidden, all_attn = [], []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, weights = layer(hidden_states, mask)
            if output_attentions:
                all_attn.append(weights)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        return BaseModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attn) if output_attentions else None,
        )


class VanillaTransformerDecoder(nn.Module):
    """N identical layers of masked self-attention + encoder–decoder attention + FFN."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = _positions(config)
        self.layers = nn.ModuleList(VanillaTransformerDecoderLayer(config, i) for i in range(config.decoder_layers))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of `decoder_input_ids` or `decoder_inputs_embeds` to the decoder.")
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` (the encoder's output).")
        if input_ids is not None:
            _check_ids("decoder_input_ids", input_ids, self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)
        batch, seq_len = inputs_embeds.shape[:2]
        if batch % encoder_hidden_states.shape[0]:
            raise ValueError(
                f"Decoder batch size {batch} is not a multiple of the encoder output's {encoder_hidden_states.shape[0]}: "
                f"give one encoder row per decoder row, or one per group of consecutive decoder rows (the beams of a sentence)."
            )
        group = batch // encoder_hidden_states.shape[0]  # decoder rows per encoder row (see VanillaTransformerAttention)
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_len = cache.get_seq_length() if cache is not None else 0
        if attention_mask is not None and (
            attention_mask.dim() != 2
            or attention_mask.shape[0] != batch
            or attention_mask.shape[1] not in (seq_len, past_len + seq_len)
        ):
            _check_mask("decoder_attention_mask", attention_mask, torch.Size((batch, past_len + seq_len)))

        positions = self.embed_positions(seq_len, past_len)  # positions continue after the cached ones
        hidden_states = inputs_embeds * self.embed_scale + positions.to(inputs_embeds.dtype)
        hidden_states = _dropout(hidden_states, p=self.config.dropout, training=self.training)

        if attention_mask is None:
            attention_mask = torch.ones(batch, past_len + seq_len, device=hidden_states.device, dtype=torch.long)
        elif attention_mask.shape[1] == seq_len and past_len:
            attention_mask = F.pad(attention_mask, (past_len, 0), value=1)
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        # §3.2.3: mask out (set to -inf) attention to subsequent positions, plus target padding.
        causal_mask = create_causal_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask, cache=self_cache
        )
        cross_mask = create_bidirectional_mask(
            config=self.config,  # the queries of a group of rows are one encoder row's (only their shape is read)
            inputs_embeds=hidden_states if group == 1 else hidden_states.new_empty(batch // group, group * seq_len, 0),
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )

        all_hidden, all_self, all_cross = [], [], []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,
                encoder_attention_mask=cross_mask,
                cache=cache,
                use_cache=use_cache,
            )
            if output_attentions:
                all_self.append(self_weights)
                all_cross.append(cross_weights)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            cache=cache if use_cache else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_self) if output_attentions else None,
            cross_attentions=tuple(all_cross) if output_attentions else None,
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
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

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
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        output_attentions = bool(output_attentions if output_attentions is not None else self.config.output_attentions)
        output_hidden_states = bool(
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = bool(use_cache if use_cache is not None else self.config.use_cache)
        self._require_eager_for_attentions(output_attentions)

        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
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
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
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
# §6.1 Decoding limit: "maximum output length ... input length + 50".
# --------------------------------------------------------------------------------------------
class VanillaTransformerSourceLengthLimit(LogitsProcessor):
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
        last = generated + 1 >= limits  # this token is the last one allowed
        if last.any():
            scores = scores.clone() if copy else scores
            scores[last] = -float("inf")
            scores[last, self.eos_token_id] = 0.0
        return scores


class _BeamSearchSelfAttentionLayer(DynamicLayer):
    """One decoder layer's self-attention keys and values in beam search, reordered when they grow.

    transformers' DynamicLayer concatenates each step's keys and values into a new tensor, and beam
    search then reorders that into another: two copies of the whole cache per step, each into fresh
    memory. Here a reordering only records which rows to take, and the next step's concatenation
    copies the rows in that order: one copy per step (``index_select`` straight into the new tensor;
    32 sentences × 4 beams, ms per step: base fp32 82 → 78–79, bf16 45.3 → 43.9, small fp32 15.1 → 14.7).
    Only the in-place beam search uses it, which reads the keys and values through ``update`` alone.
    """

    def __init__(self):
        super().__init__()
        self.order = None  # rows to take at the next update, when a reordering is pending

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized or self.keys.numel() == 0:
            self.order = None
            return super().update(key_states, value_states)
        self.keys, self.values = self._grow(self.keys, key_states), self._grow(self.values, value_states)
        self.order = None
        return self.keys, self.values

    def _grow(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        length = old.shape[-2]
        grown = old.new_empty(*old.shape[:-2], length + new.shape[-2], old.shape[-1])
        if self.order is None:
            grown[..., :length, :].copy_(old)
        else:
            torch.index_select(old, 0, self.order, out=grown[..., :length, :])
        grown[..., length:, :].copy_(new)
        return grown

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized and self.keys.numel():
            beam_idx = beam_idx.to(self.keys.device)
            self.order = beam_idx if self.order is None else self.order[beam_idx]


# The logits processors the in-place beam search applies itself (see its docstring).
_IN_PLACE_PROCESSORS = (VanillaTransformerSourceLengthLimit, MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor)


def _in_place_beam_search_applies(logits_processor, config, synced_gpus: bool, model_kwargs: dict) -> bool:
    """Whether ``_beam_search`` may take its in-place loop (see its docstring)."""
    return (
        not (synced_gpus or config.do_sample or config.return_dict_in_generate or getattr(config, "low_memory", False))
        and bool(model_kwargs.get("use_cache"))
        and all(type(processor) in _IN_PLACE_PROCESSORS for processor in logits_processor)
    )


def _top_k(scores: torch.Tensor, k: int, offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk((scores + offsets[..., None]).flatten(1), k)`` for ``scores`` [rows, groups, n] and
    ``offsets`` [rows, groups] (none: 0), found among few candidates and without the sum's full tensor.

    Each group's n values are cut into about √n chunks of √n; the k chunks of a row with the largest
    offset maxima (plus each group's last, shorter chunk) hold the row's k largest sums: the k-th largest
    sum is at least the k-th largest chunk maximum m, since those k chunks each hold a sum ≥ m, and every
    sum above m lies in a chunk whose maximum is above m. Rounding keeps this exact: x ≤ y gives
    x + b ≤ y + b in floating point too, so a chunk's offset maximum is the maximum of its sums. Only
    which of several equal values is returned can differ from ``torch.topk``, whose choice among ties is
    unspecified too. torch's CPU top-k copies and partially sorts each whole row: 3.4 ms for 32 rows of
    4 beams × 37,000 on 2 cores, 0.7 ms this way; adding the offsets only to maxima and candidates saves
    a pass over all the scores (beam search's beam scores; 1 ms a step at that size).
    """
    rows, groups, n = scores.shape
    width = math.isqrt(n)
    count = n // width
    shift = offsets[..., None] if offsets is not None else 0.0
    if groups * count <= k:
        return torch.topk((scores + shift).flatten(1), k)
    body = scores[..., : count * width].unflatten(-1, (count, width))  # [rows, groups, count, width]
    maxima = body.amax(-1) + shift  # [rows, groups, count]
    best = torch.topk(maxima.flatten(1), k).indices  # [rows, k]: the chunks with the largest maxima
    group, chunk = best // count, best % count
    row = torch.arange(rows, device=scores.device)[:, None]
    candidates = body[row, group, chunk]  # [rows, k, width]
    if offsets is not None:
        candidates = candidates + offsets[row, group][..., None]
    positions = (group * n + chunk * width)[..., None] + torch.arange(width, device=scores.device)
    candidates, positions = candidates.flatten(1), positions.flatten(1)
    if count * width < n:  # each group's last, shorter chunk is always a candidate
        tail = (scores[..., count * width :] + shift).flatten(1)
        tail_positions = torch.arange(groups, device=scores.device)[:, None] * n + torch.arange(count * width, n, device=scores.device)
        candidates = torch.cat([candidates, tail], dim=1)
        positions = torch.cat([positions, tail_positions.flatten().expand(rows, -1)], dim=1)
    values, picked = torch.topk(candidates, k)
    return values, positions.gather(1, picked)


def _mask_in_place(processor, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> None:
    """``scores = processor(input_ids, scores)`` without the copy, for the kinds in ``_IN_PLACE_PROCESSORS``
    (transformers' two min-length processors mask the end-of-sentence ids while too few tokens exist)."""
    if type(processor) is VanillaTransformerSourceLengthLimit:
        processor.mask_(input_ids, scores)
    elif type(processor) is MinNewTokensLengthLogitsProcessor:
        if input_ids.shape[-1] - processor.prompt_length_to_skip < processor.min_new_tokens:
            scores[:, processor.eos_token_id] = -math.inf
    elif input_ids.shape[-1] < processor.min_length:  # MinLengthLogitsProcessor
        scores[:, processor.eos_token_id] = -math.inf


# --------------------------------------------------------------------------------------------
# §5.4 label smoothing, fused with the pre-softmax linear layer, for training.
# --------------------------------------------------------------------------------------------
# The most logits a training step keeps between the two passes of LinearCrossEntropySums (a workspace
# its model holds while in training mode); above it, the second pass computes them again.
LOSS_WORKSPACE_BYTES = 256 << 20


class LinearCrossEntropySums(torch.autograd.Function):
    """Sums of the label-smoothed cross-entropy and of the plain NLL of ``hidden @ weight.T``,
    computed a block of vocabulary columns at a time, so the [tokens, vocab] logits never exist in full.

    With smoothing ε over a vocabulary of V, per target token with gold id y:
    ``smoothed = lse(z) - (1-ε)·z_y - ε·mean(z)`` and ``nll = lse(z) - z_y`` (exactly
    ``F.cross_entropy(z, y, label_smoothing=ε)``); the gradient is ``softmax(z) - (1-ε)·onehot(y) - ε/V``.
    Two passes over the column blocks: the first gathers each row's log-sum-exp (online, as flash
    attention does), the gold logit and the sum of logits; the second recomputes each block's logits,
    turns them into gradients and applies them at once: ``grad_hidden += g @ w[cols]`` and
    ``grad_weight[cols] = g.T @ hidden``, a matmul whose inner size is the number of tokens. Given a
    ``workspace`` in which all the logits fit, pass 1 keeps them there and pass 2 reads them back.
    Why by columns: by rows, every block adds a full [vocab, d] float32 product into ``grad_weight``,
    which cost three quarters of this function at the paper's vocabulary (measured; Liger-Kernel's
    fused linear cross-entropy, Triton and GPU-only, splits by rows). The extra logits matmul of the
    second pass costs far less. Under autocast the matmuls run in the autocast dtype and the softmax
    in float32, as autocast does for ``lm_head`` + ``cross_entropy``. Rows whose label is -100 count
    for nothing.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, epsilon: float, block_columns: int, grads: bool, workspace: dict | None):
        device_type, device = hidden.device.type, hidden.device
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
        exact = torch.promote_types(dtype, torch.float32)  # softmax and sums: float32 at least
        need_hidden, need_weight = grads and ctx.needs_input_grad[0], grads and ctx.needs_input_grad[1]
        keep = labels != -100
        with torch.autocast(device_type, enabled=False):
            h, w, y = hidden[keep].to(dtype), weight.to(dtype), labels[keep]
            (rows, d), vocab = h.shape, weight.shape[0]
            blocks = [slice(start, min(start + block_columns, vocab)) for start in range(0, vocab, block_columns)]
            # Every block reuses the same buffers: on a CPU each fresh multi-megabyte tensor is fresh
            # memory from the OS, whose page faults cost as much as the arithmetic (measured).
            width = blocks[0].stop
            low = torch.empty(rows * width, dtype=dtype, device=device)  # logits as the matmul gives them
            high = low if exact == dtype else torch.empty(rows * width, dtype=exact, device=device)
            scratch = torch.empty(rows * width, dtype=exact, device=device)

            # With a workspace (a dict its caller keeps from one call to the next) and all the logits within
            # LOSS_WORKSPACE_BYTES, pass 1 keeps each block's logits for pass 2, which then has no matmul
            # to repeat. The memory is reused at every step: fresh from the OS each time, it cost as much
            # as the matmul it saves (measured).
            kept = None
            if workspace is not None and (need_hidden or need_weight) and rows * vocab * dtype.itemsize <= LOSS_WORKSPACE_BYTES:
                kept = workspace.get("logits")
                if kept is None or kept.numel() < rows * vocab or kept.dtype != dtype or kept.device != device:
                    kept = workspace["logits"] = torch.empty(rows * vocab, dtype=dtype, device=device)

            def logits(cols: slice, again: bool = False) -> torch.Tensor:
                """This block's [rows, columns] logits, in `exact` precision, in `high` (`again`: pass 2)."""
                n = cols.stop - cols.start
                if kept is None:
                    z = torch.mm(h, w[cols].T, out=low[: rows * n].view(rows, n))
                else:
                    z = kept[rows * cols.start : rows * cols.stop].view(rows, n)
                    if not again:
                        torch.mm(h, w[cols].T, out=z)
                return z if high is low else high[: rows * n].view(rows, n).copy_(z)

            def gold_index(cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
                """Which rows have their gold id in this block, and where (clamped for the others)."""
                return (y >= cols.start) & (y < cols.stop), (y - cols.start).clamp(0, cols.stop - cols.start - 1)[:, None]

            # pass 1: log-sum-exp (online, as flash attention does), gold logit and sum of logits per row
            running_max = torch.full((rows,), -float("inf"), dtype=exact, device=device)
            running_sum, gold, logit_sum = (torch.zeros(rows, dtype=exact, device=device) for _ in range(3))
            for cols in blocks:
                z = logits(cols)
                block_max = torch.maximum(running_max, z.amax(-1))
                exps = torch.sub(z, block_max[:, None], out=scratch[: z.numel()].view_as(z)).exp_()
                running_sum = running_sum * (running_max - block_max).exp() + exps.sum(-1)
                running_max = block_max
                inside, index = gold_index(cols)
                gold += torch.where(inside, z.gather(-1, index).squeeze(-1), 0.0)
                logit_sum += z.sum(-1)
            lse = running_max + running_sum.log()
            smoothed = (lse - (1 - epsilon) * gold - epsilon * logit_sum / vocab).sum().float()
            nll = (lse - gold).sum().float()
            # pass 2: each block's logits again, turned into gradients and applied at once
            grad_hidden = grad_weight = None
            if need_hidden or need_weight:
                grad_kept = torch.zeros(rows, d, dtype=exact, device=device)
                grad_weight = torch.empty(weight.shape, dtype=exact, device=device) if need_weight else None
                product = torch.empty(max(rows, width) * d, dtype=dtype, device=device)  # matmul outputs to convert
                for cols in blocks:
                    g = logits(cols, again=True).sub_(lse[:, None]).exp_().sub_(epsilon / vocab)  # softmax - ε/V
                    inside, index = gold_index(cols)
                    g.scatter_add_(-1, index, ((epsilon - 1) * inside).to(exact)[:, None])
                    n = g.shape[1]
                    g = g if high is low else low[: g.numel()].view_as(g).copy_(g)  # back to the matmul dtype
                    if need_hidden:
                        grad_kept += torch.mm(g, w[cols], out=product[: rows * d].view(rows, d))
                    if need_weight:
                        grad_weight[cols] = torch.mm(g.T, h, out=product[: n * d].view(n, d))
                if need_hidden:
                    grad_hidden = torch.zeros_like(hidden)
                    grad_hidden[keep] = grad_kept.to(hidden.dtype)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(nll)
        return smoothed, nll

    @staticmethod
    def backward(ctx, grad_smoothed, grad_nll):
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_hidden = grad_hidden * grad_smoothed.to(grad_hidden.dtype) if grad_hidden is not None else None
        grad_weight = (grad_weight * grad_smoothed).to(ctx.weight_dtype) if grad_weight is not None else None
        return grad_hidden, grad_weight, None, None, None, None, None


def linear_cross_entropy_sums(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    block_columns: int | None = None,
    workspace: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(label-smoothed cross-entropy sum, NLL sum) over the tokens whose label is not -100, for
    logits ``hidden @ weight.T``; ``hidden`` is [..., d], ``labels`` the matching [...] ids.
    Only the first sum carries gradients. ``block_columns`` (vocabulary entries per block) defaults
    to about 1M logits per block (4 MB in float32), at least 256 columns: on a 2-core CPU 1,664 tokens ×
    37,000 entries ran 0.31 s forward and backward with blocks of 768 columns and 0.46 s with 1,260.
    ``workspace``: a dict kept by the caller between calls, where the logits of both passes are kept
    when they fit in ``LOSS_WORKSPACE_BYTES`` (the model's own, in training mode): training steps 3–7 %
    faster on 2 cores, small and base sizes, fp32 and bf16."""
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1).to(hidden.device)
    block_columns = block_columns or max(256, (1 << 20) // max(1, hidden.shape[0]))
    grads = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)  # none under no_grad
    return LinearCrossEntropySums.apply(hidden, weight, labels, float(label_smoothing), block_columns, grads, workspace)


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


@dataclass
class VanillaTransformerSeq2SeqLMOutput(Seq2SeqLMOutput):
    """``Seq2SeqLMOutput`` plus ``nll_loss``: the unsmoothed cross-entropy, normalised as ``loss``
    (equal to ``loss`` when ``smoothing`` is 0). ``logits`` is None when ``skip_logits=True``."""

    nll_loss: torch.FloatTensor | None = None


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """The encoder–decoder plus the pre-softmax linear layer, tied to the shared embedding (§3.4).

    ``labels`` → mean cross-entropy over positions whose label is not -100 (decoder inputs are the
    labels shifted right), label-smoothed (§5.4) when ``smoothing`` is given (the training command
    does so; ``Seq2SeqTrainer(label_smoothing_factor=0.1)`` smooths the logits itself).
    """

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
    # The loss honours `num_items_in_batch` (gradient accumulation in transformers' Trainer).
    accepts_loss_kwargs = True

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # §6.1 decoding defaults, saved to generation_config.json (which from_pretrained reads back).
        # `source_length_offset` is ours: see `generate`.
        token_ids = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
        self.generation_config = GenerationConfig(
            **{name: getattr(config, name) for name in token_ids},
            num_beams=4,
            length_penalty=0.6,
            source_length_offset=50,
        )
        self._loss_workspace: dict = {}  # the training loss's kept logits (see LinearCrossEntropySums)

    def train(self, mode: bool = True):
        if not mode:  # inference needs no loss workspace: give its memory back
            self._loss_workspace.clear()
        return super().train(mode)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

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
                self.config.custom_pipelines = {**(getattr(self.config, "custom_pipelines", None) or {}), **CUSTOM_PIPELINES}
                if kwargs.get("is_main_process", args[0] if args else True):
                    os.makedirs(save_directory, exist_ok=True)
                    shutil.copyfile(pipeline_file, Path(save_directory) / PIPELINE_FILE)
        return super().save_pretrained(save_directory, *args, **kwargs)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Used by ``DataCollatorForSeq2Seq(model=...)`` to add ``decoder_input_ids`` to batches."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

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
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        smoothing: float = 0.0,
        skip_logits: bool = False,
        **kwargs,
    ) -> "VanillaTransformerSeq2SeqLMOutput":
        r"""
        labels: target ids (-100 = ignored); the loss is their cross-entropy, averaged over the
            non-ignored tokens, or summed and divided by ``num_items_in_batch`` when it is given
            (how transformers' Trainer normalises over gradient-accumulation steps).
        smoothing: the label smoothing ε_ls of §5.4 for the loss; ``nll_loss`` is then the unsmoothed
            loss. (Not named ``label_smoothing``: transformers' Trainer takes every ``forward`` argument
            whose name contains "label" for a label column.)
        skip_logits: with ``labels``, compute the loss block by block from the last hidden states
            (``linear_cross_entropy_sums``) and return no logits: same loss and gradients, less
            memory and time. The training command uses it.
        """
        if skip_logits and labels is None:
            raise ValueError("skip_logits=True needs `labels`: without them there is no loss to compute instead of the logits.")
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
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        hidden = outputs.last_hidden_state
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
            if skip_logits:
                workspace = self._loss_workspace if self.training else None
                smoothed, nll = linear_cross_entropy_sums(hidden, self.lm_head.weight, labels, smoothing, workspace=workspace)
            else:
                flat_logits, flat_labels = logits.float().flatten(0, 1), labels.flatten()
                smoothed = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, label_smoothing=smoothing, reduction="sum")
                with torch.no_grad():
                    nll = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum") if smoothing else smoothed
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
        offset = getattr(config, "source_length_offset", None)
        length_given = any(kwargs.get(k) is not None for k in ("max_length", "max_new_tokens")) or (
            config.max_length is not None or config.max_new_tokens is not None
        )
        if offset is not None and not length_given:
            limits = self._source_lengths(inputs, kwargs) + offset
            positions = self.config.max_position_embeddings
            if self.config.position_embedding_type == "learned" and int(limits.max()) > positions:
                # learned positions stop at the table's end: without this the decoder would fail mid-batch
                logging.get_logger(__name__).warning(
                    f"Output length limited to max_position_embeddings={positions} (learned positions) for the "
                    f"sentences whose source length + {offset} is longer; pass max_new_tokens to choose a limit."
                )
                limits = limits.clamp(max=positions)
            kwargs["max_new_tokens"] = int(limits.max())
            limit = VanillaTransformerSourceLengthLimit(limits, self.config.eos_token_id)
            logits_processor = LogitsProcessorList([*(logits_processor or []), limit])
        output = super().generate(inputs, generation_config, logits_processor, **kwargs)
        sequences = output if isinstance(output, torch.Tensor) else getattr(output, "sequences", None)
        if sequences is not None and self.config.eos_token_id is not None and self.config.pad_token_id is not None:
            # Beam search fills finished rows with `pad_token_id or eos_token_id` (transformers 5.24,
            # generation/utils.py), i.e. with </s> when the pad id is 0, as ours is: pad them as greedy does,
            # so that counting non-pad tokens counts the output.
            new = sequences[:, 1:]  # a view: column 0 is the decoder start token, which may be </s> too
            ended = (new == self.config.eos_token_id).long()
            new.masked_fill_(ended.cumsum(-1) - ended > 0, self.config.pad_token_id)
        return output

    @staticmethod
    def _reorder_cache(cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search's cache reordering (transformers' beam search calls it when the model has it):
        only the decoder self-attention keys and values move. The cross-attention ones project the
        encoder output, the same for every beam of a sentence, and beam search picks each sentence's
        beams among its own, so reordering them would copy them unchanged at every step."""
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

    def _beam_search(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False, **model_kwargs):
        """transformers' beam search (5.24) with each step's vocabulary-sized work done in place.

        At every step transformers copies the logits to float32, takes their log-softmax, lets each
        logits processor return a masked copy and adds the beam scores into yet another [rows, vocab]
        tensor; on a CPU each of them is fresh memory. Measured alone for 32 sentences × 4 beams at a
        vocabulary of 37,000 (fp32, 2 cores): 53 ms per step with transformers' copies, 30 ms in place,
        19.5 ms of either being the output layer. Here the log-softmax is written into one buffer kept
        across steps (bf16 logits are converted into it, not into a fresh copy), the min-length and
        source-length masks are applied in place, and the top-k of the log-probabilities plus the beam scores
        over beams × vocabulary is taken through chunk maxima, the beam scores added to the candidates only
        (``_top_k``; base bf16: 47.5 → 42 ms per step).
        The decoder gets each sentence's encoder output once, not once per beam, so
        encoder-decoder attention projects, keeps and reads its keys and values once per sentence
        (32 sentences × 4 beams, ms per step before → after, two runs each: base fp32 83–85 → 73–77,
        bf16 45–47 → 44–46; small fp32 14.8–15.3 → 13.7–13.8, bf16 10.5–10.7 → 9.9–10.3), and the
        self-attention caches are reordered as they grow (``_BeamSearchSelfAttentionLayer``). Everything
        else is transformers' own helpers, called in the same order, so the tokens are the same (tested
        against transformers' loop). What this loop does not cover (sampling, returned
        scores/logits/attentions, other logits processors, several GPUs, no cache) goes to transformers' loop.
        """
        config = generation_config
        if not _in_place_beam_search_applies(logits_processor, config, synced_gpus, model_kwargs):
            return super()._beam_search(input_ids, logits_processor, stopping_criteria, config, synced_gpus, **model_kwargs)
        pad_token_id, eos_token_id = config._pad_token_tensor, config._eos_token_tensor
        early_stopping, length_penalty, max_length = config.early_stopping, config.length_penalty, config.max_length
        num_beams, num_return_sequences = config.num_beams, config.num_return_sequences
        batch_size, cur_len = input_ids.shape[0] // num_beams, input_ids.shape[1]
        # generate() repeated each sentence's encoder output and source mask for its beams; the decoder's
        # cross-attention takes one row per sentence (see VanillaTransformerAttention), so keep one.
        encoder_hidden = model_kwargs["encoder_outputs"].last_hidden_state
        if encoder_hidden.shape[0] == batch_size * num_beams and num_beams > 1:
            model_kwargs["encoder_outputs"] = BaseModelOutput(last_hidden_state=encoder_hidden[::num_beams].contiguous())
            if model_kwargs.get("attention_mask") is not None:
                model_kwargs["attention_mask"] = model_kwargs["attention_mask"][::num_beams].contiguous()
        decoder_prompt_len, device = cur_len, input_ids.device
        beams_to_keep = max(2, 1 + (eos_token_id.shape[0] if eos_token_id is not None else 0)) * num_beams
        top_num_beam_mask = torch.arange(beams_to_keep, device=device) < num_beams
        fill = pad_token_id or eos_token_id[0] if eos_token_id is not None else -1  # as transformers fills
        running_sequences = torch.full((batch_size, num_beams, max_length), fill_value=fill, dtype=torch.int64, device=device)
        running_sequences[:, :, :cur_len] = self._unflatten_beam_dim(input_ids, batch_size, num_beams)
        sequences = running_sequences.detach().clone()
        running_beam_scores = torch.zeros((batch_size, num_beams), dtype=torch.float, device=device)
        running_beam_scores[:, 1:] = -1e9
        beam_scores = torch.full((batch_size, num_beams), fill_value=-1e9, dtype=torch.float, device=device)
        is_sent_finished = torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device)
        is_early_stop_heuristic_unsatisfied = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
        running_beam_indices = torch.full((batch_size, num_beams, max_length - cur_len), fill_value=-1, dtype=torch.int32, device=device)
        beam_indices = running_beam_indices.detach().clone()
        flat_running_sequences = input_ids
        log_probs = None  # the [batch × beams, vocab] buffer, reused at every step
        beam_offset = torch.arange(batch_size, device=device).view(-1, 1) * num_beams  # first flat row of each sentence

        cache = model_kwargs["cache"]
        if isinstance(cache, EncoderDecoderCache) and cache.get_seq_length() == 0:  # see _BeamSearchSelfAttentionLayer
            layers = [_BeamSearchSelfAttentionLayer() for _ in range(self.config.decoder_layers)]
            model_kwargs["cache"] = EncoderDecoderCache(Cache(layers=layers), cache.cross_attention_cache)
        model_outputs = self._prefill(input_ids, config, model_kwargs, is_first_iteration=not getattr(config, "is_assistant", False))
        prefill_consumed = False
        this_peer_finished = False
        while self._has_unfinished_sequences(this_peer_finished, synced_gpus, device=device):
            if prefill_consumed:
                flat_running_sequences = self._flatten_beam_dim(running_sequences[:, :, :cur_len])
                model_inputs = self.prepare_inputs_for_generation(flat_running_sequences, next_sequence_length=1, **model_kwargs)
                model_outputs = self(**model_inputs, return_dict=True)
            prefill_consumed = True
            model_kwargs = self._update_model_kwargs_for_generation(model_outputs, model_kwargs, is_encoder_decoder=True)
            logits = model_outputs.logits[:, -1, :]
            if log_probs is None:
                log_probs = torch.empty(logits.shape, dtype=torch.float32, device=device)
            if logits.dtype == torch.float32:
                torch.log_softmax(logits, dim=-1, out=log_probs)
            else:  # converted into the buffer, not into a fresh float32 copy, then normalised there
                torch.log_softmax(log_probs.copy_(logits), dim=-1, out=log_probs)
            for processor in logits_processor:  # only the kinds _in_place_beam_search_applies admits
                _mask_in_place(processor, flat_running_sequences, log_probs)
            del model_outputs
            # transformers' _get_top_k_continuations: the top-k of log-probabilities + beam scores over
            # beams × vocabulary, taken through chunk maxima, the beam scores added to few candidates (_top_k)
            topk_log_probs, topk_indices = _top_k(
                self._unflatten_beam_dim(log_probs, batch_size, num_beams), beams_to_keep, offsets=running_beam_scores
            )
            topk_current_beam_indices = topk_indices // log_probs.shape[-1]
            topk_running_beam_indices = self._gather_beams(running_beam_indices, topk_current_beam_indices)
            topk_running_sequences = self._gather_beams(running_sequences, topk_current_beam_indices)
            topk_running_sequences[:, :, cur_len] = topk_indices % log_probs.shape[-1]
            topk_running_beam_indices[:, :, cur_len - decoder_prompt_len] = topk_current_beam_indices + beam_offset
            next_token_hits_stopping_criteria = stopping_criteria(
                self._flatten_beam_dim(topk_running_sequences[:, :, : cur_len + 1]), None
            )
            next_token_hits_stopping_criteria = self._unflatten_beam_dim(next_token_hits_stopping_criteria, batch_size, beams_to_keep)
            running_sequences, running_beam_scores, running_beam_indices = self._get_running_beams_for_next_iteration(
                topk_log_probs=topk_log_probs, topk_running_sequences=topk_running_sequences,
                topk_running_beam_indices=topk_running_beam_indices,
                next_token_hits_stopping_criteria=next_token_hits_stopping_criteria, num_beams=num_beams,
            )  # fmt: skip
            sequences, beam_scores, beam_indices, is_sent_finished = self._update_finished_beams(
                sequences=sequences, topk_running_sequences=topk_running_sequences, beam_scores=beam_scores,
                topk_log_probs=topk_log_probs, beam_indices=beam_indices, topk_running_beam_indices=topk_running_beam_indices,
                is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied, is_sent_finished=is_sent_finished,
                next_token_hits_stopping_criteria=next_token_hits_stopping_criteria, top_num_beam_mask=top_num_beam_mask,
                num_beams=num_beams, cur_len=cur_len, decoder_prompt_len=decoder_prompt_len,
                length_penalty=length_penalty, early_stopping=early_stopping,
            )  # fmt: skip
            beam_idx = self._flatten_beam_dim(running_beam_indices[..., cur_len - decoder_prompt_len])
            model_kwargs["cache"] = self._reorder_cache(model_kwargs["cache"], beam_idx)
            cur_len = cur_len + 1
            is_early_stop_heuristic_unsatisfied = self._check_early_stop_heuristic(
                is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied,
                running_beam_scores=running_beam_scores, beam_scores=beam_scores, is_sent_finished=is_sent_finished,
                cur_len=cur_len, max_length=max_length, decoder_prompt_len=decoder_prompt_len,
                early_stopping=early_stopping, length_penalty=length_penalty,
            )  # fmt: skip
            this_peer_finished = not self._beam_search_has_unfinished_sequences(
                is_early_stop_heuristic_unsatisfied, is_sent_finished, next_token_hits_stopping_criteria, early_stopping
            )

        sequences = self._flatten_beam_dim(sequences[:, :num_return_sequences, :])
        beam_indices = self._flatten_beam_dim(beam_indices[:, :num_return_sequences, :])
        max_generated_length = ((beam_indices + 1).bool()).sum(dim=1).max()
        return sequences[:, : decoder_prompt_len + max_generated_length]

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


__all__ = [
    "VanillaTransformerPreTrainedModel",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
    "sinusoidal_position_encoding",
    "shift_tokens_right",
]
