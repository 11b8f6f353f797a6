"""Property tests (hypothesis): equivalences that must hold for every tiny model and padded batch.

Each example draws a random tiny configuration (width, heads, head size, layers, FFN size, vocabulary, and the
deviation flags: pre-LN, learned positions, unscaled or untied embeddings, a small sinusoid table),
an attention implementation, a weight seed, and a batch of 1-4 right-padded source and target rows
of 1-12 tokens (every row keeps at least one real token). Dropout is 0, the model is in eval mode
and float32. Tolerances are absolute (``rtol=0``) and stated in each test's docstring.
"""

import tempfile
from dataclasses import dataclass

import torch
from conftest import PAD
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

MAX_LEN = 12  # longest source / target row
MAX_NEW_TOKENS = 8  # longest generation
FIRST_ORDINARY_ID = 4  # ids 0..3 are pad, bos, eos, unk
ATOL = 1e-5

PROPERTY_SETTINGS = settings(max_examples=25, deadline=None)


# ------------------------------------------------------------------ strategies
@st.composite
def config_kwargs(draw) -> dict:
    """Keyword arguments of a tiny ``VanillaTransformerConfig`` with dropout 0."""
    d_model = draw(st.sampled_from([8, 16, 32]))
    head_dim = draw(st.sampled_from([None, None, 4, 12]))  # None: d_model / heads, so heads must divide d_model
    heads = st.sampled_from([h for h in (1, 2, 4, 8) if d_model % h == 0] if head_dim is None else [1, 2, 3, 4, 5])
    learned = draw(st.booleans())
    # Learned positions must cover every position used; sinusoids past the table are computed on the fly.
    min_positions = max(MAX_LEN, MAX_NEW_TOKENS + 1) if learned else 1
    return dict(
        vocab_size=draw(st.integers(20, 80)),
        d_model=d_model,
        encoder_layers=draw(st.integers(1, 2)),
        decoder_layers=draw(st.integers(1, 2)),
        encoder_attention_heads=draw(heads),
        decoder_attention_heads=draw(heads),
        head_dim=head_dim,
        encoder_ffn_dim=draw(st.sampled_from([8, 16, 64])),
        decoder_ffn_dim=draw(st.sampled_from([8, 16, 64])),
        dropout=0.0,
        max_position_embeddings=draw(st.integers(min_positions, 64)),
        norm_first=draw(st.booleans()),
        position_embedding_type="learned" if learned else "sinusoidal",
        scale_embedding=draw(st.booleans()),
        tie_word_embeddings=draw(st.booleans()),
    )


