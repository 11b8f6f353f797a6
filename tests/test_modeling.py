"""Equivalence and behaviour tests of the model (tiny configurations, CPU)."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import EOS, PAD, random_ids, tiny_config, tiny_model

from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    sinusoidal_position_encoding,
)


# ------------------------------------------------------------------ §3.5 positional encoding
def paper_pe(pos: int, dim: int, d_model: int) -> float:
    angle = pos / 10000 ** ((dim - dim % 2) / d_model)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


def test_positional_encoding_is_the_papers_interleaved_formula():
    d_model = 32
    table = sinusoidal_position_encoding(torch.arange(200), d_model)
    for pos in (0, 1, 7, 63, 199):
        for dim in range(d_model):
            assert table[pos, dim].item() == pytest.approx(paper_pe(pos, dim, d_model), abs=1e-6)


def test_positions_past_the_table_are_computed_not_clipped():
    model = tiny_model(max_position_embeddings=8)
    module = model.model.encoder.embed_positions
    assert module.pe.shape[0] == 8
    beyond = module(seq_len=5, past_len=6)  # positions 6..10, past the 8-row table
    assert torch.allclose(beyond, sinusoidal_position_encoding(torch.arange(6, 11), 32))
    # and a whole model runs on inputs longer than max_position_embeddings
    out = model(input_ids=random_ids(1, 20), decoder_input_ids=random_ids(1, 12))
    assert out.logits.shape == (1, 12, 61)


def test_learned_positions_refuse_inputs_longer_than_their_table():
    model = tiny_model(max_position_embeddings=8, position_embedding_type="learned")
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        model(input_ids=random_ids(1, 9), decoder_input_ids=random_ids(1, 3))


def test_positional_table_is_refilled_after_from_pretrained(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    expected = sinusoidal_position_encoding(torch.arange(64), 32)
    assert torch.equal(loaded.model.encoder.embed_positions.pe, expected)
    assert torch.equal(loaded.model.decoder.embed_positions.pe, expected)


# ------------------------------------------------------------------ §3.4 embeddings
def test_embeddings_are_scaled_by_sqrt_d_model(model):
    ids = random_ids(2, 5)
    hidden = model.model.encoder(input_ids=ids, output_hidden_states=True).hidden_states[0]
    expected = model.model.shared(ids) * math.sqrt(32) + sinusoidal_position_encoding(torch.arange(5), 32)
    assert torch.allclose(hidden, expected, atol=1e-6)


def test_one_matrix_for_source_target_and_output_layer_survives_reload(tmp_path, model):
    shared = model.model.shared.weight
    assert model.model.encoder.embed_tokens.weight is shared
    assert model.model.decoder.embed_tokens.weight is shared
    assert model.lm_head.weight is shared
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.model.shared.weight is loaded.model.encoder.embed_tokens.weight
    assert loaded.model.decoder.embed_tokens.weight is loaded.model.shared.weight
    assert torch.equal(loaded.model.shared.weight, shared)


def test_untied_embeddings_are_three_matrices_with_none_left_unused(tmp_path):
    """tie_word_embeddings=False: source embedding, target embedding and output layer are separate, and no
    fourth `shared` matrix sits beside them unused (it would count as parameters and be saved)."""
    tied, untied = tiny_model(), tiny_model(tie_word_embeddings=False)
    vocab, d_model = untied.config.vocab_size, untied.config.d_model
    assert untied.num_parameters() - tied.num_parameters() == 2 * vocab * d_model
    assert untied.model.shared is None and untied.get_input_embeddings() is untied.model.encoder.embed_tokens
    matrices = {
        untied.model.encoder.embed_tokens.weight,
        untied.model.decoder.embed_tokens.weight,
        untied.lm_head.weight,
    }
    assert len({id(m) for m in matrices}) == 3
    src, tgt = random_ids(2, 5), random_ids(2, 4, seed=1)
    logits = untied(input_ids=src, labels=tgt).logits
    untied(input_ids=src, labels=tgt).loss.backward()
    assert all(p.grad is not None for p in untied.parameters())  # every parameter takes part
    untied.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded(input_ids=src, labels=tgt).logits, logits)
    assert loaded.model.shared is None and loaded.lm_head.weight is not loaded.model.decoder.embed_tokens.weight


# ------------------------------------------------------------------ §3.2.3 masking
def test_future_decoder_tokens_never_change_earlier_logits(model):
    src, tgt = random_ids(2, 6), random_ids(2, 7, seed=1)
    changed = tgt.clone()
    changed[:, 4:] = random_ids(2, 3, seed=2)
    a = model(input_ids=src, decoder_input_ids=tgt).logits
    b = model(input_ids=src, decoder_input_ids=changed).logits
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not torch.allclose(a[:, 4:], b[:, 4:], atol=1e-3)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_encoder_is_not_causal(attn):
    model = tiny_model()
    model.set_attn_implementation(attn)
    src = random_ids(1, 6)
    changed = src.clone()
    changed[0, -1] = 4 if src[0, -1] != 4 else 5
    first = model.model.encoder(input_ids=src).last_hidden_state[:, 0]
    first_changed = model.model.encoder(input_ids=changed).last_hidden_state[:, 0]
    assert not torch.allclose(first, first_changed, atol=1e-4)


# ------------------------------------------------------------------ padding invariance
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_sentence_alone_and_in_a_padded_batch_give_the_same_logits_and_beams(attn):
    model = tiny_model()
    model.set_attn_implementation(attn)
    short_src, long_src = random_ids(1, 4, seed=3), random_ids(1, 9, seed=4)
    short_tgt, long_tgt = random_ids(1, 3, seed=5), random_ids(1, 8, seed=6)
    src = torch.cat([F.pad(short_src, (0, 5), value=PAD), long_src])
    src_mask = torch.tensor([[1] * 4 + [0] * 5, [1] * 9])
    tgt = torch.cat([F.pad(short_tgt, (0, 5), value=PAD), long_tgt])
    tgt_mask = torch.tensor([[1] * 3 + [0] * 5, [1] * 8])

    alone = model(input_ids=short_src, decoder_input_ids=short_tgt).logits
    batched = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    assert torch.allclose(alone[0], batched.logits[0, :3], atol=1e-5)
    long_alone = model(input_ids=long_src, decoder_input_ids=long_tgt).logits
    assert torch.allclose(long_alone[0], batched.logits[1], atol=1e-5)

    beams_alone = model.generate(short_src, num_beams=4, max_new_tokens=10)
    beams_batched = model.generate(src, attention_mask=src_mask, num_beams=4, max_new_tokens=10)
    assert torch.equal(beams_alone[0], beams_batched[0, : beams_alone.shape[1]])
    assert (beams_batched[0, beams_alone.shape[1] :] == PAD).all()


@pytest.mark.parametrize("num_beams", [1, 4])
def test_finished_sentences_are_padded_with_pad_not_eos(num_beams):
    """Sentence i ends at step i + 2; what follows its </s> is <pad> in greedy and in beam search (plain
    transformers 5 fills finished beams with </s> when the pad id is 0, which inflates non-pad lengths)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class EndAt(LogitsProcessor):
        def __call__(self, input_ids, scores):
            sentence = torch.arange(input_ids.shape[0]) // num_beams
            scores = scores.clone()
            scores[sentence + 2 == input_ids.shape[1], EOS] = 100.0
            return scores

    out = tiny_model().generate(
        random_ids(3, 9, seed=2), num_beams=num_beams, max_new_tokens=8, logits_processor=LogitsProcessorList([EndAt()])
    )
    assert out.shape == (3, 5)
    for i, row in enumerate(out.tolist()):
        assert row[i + 2] == EOS and EOS not in row[1 : i + 2] and row[i + 3 :] == [PAD] * (2 - i), row