@st.composite
def padded_batch(draw, vocab_size: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids ``[batch, width]`` of ordinary tokens and their 1/0 mask; each row has >= 1 real token."""
    width = draw(st.integers(1, MAX_LEN))
    rows, lengths = [], []
    for _ in range(batch):
        length = draw(st.integers(1, width))
        tokens = draw(st.lists(st.integers(FIRST_ORDINARY_ID, vocab_size - 1), min_size=length, max_size=length))
        rows.append(tokens + [PAD] * (width - length))
        lengths.append(length)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return torch.tensor(rows), mask


@dataclass
class Case:
    """One drawn model and batch."""

    config: dict
    attn: str
    seed: int
    src: torch.Tensor
    src_mask: torch.Tensor
    tgt: torch.Tensor
    tgt_mask: torch.Tensor

    def model(self) -> VanillaTransformerForConditionalGeneration:
        torch.manual_seed(self.seed)
        model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**self.config)).eval()
        model.set_attn_implementation(self.attn)
        return model

    def inputs(self) -> dict:
        return dict(
            input_ids=self.src,
            attention_mask=self.src_mask,
            decoder_input_ids=self.tgt,
            decoder_attention_mask=self.tgt_mask,
        )


@st.composite
def cases(draw) -> Case:
    config = draw(config_kwargs())
    batch = draw(st.integers(1, 4))
    src, src_mask = draw(padded_batch(config["vocab_size"], batch))
    tgt, tgt_mask = draw(padded_batch(config["vocab_size"], batch))
    attn = draw(st.sampled_from(["eager", "sdpa"]))
    return Case(config, attn, draw(st.integers(0, 2**31 - 1)), src, src_mask, tgt, tgt_mask)


# ------------------------------------------------------------------ 1. cache vs no cache
@PROPERTY_SETTINGS
@given(case=cases())
def test_decoding_one_token_at_a_time_with_the_cache_gives_the_full_forward_logits(case):
    """Incremental decoder logits (cache, one token per call) equal the full forward's at every
    position, padded ones included (atol 1e-5)."""
    model = case.model()
    with torch.no_grad():
        full = model(**case.inputs(), use_cache=False).logits
        encoder_outputs = model.get_encoder()(input_ids=case.src, attention_mask=case.src_mask)
        cache, steps = None, []
        for t in range(case.tgt.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=case.src_mask,
                decoder_input_ids=case.tgt[:, t : t + 1],
                decoder_attention_mask=case.tgt_mask[:, : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            steps.append(out.logits)
    assert cache.get_seq_length() == case.tgt.shape[1]
    assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


@PROPERTY_SETTINGS
@given(case=cases(), max_new_tokens=st.integers(1, MAX_NEW_TOKENS))
def test_greedy_generation_with_and_without_the_cache_is_token_identical(case, max_new_tokens):
    """Greedy search (padded batch) gives exactly the same tokens with ``use_cache`` True and False."""
    model = case.model()
    kwargs = dict(attention_mask=case.src_mask, do_sample=False, num_beams=1, max_new_tokens=max_new_tokens)
    with_cache = model.generate(case.src, use_cache=True, **kwargs)
    without = model.generate(case.src, use_cache=False, **kwargs)
    assert torch.equal(with_cache, without)


# ------------------------------------------------------------------ 2. eager vs sdpa
@PROPERTY_SETTINGS
@given(case=cases())
def test_eager_and_sdpa_attention_give_the_same_logits(case):
    """Same weights, padded source and target: eager and SDPA logits agree at every position (atol 1e-5)."""
    model = case.model()
    logits = {}
    with torch.no_grad():
        for attn in ("eager", "sdpa"):
            model.set_attn_implementation(attn)
            logits[attn] = model(**case.inputs()).logits
    assert_close(logits["sdpa"], logits["eager"], atol=ATOL, rtol=0)


# ------------------------------------------------------------------ 3. padded vs unpadded
@PROPERTY_SETTINGS
@given(case=cases())
def test_each_row_of_a_padded_batch_gives_the_logits_of_the_row_alone(case):
    """At its real target positions, each row of the padded batch has the logits of the same row
    run alone, unpadded and without masks (atol 1e-5)."""
    model = case.model()
    with torch.no_grad():
        batched = model(**case.inputs()).logits
        for row in range(case.src.shape[0]):
            src_len, tgt_len = int(case.src_mask[row].sum()), int(case.tgt_mask[row].sum())
            src, tgt = case.src[row : row + 1, :src_len], case.tgt[row : row + 1, :tgt_len]
            alone = model(input_ids=src, decoder_input_ids=tgt).logits
            assert_close(batched[row, :tgt_len], alone[0], atol=ATOL, rtol=0, msg=lambda m: f"row {row}: {m}")


# ------------------------------------------------------------------ 4. save / reload
@PROPERTY_SETTINGS
@given(case=cases())
def test_save_and_reload_give_bit_identical_weights_and_logits(case):
    """``save_pretrained`` then ``from_pretrained``: every tensor of the state dict is bit-identical
    (tolerance 0), and so are the logits once the weights sit in memory aligned as the original's:
    transformers keeps loaded weights as views into the safetensors file, 8-byte aligned, and CPU matmul
    kernels may round the last bit differently for other alignments (seen: 3e-7)."""
    model = case.model()
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = VanillaTransformerForConditionalGeneration.from_pretrained(folder, attn_implementation=case.attn)
    assert not loaded.training
    before, after = model.state_dict(), loaded.state_dict()
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype and torch.equal(after[name], tensor), name
    with torch.no_grad():
        for parameter in loaded.parameters():
            parameter.data = parameter.data.clone()  # fresh, aligned memory; tied weights stay one tensor
        assert torch.equal(loaded(**case.inputs()).logits, model(**case.inputs()).logits)


# ------------------------------------------------------------------ 5. seeded sampling
@PROPERTY_SETTINGS
@given(
    case=cases(),
    seed=st.integers(0, 2**31 - 1),
    top_k=st.sampled_from([None, 0, 5]),  # None: the generation config's default
    max_new_tokens=st.integers(1, MAX_NEW_TOKENS),
)
def test_sampling_with_the_same_seed_gives_the_same_sequences(case, seed, top_k, max_new_tokens):
    """``generate(do_sample=True)`` after ``torch.manual_seed(seed)`` twice: identical sequences (exact)."""
    model = case.model()
    kwargs = dict(attention_mask=case.src_mask, do_sample=True, num_beams=1, max_new_tokens=max_new_tokens)
    if top_k is not None:
        kwargs["top_k"] = top_k
    runs = []
    for _ in range(2):
        torch.manual_seed(seed)
        runs.append(model.generate(case.src, **kwargs))
    assert torch.equal(runs[0], runs[1])