# ------------------------------------------------------------------ KV cache
@pytest.mark.parametrize("config", [{}, {"norm_first": True}, {"position_embedding_type": "learned"}])
def test_cache_gives_the_same_logits_as_full_recomputation(config):
    model = tiny_model(**config)
    src, tgt = random_ids(2, 6), random_ids(2, 5, seed=1)
    full = model(input_ids=src, decoder_input_ids=tgt, use_cache=False).logits
    encoder_outputs = model.get_encoder()(input_ids=src)
    cache, steps = None, []
    for t in range(tgt.shape[1]):
        out = model(encoder_outputs=encoder_outputs, decoder_input_ids=tgt[:, t : t + 1], cache=cache, use_cache=True)
        cache = out.cache
        steps.append(out.logits)
    assert cache.get_seq_length() == tgt.shape[1]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_with_and_without_cache_is_token_identical(num_beams):
    model = tiny_model()
    src = random_ids(3, 7)
    with_cache = model.generate(src, num_beams=num_beams, max_new_tokens=12, use_cache=True)
    without = model.generate(src, num_beams=num_beams, max_new_tokens=12, use_cache=False)
    assert torch.equal(with_cache, without)


def test_cross_attention_keys_are_computed_once_and_reused(model):
    calls = []
    layer = model.model.decoder.layers[0].encoder_attn
    handle = layer.k_proj.register_forward_hook(lambda *args: calls.append(1))
    model.generate(random_ids(1, 5), num_beams=1, max_new_tokens=6, min_new_tokens=6)
    handle.remove()
    assert len(calls) == 1


# ------------------------------------------------------------------ eager vs sdpa
def test_eager_and_sdpa_agree_on_outputs_and_gradients():
    src, tgt = random_ids(2, 6), random_ids(2, 5, seed=1)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    results = {}
    for attn in ("eager", "sdpa"):
        model = tiny_model()
        model.set_attn_implementation(attn)
        out = model(input_ids=src, attention_mask=mask, labels=tgt)
        out.loss.backward()
        results[attn] = (out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    assert torch.allclose(results["eager"][0], results["sdpa"][0], atol=1e-5)
    for name, grad in results["eager"][1].items():
        assert torch.allclose(grad, results["sdpa"][1][name], atol=1e-5), name


def test_attention_weights_are_distributions_and_sdpa_returns_the_eager_ones():
    """``output_attentions=True`` returns the weights under every attention implementation: SDPA computes no
    weights, so the layers asked for them run the eager computation (with SDPA's masks), and give eager's
    outputs."""
    mask = torch.tensor([[1, 1, 1, 0]])
    inputs = dict(input_ids=random_ids(1, 4), attention_mask=mask, decoder_input_ids=random_ids(1, 3))
    outputs = {}
    for attn in ("sdpa", "eager"):
        model = tiny_model()
        model.set_attn_implementation(attn)
        outputs[attn] = model(**inputs, output_attentions=True)
    out = outputs["eager"]
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == len(out.cross_attentions) == 2
    assert out.encoder_attentions[0].shape == (1, 4, 4, 4)
    for weights in (*out.encoder_attentions, *out.decoder_attentions, *out.cross_attentions):
        assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5)
    assert (out.encoder_attentions[0][..., 3] == 0).all()  # the padded key gets no attention
    assert (out.decoder_attentions[0].triu(diagonal=1) == 0).all()  # no attention to the future
    for name in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
        for sdpa, eager in zip(getattr(outputs["sdpa"], name), getattr(out, name), strict=True):
            assert torch.allclose(sdpa, eager, atol=1e-6)
    assert torch.allclose(outputs["sdpa"].logits, out.logits, atol=1e-5)


# ------------------------------------------------------------------ training utilities
def test_loss_is_mean_cross_entropy_over_labels_that_are_not_ignored(model):
    src, labels = random_ids(2, 5), random_ids(2, 6, seed=1)
    labels[1, 4:] = -100
    out = model(input_ids=src, labels=labels)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    assert decoder_input_ids[0, 0] == model.config.decoder_start_token_id
    assert torch.equal(decoder_input_ids[:, 1:5], torch.where(labels[:, :4] == -100, PAD, labels[:, :4]))
    logits = model(input_ids=src, decoder_input_ids=decoder_input_ids).logits
    keep = labels != -100
    expected = -torch.log_softmax(logits, -1)[keep].gather(-1, labels[keep][:, None]).mean()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # with num_items_in_batch (gradient accumulation): sum over tokens / given count
    summed = model(input_ids=src, labels=labels, num_items_in_batch=20).loss
    assert summed.item() == pytest.approx(expected.item() * keep.sum().item() / 20, rel=1e-5)


@pytest.mark.parametrize("bf16", [False, True])
def test_loss_without_logits_equals_the_plain_loss_in_value_and_gradients(bf16):
    """skip_logits=True (block-wise linear + cross-entropy, gradients computed block by block) gives
    the loss, the NLL and every parameter gradient of the plain path; several blocks, ignored labels."""
    from vanilla_transformer.kernels_vanilla_transformer import linear_cross_entropy_sums

    src, labels = random_ids(3, 7), random_ids(3, 6, seed=1)
    labels[0, 2:] = -100
    results = []
    for skip in (False, True):
        model = tiny_model()  # same seed, same weights
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=src, labels=labels, smoothing=0.1, skip_logits=skip, num_items_in_batch=7)
        out.loss.backward()
        results.append((out.loss.item(), out.nll_loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss0, nll0, grads0), (loss1, nll1, grads1) = results
    tolerance = 2e-2 if bf16 else 1e-5  # bf16: the two paths round their matmuls at different points
    assert loss1 == pytest.approx(loss0, rel=tolerance) and nll1 == pytest.approx(nll0, rel=tolerance)
    scale = max(
        g.abs().max().item() for g in grads0.values()
    )  # some gradients are exactly zero in theory (k_proj.bias)
    for name in grads0:
        assert (grads0[name] - grads1[name]).abs().max().item() <= tolerance * scale, name
    # no gradient tracking gives the same sums
    hidden, weight = torch.randn(10, 32), torch.randn(61, 32)
    targets = torch.randint(0, 61, (10,))
    full = linear_cross_entropy_sums(hidden, weight, targets, 0.1)
    with torch.no_grad():
        untracked = linear_cross_entropy_sums(hidden, weight, targets, 0.1)
    assert torch.allclose(torch.stack(full), torch.stack(untracked), rtol=1e-6)


def test_the_loss_workspace_is_the_callers_and_the_model_keeps_no_state():
    """With ``loss_workspace`` the logits are kept in the caller's dict between forward and backward, with the
    same loss and gradients as without it; the model holds nothing between calls."""
    src, tgt = random_ids(2, 6), random_ids(2, 5, seed=1)
    results = []
    for workspace in (None, {}):
        model = tiny_model().train()
        before = set(vars(model))
        out = model(input_ids=src, labels=tgt, skip_logits=True, smoothing=0.1, loss_workspace=workspace)
        out.loss.backward()
        assert set(vars(model)) == before  # no attribute added by a training step
        results.append((out.loss.detach(), model.lm_head.weight.grad.clone()))
        if workspace is not None:
            assert workspace["logits"].numel() == 2 * 5 * model.config.vocab_size
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_skip_logits_needs_labels(model):
    with pytest.raises(ValueError, match="skip_logits=True needs `labels`"):
        model(input_ids=random_ids(1, 4), decoder_input_ids=random_ids(1, 3), skip_logits=True)


def test_gradient_checkpointing_gives_the_same_gradients():
    src, tgt = random_ids(2, 6), random_ids(2, 5, seed=1)
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(dropout=0.0).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert all(layer.gradient_checkpointing for layer in model.model.encoder.layers)
        model(input_ids=src, labels=tgt).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


def test_dropout_is_active_in_training_and_off_in_eval():
    """§5.4: dropout on embeddings + positions (and on every sub-layer output) in training, none in eval. The
    encoder's first hidden state (embeddings × √d_model + positions, after dropout) has about p of its elements
    zeroed and the rest scaled by 1/(1-p); a training pass is reproducible from its seed."""
    model = tiny_model(dropout=0.3)
    src, tgt = random_ids(8, 16), random_ids(8, 5, seed=1)

    def run(seed):
        torch.manual_seed(seed)
        return model(input_ids=src, decoder_input_ids=tgt, output_hidden_states=True)

    clean = run(0)
    assert torch.equal(clean.logits, run(1).logits) and (clean.encoder_hidden_states[0] != 0).all()
    model.train()
    dropped, again, other = run(0), run(0), run(1)
    assert torch.equal(dropped.logits, again.logits) and not torch.equal(dropped.logits, other.logits)
    first, reference = dropped.encoder_hidden_states[0], clean.encoder_hidden_states[0]
    zeroed = first == 0
    assert abs(zeroed.float().mean().item() - 0.3) < 0.05
    torch.testing.assert_close(first[~zeroed], reference[~zeroed] / 0.7, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ sizes of Table 3
def count_parameters(config: VanillaTransformerConfig) -> int:
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    return sum(p.numel() for p in model.parameters())  # tied matrices counted once


@pytest.mark.parametrize("preset, paper_millions", [("base", 65), ("big", 213)])
def test_preset_parameter_counts_match_the_paper(preset, paper_millions):
    """Within 3.5 % of Table 3's 65M and 213M (base: 63,045,632, big: 214,171,648 with 37,000 tokens); the paper
    does not say how it counted (its vocabulary size is approximate, and it may count shared matrices per use)."""
    count = count_parameters(getattr(VanillaTransformerConfig, preset)(vocab_size=37000))
    print(f"{preset}: {count:,} parameters (paper: {paper_millions}M)")
    assert abs(count / (paper_millions * 1e6) - 1) < 0.035


# ------------------------------------------------------------------ head size d_k = d_v apart from d_model / h
# (config.head_dim)
#: h·d_k ≠ d_model (32): smaller heads, larger heads, and head counts that do not divide d_model (3 and 5)
HEAD_DIMS = [
    dict(head_dim=4),
    dict(head_dim=16),
    dict(encoder_attention_heads=3, decoder_attention_heads=5, head_dim=12),
]
HEAD_DIM_IDS = ["4 heads of 4", "4 heads of 16", "3 and 5 heads of 12"]


def formula_parameter_count(c: VanillaTransformerConfig) -> int:
    """Parameters by the formula: the shared embedding (V × d_model), then per layer each attention's
    W^Q, W^K, W^V (d_model × h·d_k) and W^O (h·d_k × d_model), with biases only if ``attention_bias``, the FFN
    and the LayerNorms."""
    d, biased = c.d_model, int(c.attention_bias)

    def attention(heads: int) -> int:
        width = heads * (c.head_dim or d // heads)
        return 3 * (d * width + biased * width) + width * d + biased * d

    def ffn(d_ff: int) -> int:
        return d * d_ff + d_ff + d_ff * d + d

    encoder_layer = attention(c.encoder_attention_heads) + ffn(c.encoder_ffn_dim) + 2 * 2 * d
    decoder_layer = 2 * attention(c.decoder_attention_heads) + ffn(c.decoder_ffn_dim) + 3 * 2 * d
    return c.vocab_size * d + c.encoder_layers * encoder_layer + c.decoder_layers * decoder_layer


def test_without_head_dim_the_model_is_the_papers_with_d_k_d_model_over_h():
    """head_dim=None: every attention matrix d_model × d_model, as before the field existed; and head_dim = d_model / h
    explicitly gives the same parameters, weights and logits."""
    default, explicit = tiny_model(), tiny_model(head_dim=8)
    shapes = {name: tuple(p.shape) for name, p in default.state_dict().items()}
    assert shapes == {name: tuple(p.shape) for name, p in explicit.state_dict().items()}
    attention = default.model.decoder.layers[0].encoder_attn
    assert attention.head_dim == 8 and attention.scaling == 8**-0.5
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert shapes[f"model.encoder.layers.0.self_attn.{proj}.weight"] == (32, 32)
    src, tgt = random_ids(2, 6), random_ids(2, 5, seed=1)
    assert torch.equal(
        default(input_ids=src, decoder_input_ids=tgt).logits, explicit(input_ids=src, decoder_input_ids=tgt).logits
    )
    assert count_parameters(VanillaTransformerConfig.base()) == formula_parameter_count(VanillaTransformerConfig.base())


# ------------------------------------------------------------------ §3.2.2 the projections: matrices, biases
# only when asked
# flex attention: torch 2.13's CPU kernel is exact from head size 32 on (it was not for 8 and 16: see the model's check)
FLEX = dict(d_model=64, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128)


def test_multi_head_attention_is_the_papers_equations_without_biases():
    """MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V): no bias
    anywhere in the attention, computed here head by head from the module's matrices, for encoder–decoder attention
    (queries from the decoder, keys and values from the encoder)."""
    model = tiny_model()
    assert not model.config.attention_bias
    assert not [name for name, _ in model.named_parameters() if "_proj.bias" in name]
    attention = model.model.decoder.layers[0].encoder_attn
    queries, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    heads = []
    for i in range(4):  # W_i^Q, W_i^K, W_i^V: rows i·d_k … (i+1)·d_k of each stored matrix
        rows = slice(8 * i, 8 * (i + 1))
        q = queries @ attention.q_proj.weight[rows].T
        k, v = memory @ attention.k_proj.weight[rows].T, memory @ attention.v_proj.weight[rows].T
        heads.append(torch.softmax(q @ k.transpose(1, 2) / math.sqrt(8), dim=-1) @ v)
    by_hand = torch.cat(heads, dim=-1) @ attention.out_proj.weight.T
    with torch.no_grad():
        output, _ = attention(queries, key_value_states=memory)
    torch.testing.assert_close(output, by_hand, atol=1e-5, rtol=1e-5)


def test_attention_bias_gives_every_projection_a_bias_that_every_backend_uses():
    """``attention_bias=True`` (Marian's and fairseq's projections): Q, K, V and O each get a bias, the count grows by
    them, and eager, sdpa and flex attention all compute with them (the Q, V and O biases change the output; a K bias
    adds the same amount to all of a query's scores, which softmax ignores)."""
    plain, biased = tiny_model(**FLEX), tiny_model(**FLEX, attention_bias=True)
    assert sum(p.numel() for p in biased.parameters()) == formula_parameter_count(biased.config)
    assert (
        formula_parameter_count(biased.config) - formula_parameter_count(plain.config) == (2 + 2 * 2) * 4 * 64
    )  # 6 attentions, 4 biases of 64
    with torch.no_grad():
        for name, linear in biased.named_modules():
            if name.endswith("_proj"):
                torch.nn.init.normal_(linear.bias, 0.0, 0.5)
    src, tgt = random_ids(2, 7), random_ids(2, 6, seed=1)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    logits = {}
    with torch.no_grad():
        for attn in ("eager", "sdpa", "flex_attention"):
            biased.set_attn_implementation(attn)
            logits[attn] = biased(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        torch.testing.assert_close(logits["sdpa"], logits["eager"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits["flex_attention"], logits["eager"], atol=1e-5, rtol=1e-5)
        biased.set_attn_implementation("eager")
        attention = biased.model.decoder.layers[0].encoder_attn
        queries, memory = torch.randn(2, 3, 64), torch.randn(2, 5, 64)
        before = attention(queries, key_value_states=memory)[0]
        for proj, changes in (("k_proj", False), ("q_proj", True), ("v_proj", True), ("out_proj", True)):
            getattr(attention, proj).bias.add_(1.0)
            after = attention(queries, key_value_states=memory)[0]
            assert torch.allclose(after, before, atol=1e-5) != changes, proj
            before = after


def test_a_checkpoint_saved_before_attention_bias_existed_loads_with_its_biases_and_outputs():
    """A folder saved by the package when every attention projection had a bias (its config.json has no
    ``attention_bias``): it loads with the biases, gives the logits and beams it gave then, and saves the flag."""
    folder = Path(__file__).parent / "fixtures" / "saved-with-attention-biases"
    assert "attention_bias" not in json.loads((folder / "config.json").read_text())
    expected = json.loads((folder / "expected.json").read_text())
    model = VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()
    assert model.config.attention_bias and model.model.encoder.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    src, tgt = torch.tensor(expected["input_ids"]), torch.tensor(expected["decoder_input_ids"])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=src, decoder_input_ids=tgt).logits, torch.tensor(expected["logits"]))
        assert model.generate(src, num_beams=2, max_new_tokens=6).tolist() == expected["generated"]
    assert VanillaTransformerConfig.from_json_file(folder / "config.json").attention_bias
    assert VanillaTransformerConfig.from_dict(model.config.to_dict()).attention_bias  # re-saved, it says so
    assert not VanillaTransformerConfig.from_dict({**model.config.to_dict(), "attention_bias": False}).attention_bias


@pytest.mark.parametrize("overrides", HEAD_DIMS, ids=HEAD_DIM_IDS)
def test_head_dim_sets_the_projection_shapes_scaling_and_parameter_count(overrides):
    model = tiny_model(**overrides)
    config, d_k = model.config, overrides["head_dim"]
    for layer, heads in (
        (model.model.encoder.layers[0].self_attn, config.encoder_attention_heads),
        (model.model.decoder.layers[1].self_attn, config.decoder_attention_heads),
        (model.model.decoder.layers[1].encoder_attn, config.decoder_attention_heads),
    ):
        assert layer.head_dim == d_k and layer.scaling == d_k**-0.5
        for proj in (layer.q_proj, layer.k_proj, layer.v_proj):
            assert tuple(proj.weight.shape) == (heads * d_k, 32)
        assert tuple(layer.out_proj.weight.shape) == (32, heads * d_k)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(config) == formula_parameter_count(config)
    assert formula_parameter_count(config) != formula_parameter_count(tiny_config())


@pytest.mark.parametrize("overrides", HEAD_DIMS, ids=HEAD_DIM_IDS)
def test_head_dim_eager_and_sdpa_agree_and_padding_changes_nothing(overrides):
    short_src, long_src = random_ids(1, 4, seed=3), random_ids(1, 9, seed=4)
    short_tgt, long_tgt = random_ids(1, 3, seed=5), random_ids(1, 8, seed=6)
    src = torch.cat([F.pad(short_src, (0, 5), value=PAD), long_src])
    src_mask = torch.tensor([[1] * 4 + [0] * 5, [1] * 9])
    tgt = torch.cat([F.pad(short_tgt, (0, 5), value=PAD), long_tgt])
    tgt_mask = torch.tensor([[1] * 3 + [0] * 5, [1] * 8])
    logits = {}
    for attn in ("eager", "sdpa"):
        model = tiny_model(**overrides)
        model.set_attn_implementation(attn)
        batched = model(
            input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
        ).logits
        alone = model(input_ids=short_src, decoder_input_ids=short_tgt).logits
        torch.testing.assert_close(alone[0], batched[0, :3], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            model(input_ids=long_src, decoder_input_ids=long_tgt).logits[0], batched[1], atol=1e-5, rtol=1e-5
        )
        logits[attn] = batched
    torch.testing.assert_close(logits["eager"], logits["sdpa"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", HEAD_DIMS, ids=HEAD_DIM_IDS)
@pytest.mark.parametrize("num_beams", [1, 4])
def test_head_dim_generation_with_and_without_cache_is_token_identical(overrides, num_beams):
    model = tiny_model(**overrides)
    src, mask = random_ids(3, 7), torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    with_cache = model.generate(src, attention_mask=mask, num_beams=num_beams, max_new_tokens=12, use_cache=True)
    without = model.generate(src, attention_mask=mask, num_beams=num_beams, max_new_tokens=12, use_cache=False)
    assert torch.equal(with_cache, without)
    # and step by step with the cache, as generate's steps, the logits of the whole target at once
    tgt = random_ids(3, 5, seed=1)
    full = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    encoder_outputs, cache, steps = model.get_encoder()(input_ids=src, attention_mask=mask), None, []
    for t in range(tgt.shape[1]):
        out = model(
            encoder_outputs=encoder_outputs,
            attention_mask=mask,
            decoder_input_ids=tgt[:, t : t + 1],
            cache=cache,
            use_cache=True,
        )
        cache, _ = out.cache, steps.append(out.logits)
    assert cache.self_attention_cache.layers[0].keys.shape[1:] == (
        model.config.decoder_attention_heads,
        5,
        overrides["head_dim"],
    )
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", HEAD_DIMS, ids=HEAD_DIM_IDS)
def test_head_dim_survives_save_and_from_pretrained(overrides, tmp_path):
    model = tiny_model(**overrides)
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.head_dim == overrides["head_dim"]
    src, tgt = random_ids(2, 6), random_ids(2, 5, seed=1)
    assert torch.equal(
        loaded(input_ids=src, decoder_input_ids=tgt).logits, model(input_ids=src, decoder_input_ids=tgt).logits
    )
    assert torch.equal(loaded.generate(src, max_new_tokens=8), model.generate(src, max_new_tokens=8))


# ------------------------------------------------------------------ §6.1 generation defaults
def test_the_class_keeps_transformers_decoding_and_the_papers_limit_and_checkpoints_carry_the_papers(tmp_path):
    """A bare model decodes with transformers' defaults (greedy) plus the §6.1 per-sentence limit; the paper's
    beam 4 and α 0.6 (PAPER_DECODING) are what the package's checkpoints carry in generation_config.json."""
    from vanilla_transformer.modeling_vanilla_transformer import PAPER_DECODING

    model = VanillaTransformerForConditionalGeneration(tiny_config())
    assert model.generation_config.num_beams in (None, 1) and model.generation_config.source_length_offset == 50
    assert PAPER_DECODING == {"num_beams": 4, "length_penalty": 0.6, "source_length_offset": 50}
    model.generation_config.update(**PAPER_DECODING)
    model.save_pretrained(tmp_path)
    saved = (tmp_path / "generation_config.json").read_text()
    assert '"num_beams": 4' in saved and '"length_penalty": 0.6' in saved and '"source_length_offset": 50' in saved
    assert type(model).from_pretrained(tmp_path).generation_config.num_beams == 4


def test_without_a_length_each_sentence_may_produce_source_length_plus_50_tokens():
    model = tiny_model()
    model.generation_config.num_beams = 1
    src = torch.cat([F.pad(random_ids(1, 3), (0, 4), value=PAD), random_ids(1, 7, seed=1)])
    mask = (src != PAD).long()
    from transformers import LogitsProcessor, LogitsProcessorList

    class NeverEos(LogitsProcessor):  # so that every row runs into its limit
        def __call__(self, input_ids, scores):
            scores = scores.clone()
            return scores.index_fill_(1, torch.tensor([EOS]), -1e9)

    out = model.generate(src, attention_mask=mask, logits_processor=LogitsProcessorList([NeverEos()]))
    lengths = [(row[1:] != PAD).sum().item() for row in out]  # new tokens, eos included
    assert lengths == [3 + 50, 7 + 50]
    assert out[0, 3 + 50] == EOS and out[1, 7 + 50] == EOS
    # an explicit length from the caller wins
    assert model.generate(src, attention_mask=mask, max_new_tokens=5).shape[1] <= 6


# ------------------------------------------------------------------ save / reload
def test_save_and_reload_give_identical_generations(tmp_path, model):
    src = random_ids(2, 6)
    before = model.generate(src, max_new_tokens=10)
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(loaded.generate(src, max_new_tokens=10), before)
    from transformers import AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert type(auto) is VanillaTransformerForConditionalGeneration
    assert torch.equal(auto.generate(src, max_new_tokens=10), before)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(input_ids=torch.tensor([[4, 5, 61]])), "token id 61, outside the model's vocabulary [0, 61)"),
        (dict(input_ids=torch.tensor([[4, -1, 5]])), "token id -1"),
        (dict(input_ids=torch.tensor([[4.0, 5.0]])), "integer token ids"),
        (dict(input_ids=torch.zeros(0, 4, dtype=torch.long)), "empty"),
        (dict(input_ids=torch.zeros(2, 0, dtype=torch.long)), "empty"),
        (dict(input_ids=torch.tensor([[4, 5, 6]]), attention_mask=torch.ones(1, 4)), "shape (1, 4) but its ids"),
        (dict(input_ids=torch.tensor([4, 5, 6])), "shape [batch, sequence]"),
        (dict(input_ids=torch.tensor([[4, 5]]), decoder_input_ids=torch.tensor([[1, 99]])), "decoder_input_ids"),
        (dict(input_ids=torch.tensor([[4, 5]]), labels=torch.tensor([[70, -100]])), "`labels` holds token id 70"),
        (
            dict(
                input_ids=torch.tensor([[4, 5]]),
                decoder_input_ids=torch.tensor([[1, 4]]),
                decoder_attention_mask=torch.ones(2, 2),
            ),
            "`decoder_attention_mask` has shape (2, 2)",
        ),
    ],
)
def test_bad_inputs_raise_value_errors_that_say_what_is_wrong(model, kwargs, words):
    if "labels" not in kwargs:
        kwargs.setdefault("decoder_input_ids", torch.tensor([[1, 4]]))
    with pytest.raises(ValueError) as error:
        model(**kwargs)
    assert words in str(error.value)


# ------------------------------------------------------------------ what transformers expects of a model
def _flat(values) -> list:
    """Tensors of a (nested) tuple, in order; caches by their keys and values."""
    from transformers.cache_utils import EncoderDecoderCache

    flat = []
    for value in values:
        if isinstance(value, EncoderDecoderCache):
            for sub in (value.self_attention_cache, value.cross_attention_cache):
                flat += [t for layer in sub.layers for t in (layer.keys, layer.values)]
        elif isinstance(value, (tuple, list)):
            flat += _flat(value)
        else:
            flat.append(value)
    return flat


@pytest.mark.parametrize(
    "head, extra",
    [(head, extra) for head in (False, True) for extra in ({}, {"output_hidden_states": True}, {"use_cache": True})]
    + [(True, {"labels": True})],
)
def test_return_dict_false_returns_the_outputs_tuple(head, extra):
    """As every transformers model: ``return_dict=False`` (argument or config) gives ``to_tuple()`` of the output."""
    model = tiny_model()
    base = model if head else model.model
    src, tgt = random_ids(2, 6), random_ids(2, 5, seed=1)
    kwargs = dict(input_ids=src, attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]), decoder_input_ids=tgt)
    kwargs.update({"labels": tgt} if extra.get("labels") else extra)
    expected = base(**kwargs, return_dict=True).to_tuple()
    got = base(**kwargs, return_dict=False)
    assert type(got) is tuple and len(got) == len(expected)
    for a, b in zip(_flat(got), _flat(expected), strict=True):
        assert torch.equal(a, b)
    base.config.return_dict = False
    assert type(base(**kwargs)) is tuple


def test_flex_attention_gives_eager_outputs_and_tokens_with_and_without_cache():
    src, tgt = random_ids(2, 7), random_ids(2, 6, seed=1)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    models = {}
    for attn in ("eager", "flex_attention"):
        models[attn] = tiny_model(**FLEX)
        models[attn].set_attn_implementation(attn)
    with torch.no_grad():  # flex attention has no backward on CPU (torch raises NotImplementedError)
        full = {name: m(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits for name, m in models.items()}
        torch.testing.assert_close(full["flex_attention"], full["eager"], atol=1e-5, rtol=1e-5)
        encoder_outputs = models["flex_attention"].get_encoder()(input_ids=src, attention_mask=mask)
        first = models["flex_attention"](
            encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt[:, :4], use_cache=True
        )
        then = models["flex_attention"](
            encoder_outputs=encoder_outputs,
            attention_mask=mask,
            decoder_input_ids=tgt[:, 4:],
            cache=first.cache,
            use_cache=True,
        )
        torch.testing.assert_close(torch.cat([first.logits, then.logits], 1), full["eager"], atol=1e-5, rtol=1e-5)
    for num_beams in (1, 3):
        tokens = [m.generate(src, attention_mask=mask, num_beams=num_beams, max_new_tokens=4) for m in models.values()]
        assert torch.equal(*tokens)


def test_flex_attention_refuses_head_sizes_its_cpu_kernel_got_wrong():
    model = tiny_model()  # head size 8
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match="head size 8"):
        model(input_ids=random_ids(1, 4), decoder_input_ids=random_ids(1, 3))
    with pytest.raises(ValueError, match="head size 8"):  # generate() calls the encoder and decoder directly
        model.generate(random_ids(1, 4), max_new_tokens=2)


def test_flex_attention_checks_the_real_head_size_head_dim_sets():
    """d_model 32 with 4 heads of head_dim 32 runs (d_model / heads would be 8) and equals eager; d_model 64 with
    2 heads of head_dim 16 is refused (d_model / heads would be 32)."""
    src, tgt = random_ids(2, 7), random_ids(2, 6, seed=1)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    logits = {}
    for attn in ("eager", "flex_attention"):
        model = tiny_model(head_dim=32)
        model.set_attn_implementation(attn)
        with torch.no_grad():
            logits[attn] = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(logits["flex_attention"], logits["eager"], atol=1e-5, rtol=1e-5)
    model = tiny_model(**{**FLEX, "head_dim": 16})
    model.set_attn_implementation("flex_attention")
    with pytest.raises(ValueError, match=r"head size 16 \(head_dim=16\)"):
        model(input_ids=src, decoder_input_ids=tgt)


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="torch's flex attention has no backward on CPU; its gradients are checked on a GPU",
)
def test_flex_attention_gradients_equal_eager_on_a_gpu():
    src, tgt = random_ids(2, 7).cuda(), random_ids(2, 6, seed=1).cuda()
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2]).cuda()
    grads = {}
    for attn in ("eager", "flex_attention"):
        model = tiny_model(**FLEX).cuda()
        model.set_attn_implementation(attn)
        model(input_ids=src, attention_mask=mask, labels=tgt).loss.backward()
        grads[attn] = {name: p.grad for name, p in model.named_parameters()}
    for name, grad in grads["eager"].items():
        torch.testing.assert_close(grads["flex_attention"][name], grad, atol=1e-4, rtol=1e-4)


def _capability_inputs():
    return dict(
        input_ids=random_ids(2, 7),
        attention_mask=torch.tensor([[1] * 7, [1] * 5 + [0] * 2]),
        decoder_input_ids=random_ids(2, 5, seed=1),
    )


def test_the_forward_compiles_as_one_graph_and_gives_the_eager_outputs():
    """torch.compile(fullgraph=True) fails on any graph break: the input checks, which branch on token values,
    are skipped while compiling (and still raise in eager mode: test_bad_inputs_raise_value_errors...)."""
    model, inputs = tiny_model(), _capability_inputs()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs).logits, model(**inputs).logits)


def test_torch_export_of_the_forward_gives_the_eager_outputs():
    model, inputs = tiny_model(), _capability_inputs()
    exported = torch.export.export(model, args=(), kwargs={**inputs, "use_cache": False})
    other = {**inputs, "input_ids": random_ids(2, 7, seed=7)}  # same shapes, other tokens
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(**other, use_cache=False).logits, model(**other).logits)


@pytest.mark.parametrize("attn, num_beams", [("sdpa", 1), ("sdpa", 4), ("eager", 1), ("eager", 4)])
def test_static_cache_generation_gives_the_dynamic_caches_tokens(attn, num_beams):
    model, inputs = tiny_model(), _capability_inputs()
    model.set_attn_implementation(attn)
    del inputs["decoder_input_ids"]
    dynamic = model.generate(**inputs, num_beams=num_beams, max_new_tokens=6)
    static = model.generate(**inputs, num_beams=num_beams, max_new_tokens=6, cache_implementation="static")
    assert torch.equal(static, dynamic)


def test_head_dim_compiles_as_one_graph_and_static_caches_hold_its_heads():
    """h·d_k ≠ d_model under torch.compile(fullgraph=True) and with static caches: transformers' StaticCache sizes its
    layers from the first keys it gets (h heads of head_dim), and decoding gives the dynamic cache's tokens."""
    from transformers import CompileConfig

    model, inputs = tiny_model(**HEAD_DIMS[2]), _capability_inputs()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs).logits, model(**inputs).logits)
    del inputs["decoder_input_ids"]
    for num_beams in (1, 4):
        dynamic = model.generate(**inputs, num_beams=num_beams, max_new_tokens=6)
        static = model.generate(
            **inputs,
            num_beams=num_beams,
            max_new_tokens=6,
            cache_implementation="static",
            return_dict_in_generate=num_beams == 1,
        )
        if num_beams == 1:
            layer = static.cache.self_attention_cache.layers[0]
            assert type(layer).__name__ == "StaticLayer" and (layer.num_heads, layer.k_head_dim) == (5, 12)
            static = static.sequences
        assert torch.equal(static, dynamic)
    config = CompileConfig(fullgraph=True, backend="aot_eager", mode=None)
    config._compile_all_devices = True
    torch._dynamo.reset()
    tokens = model.generate(
        **inputs, num_beams=1, max_new_tokens=6, cache_implementation="static", compile_config=config
    )
    assert model._compiled_call is not None and torch.equal(
        tokens, model.generate(**inputs, num_beams=1, max_new_tokens=6)
    )


def test_static_cache_decoding_compiles_as_one_graph():
    """generate() compiles each decoding step when the cache is static (here on CPU too, with fullgraph=True:
    a graph break fails)."""
    from transformers import CompileConfig

    assert VanillaTransformerForConditionalGeneration._can_compile_fullgraph
    model, inputs = tiny_model(), _capability_inputs()
    del inputs["decoder_input_ids"]
    config = CompileConfig(fullgraph=True, backend="aot_eager", mode=None)
    config._compile_all_devices = True
    torch._dynamo.reset()
    compiled = model.generate(
        **inputs, num_beams=1, max_new_tokens=6, cache_implementation="static", compile_config=config
    )
    assert model._compiled_call is not None
    assert torch.equal(compiled, model.generate(**inputs, num_beams=1, max_new_tokens=6))
