# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The paper, executed
#
# A walk through "Attention Is All You Need" (Vaswani et al., 2017), section by section, on the live objects of
# this package: the model that `AutoModelForSeq2SeqLM` loads, the functions the training command calls, the
# pictures that `vanilla-transformer visualize` draws. Nothing is re-implemented except where a cell computes a
# formula by hand to check the package against it. Every such cell ends in `assert`: if a claim made here were
# false, the cell would fail, and so would the test suite, which runs this notebook top to bottom
# (`tests/test_walkthrough.py`).
#
# **The model from the top (the paper's Figure 1).** An *encoder* reads the source sentence and writes one vector
# of $d_{model}$ numbers per source token. A *decoder* writes the translation one token at a time: it reads the
# tokens it has written so far (masked self-attention) and, through encoder–decoder attention, the encoder's
# vectors. Each stack is $N = 6$ identical layers. An encoder layer is self-attention, then a position-wise
# feed-forward network; a decoder layer puts encoder–decoder attention between the two; every sub-layer is
# wrapped in a residual connection and a layer norm. Tokens enter as embeddings × $\sqrt{d_{model}}$ plus
# sinusoidal positions; the decoder's output leaves through the same embedding matrix, transposed, and a softmax
# over the vocabulary. The first cells trace one sentence through that picture; the sections then take it apart,
# bottom up: positions (§3.5), attention (§3.2.1), heads (§3.2.2), masks (§3.2.3), the feed-forward network
# (§3.3), residuals and layer norm (§3.1), shared embeddings (§3.4), the whole model and why self-attention (§4),
# then training (§5) and decoding (§6.1): two minutes of real training on the bundled English–German corpus,
# ending with a translator and its attention maps. Saving, loading and `trust_remote_code` are in the appendix.
#
# To run it yourself: `bash scripts/setup.sh` (or `pip install -e ".[dev]"`), then open this notebook with the
# environment's Python. It runs in about two and a half minutes on 2 CPU cores; the source is
# [`walkthrough.py`](walkthrough.py) (jupytext), and `python scripts/render_walkthrough.py` rebuilds this file.

# %%
import os
import tempfile
from pathlib import Path

WORK = Path(tempfile.mkdtemp(prefix="walkthrough-"))  # everything this notebook writes goes here
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the network
os.environ["HF_MODULES_CACHE"] = str(WORK / "modules")  # where trust_remote_code puts a folder's code
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import io
import itertools
import json
import math
import shutil
import subprocess
import sys
import warnings

from tqdm import TqdmWarning

warnings.simplefilter("ignore", TqdmWarning)  # tqdm would ask for ipywidgets; this notebook shows no progress bars

import datasets
import torch
import torch.nn.functional as F
import transformers
from IPython.display import Image, display
from PIL import Image as PILImage

import vanilla_transformer
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer import visualization as viz
from vanilla_transformer.modeling_vanilla_transformer import eager_attention_forward

datasets.disable_progress_bars()
transformers.utils.logging.disable_progress_bar()

# The bundled corpus: next to the package in a clone (editable install), or under the working directory.
DATA = next(
    folder / "data" / "tatoeba_en_de"
    for folder in (Path(vanilla_transformer.__file__).resolve().parents[1], Path.cwd(), Path.cwd().parent)
    if (folder / "data" / "tatoeba_en_de").is_dir()
)


def show(path, width=900, colors=256):
    """Display a PNG, at most `width` pixels wide and in `colors` colours, so that the notebook stays small."""
    image = PILImage.open(path).convert("RGB")
    if image.width > width:
        image = image.resize((width, round(image.height * width / image.width)), PILImage.LANCZOS)
    buffer = io.BytesIO()
    image.quantize(colors=colors).save(buffer, format="PNG", optimize=True)
    display(Image(data=buffer.getvalue()))


print("torch", torch.__version__, "| transformers", transformers.__version__)

# %% [markdown]
# The model we take apart is the paper's base model (Table 3: $d_{model} = 512$, $h = 8$ heads,
# $d_k = d_v = 64$, $d_{ff} = 2048$) with two layers per stack instead of six and a vocabulary of 1,000 tokens,
# so that it builds in a second. It is untrained: §3 is about what the model computes, not what it has learned.
# Eager attention is the reference implementation, the one that also returns its attention weights.

# %%
torch.manual_seed(0)
config = VanillaTransformerConfig.base(vocab_size=1000, encoder_layers=2, decoder_layers=2)
model = VanillaTransformerForConditionalGeneration(config).eval()
model.set_attn_implementation("eager")
g = torch.Generator().manual_seed(0)  # the random inputs of the checks below
print(
    f"d_model {config.d_model}, heads {config.encoder_attention_heads}, d_ff {config.encoder_ffn_dim}, "
    f"dropout {config.dropout}, {sum(p.numel() for p in model.parameters()):,} parameters"
)

# %% [markdown]
# Figure 1, drawn from this model's own modules (`viz.plot_architecture` reads each layer's sub-layers, where
# its layer norms sit, how many layers each stack has and whether the output layer is the embedding matrix; a
# pre-LN or untied model would be drawn differently):

# %%
figure_1 = viz.plot_architecture(WORK / "figure1.png", model)
show(figure_1["path"], width=700)
assert figure_1["shared_output_matrix"] and figure_1["decoder"]["layers"] == config.decoder_layers

# %% [markdown]
# **One sentence through Figure 1.** A source of 7 tokens and the 5 target tokens written so far go in; out come,
# at each target position, scores for every token of the vocabulary that could come next. The shape at each stage
# (batch, positions, width):

# %%
trace_g = torch.Generator().manual_seed(1)  # its own random numbers: the checks below keep theirs
src_ids, tgt_ids = torch.randint(4, 1000, (1, 7), generator=trace_g), torch.randint(4, 1000, (1, 5), generator=trace_g)
with torch.no_grad():
    traced = model(input_ids=src_ids, decoder_input_ids=tgt_ids, output_hidden_states=True)
stages = {
    "source token ids": src_ids,
    "encoder input: embeddings × √d_model + positions": traced.encoder_hidden_states[0],
}
stages |= {f"after encoder layer {i}": h for i, h in enumerate(traced.encoder_hidden_states[1:], 1)}
stages |= {
    "target token ids so far": tgt_ids,
    "decoder input: embeddings × √d_model + positions": traced.decoder_hidden_states[0],
}
stages |= {
    f"after decoder layer {i} (reads the encoder output)": h for i, h in enumerate(traced.decoder_hidden_states[1:], 1)
}
stages |= {"logits: × the embedding matrix, transposed": traced.logits}
for name, tensor in stages.items():
    print(f"{name:52} {tuple(tensor.shape)}")
shared_matrix = model.model.shared.weight
torch.testing.assert_close(traced.logits, traced.decoder_hidden_states[-1] @ shared_matrix.T, atol=1e-4, rtol=1e-4)
torch.testing.assert_close(traced.logits.softmax(-1).sum(-1), torch.ones(1, 5))  # a distribution per position

# %% [markdown]
# ## 1. Positions (§3.5)
#
# Attention by itself ignores order: permute the words and each word gets the same output. So the model adds
# a position signal to each embedding, a fixed set of sinusoids with wavelengths from $2\pi$ to $10000 \cdot 2\pi$:
#
# $$PE_{(pos,\,2i)} = \sin\!\left(pos / 10000^{2i/d_{model}}\right), \qquad
#   PE_{(pos,\,2i+1)} = \cos\!\left(pos / 10000^{2i/d_{model}}\right)$$
#
# Sines on even dimensions, cosines on odd ones, interleaved as in the paper. The model precomputes a table,
# the `pe` buffer of its positional module. Check it against the formula, computed here in float64:


# %%
def paper_pe(positions, d_model):
    """The formula of §3.5, written out."""
    pos = torch.as_tensor(positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)[None, :]
    table = torch.empty(len(pos), d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos / 10000 ** (two_i / d_model))
    table[:, 1::2] = torch.cos(pos / 10000 ** (two_i / d_model))
    return table.float()


positions = model.model.encoder.embed_positions  # the module the encoder calls
pe = positions.pe  # [max_position_embeddings, d_model]
torch.testing.assert_close(pe, paper_pe(range(len(pe)), config.d_model), atol=1e-6, rtol=0)
assert torch.equal(model.model.decoder.embed_positions.pe, pe)  # the decoder adds the same signal
print(f"pe: {tuple(pe.shape)}, equal to the formula at all {pe.numel():,} entries")
show(viz.plot_positional_encoding(WORK / "positional_encoding.png", model=model)["path"], colors=64)

# %% [markdown]
# **Why sinusoids.** The paper hoped they would let the model attend by *relative* position, since for any
# offset $k$, $PE_{pos+k}$ is a linear function of $PE_{pos}$: each (sin, cos) pair of frequency $\omega$ turns
# by the angle $\omega k$, a rotation that does not depend on $pos$. The same matrix maps every row of the table:

# %%
k = 7
omega = 1 / 10000 ** (torch.arange(0, config.d_model, 2, dtype=torch.float64) / config.d_model)
cos, sin = torch.cos(omega * k), torch.sin(omega * k)
shift = torch.zeros(config.d_model, config.d_model, dtype=torch.float64)  # block-diagonal rotation
shift[0::2, 0::2] = torch.diag(cos)  # sin(a + b) = sin a cos b + cos a sin b
shift[0::2, 1::2] = torch.diag(sin)
shift[1::2, 0::2] = torch.diag(-sin)  # cos(a + b) = cos a cos b - sin a sin b
shift[1::2, 1::2] = torch.diag(cos)
moved = pe[:1000].double() @ shift.T
torch.testing.assert_close(moved, pe[k : k + 1000].double(), atol=1e-5, rtol=0)
print(f"PE[pos + {k}] = PE[pos] · Mᵀ for pos = 0 … 999, with one fixed matrix M")

# %% [markdown]
# The paper chose sinusoids because they "may allow the model to extrapolate to sequence lengths longer than the
# ones encountered during training"; it did not test that, and neither does this cell. What it checks is the
# mechanics: positions past the table are computed on the fly, so a model whose table holds 16 positions runs on
# 40 and gives finite logits, while learned position embeddings (Table 3, row E) stop at the table's end.
# Whether a model *translates* well past the lengths it was trained on is another question.

# %%
beyond = positions(seq_len=10, past_len=len(pe) - 5)  # positions 1019 … 1028: five in the table, five past it
torch.testing.assert_close(beyond, paper_pe(range(len(pe) - 5, len(pe) + 5), config.d_model), atol=1e-6, rtol=0)

small = dict(
    vocab_size=1000,
    d_model=64,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    max_position_embeddings=16,
)
long_ids = torch.randint(4, 1000, (1, 40), generator=g)
sinusoidal = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**small)).eval()
logits = sinusoidal(input_ids=long_ids, decoder_input_ids=long_ids).logits
assert logits.shape == (1, 40, 1000) and torch.isfinite(logits).all()

learned = VanillaTransformerForConditionalGeneration(
    VanillaTransformerConfig(**small, position_embedding_type="learned")
)
try:
    learned(input_ids=long_ids, decoder_input_ids=long_ids)
    raise AssertionError("learned positions read past their table")
except ValueError as error:
    assert "max_position_embeddings=16" in str(error)
    print("learned positions:", str(error).split(".")[0])
print("sinusoidal positions: 40 tokens in, 40 rows of finite logits out")

# %% [markdown]
# ## 2. Scaled dot-product attention (§3.2.1)
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V$$
#
# Each query scores every key by a dot product; the softmax turns one query's scores into weights that sum to
# 1; the output is the weighted mean of the values. One head by hand on 3 queries and 5 keys with $d_k = 4$,
# against the model's `eager_attention_forward`:

# %%
Q, K, V = (
    torch.randn(1, 1, 3, 4, generator=g),
    torch.randn(1, 1, 5, 4, generator=g),
    torch.randn(1, 1, 5, 4, generator=g),
)
weights_by_hand = (Q @ K.transpose(-1, -2) / math.sqrt(4)).softmax(dim=-1)  # [batch, head, query, key]
output_by_hand = weights_by_hand @ V

attention = model.model.encoder.layers[0].self_attn  # an attention module of the model
output, weights = eager_attention_forward(attention, Q, K, V, attention_mask=None, scaling=4**-0.5)
torch.testing.assert_close(weights, weights_by_hand)
torch.testing.assert_close(output, output_by_hand.transpose(1, 2))  # returned as [batch, query, head, d_v]
torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, 3))
assert attention.head_dim == 64 and attention.scaling == 64**-0.5  # the model's own d_k and 1/√d_k
print("weights (one row per query):\n", weights[0, 0].numpy().round(3))

# %% [markdown]
# **Why divide by $\sqrt{d_k}$.** If the components of $q$ and $k$ are independent with mean 0 and variance 1,
# $q \cdot k$ has variance $d_k$. Large scores push the softmax towards a one-hot vector, where its gradient,
# $\partial p / \partial s = \mathrm{diag}(p) - p p^\top$, vanishes. Measured on 2,000 random queries against
# 32 keys, with and without the scale, through the model's attention function:


# %%
def softmax_statistics(d_k, scaled):
    generator = torch.Generator().manual_seed(d_k)
    q, k, v = (torch.randn(1, 1, n, d_k, generator=generator) for n in (2000, 32, 32))
    _, p = eager_attention_forward(attention, q, k, v, None, scaling=d_k**-0.5 if scaled else 1.0)
    jacobian = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)  # ∂p/∂s for each query
    return {
        "score std": (q @ k.transpose(-1, -2) * (d_k**-0.5 if scaled else 1.0)).std().item(),
        "mean max weight": p.max(-1).values.mean().item(),
        "rows > 0.99 on one key": (p.max(-1).values > 0.99).float().mean().item(),
        "rows with |∂p/∂s| < 0.01": (jacobian.flatten(-2).norm(dim=-1) < 0.01).float().mean().item(),
    }


stats = {(d_k, scaled): softmax_statistics(d_k, scaled) for d_k in (16, 64, 256) for scaled in (False, True)}
print(f"{'d_k':>4} {'scaled':>7}" + "".join(f"{name:>26}" for name in stats[16, True]))
for (d_k, scaled), row in stats.items():
    print(f"{d_k:>4} {str(scaled):>7}" + "".join(f"{value:>26.3f}" for value in row.values()))

unscaled, scaled = stats[64, False], stats[64, True]  # the paper's d_k
assert 7 < unscaled["score std"] < 9 and 0.9 < scaled["score std"] < 1.1  # √64 = 8
assert unscaled["mean max weight"] > 0.7 and scaled["mean max weight"] < 0.3
assert unscaled["rows > 0.99 on one key"] > 0.2 and unscaled["rows with |∂p/∂s| < 0.01"] > 0.15
assert all(
    stats[d_k, True][name] == 0
    for d_k in (16, 64, 256)
    for name in ("rows > 0.99 on one key", "rows with |∂p/∂s| < 0.01")
)

# %% [markdown]
# Without the scale, at the paper's $d_k = 64$ a quarter of the queries put over 99 % of their weight on one
# key, and a fifth pass almost no gradient back; with it, none do, at any of the three sizes.
#
# ## 3. Multi-head attention (§3.2.2)
#
# $$\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \ldots, \mathrm{head}_h)\, W^O, \qquad
#   \mathrm{head}_i = \mathrm{Attention}(Q W_i^Q, K W_i^K, V W_i^V)$$
#
# The model stores the $h$ projections $W_i^Q$ as one $d_{model} \times d_{model}$ matrix (`q_proj`): head $i$
# owns 64 of its rows. As in the equations (and in tensor2tensor, the paper's code), the projections are matrices
# alone, without biases; Marian and fairseq add biases, which `attention_bias=True` turns on. Recompute the
# module's output head by head, from its matrices only:

# %%
x = torch.randn(1, 6, config.d_model, generator=g)  # 6 positions of a sentence
output, weights = attention(x)  # the module itself: self-attention, [1, 6, 512], and weights [1, 8, 6, 6]
heads, d_k = attention.num_heads, attention.head_dim


def project(linear, rows):
    return x @ linear.weight[rows].T  # x W_i: the paper's projections have no bias


concat = []
for i in range(heads):
    rows = slice(i * d_k, (i + 1) * d_k)
    q, k, v = project(attention.q_proj, rows), project(attention.k_proj, rows), project(attention.v_proj, rows)
    p = (q @ k.transpose(-1, -2) / math.sqrt(d_k)).softmax(-1)
    torch.testing.assert_close(weights[0, i], p[0])  # head i's own attention pattern
    concat.append(p @ v)
torch.testing.assert_close(output, torch.cat(concat, dim=-1) @ attention.out_proj.weight.T, atol=1e-5, rtol=1e-5)

n_params = sum(p.numel() for p in attention.parameters())
assert n_params == 4 * config.d_model**2  # W^Q, W^K, W^V, W^O: four matrices, nothing else
print(f"{heads} heads of d_k = {d_k}: {n_params:,} parameters, as many as one head of width {config.d_model}")

# %% [markdown]
# **Encoder–decoder attention** (§3.2.3) is the same computation with the roles split: the queries come from the
# decoder (here 4 target positions), the keys and values from the encoder's output (here 6 source positions).
# Each target position gets a distribution over the *source* positions:

# %%
cross = model.model.decoder.layers[0].encoder_attn
cross_g = torch.Generator().manual_seed(2)
decoder_states, encoder_output = (
    torch.randn(1, 4, config.d_model, generator=cross_g),
    torch.randn(1, 6, config.d_model, generator=cross_g),
)
cross_output, cross_weights = cross(decoder_states, key_value_states=encoder_output)
concat = []
for i in range(heads):
    rows = slice(i * d_k, (i + 1) * d_k)
    q = decoder_states @ cross.q_proj.weight[rows].T  # Q from the decoder
    k, v = (
        encoder_output @ cross.k_proj.weight[rows].T,
        encoder_output @ cross.v_proj.weight[rows].T,
    )  # K, V from the encoder
    p = (q @ k.transpose(-1, -2) / math.sqrt(d_k)).softmax(-1)  # [1, 4 target, 6 source]
    torch.testing.assert_close(cross_weights[0, i], p[0])
    concat.append(p @ v)
torch.testing.assert_close(cross_output, torch.cat(concat, dim=-1) @ cross.out_proj.weight.T, atol=1e-5, rtol=1e-5)
print(
    f"encoder–decoder attention weights: {tuple(cross_weights.shape)} = (batch, heads, target positions, source positions)"
)

# %% [markdown]
# ## 4. Masks (§3.2.3)
#
# Attention is used three ways: encoder self-attention, decoder self-attention and encoder–decoder attention
# (queries from the decoder, keys and values from the encoder's output). Two masks shape them. The decoder must
# not see the words it is about to predict, so its self-attention is *causal*: a score to a later position is
# set to $-\infty$ before the softmax. And nobody attends to padding. The pictures come from the mask functions
# the model calls:

# %%
masks = viz.plot_masks(WORK / "masks.png")  # a batch of two sentences, of 9 and 5 tokens
n, length = masks["causal"].shape[0], masks["length"]
assert torch.equal(masks["causal"], torch.ones(n, n).tril().bool())  # query i sees keys 0 … i
assert masks["padding"][:, :length].all() and not masks["padding"][:, length:].any()  # padding is never a key
show(masks["path"])

# %% [markdown]
# The proof that matters is on the model's outputs: change a target token, and no earlier position's logits
# move, while every later one does. The encoder, which reads the whole source at once, is not causal.
# And padding a source changes nothing.

# %%
source = torch.randint(4, 1000, (1, 7), generator=g)
target = torch.randint(4, 1000, (1, 6), generator=g)


def logits_for(src, tgt, **kwargs):
    with torch.no_grad():
        return model(input_ids=src, decoder_input_ids=tgt, **kwargs).logits


reference = logits_for(source, target)
changed_target = target.clone()
changed_target[0, 3] = (target[0, 3] + 1) % 996 + 4  # another token at position 3
changed = logits_for(source, changed_target)
assert torch.allclose(changed[0, :3], reference[0, :3], atol=1e-5)  # positions 0-2 cannot see position 3
assert all(not torch.allclose(changed[0, t], reference[0, t], atol=1e-3) for t in range(3, 6))

changed_source = source.clone()
changed_source[0, -1] = (source[0, -1] + 1) % 996 + 4  # the last source token
assert not torch.allclose(logits_for(changed_source, target)[0, 0], reference[0, 0], atol=1e-3)

padded = torch.cat([source, torch.zeros(1, 3, dtype=torch.long)], dim=1)  # three <pad> tokens (id 0)
mask = torch.tensor([[1] * 7 + [0] * 3])
torch.testing.assert_close(logits_for(padded, target, attention_mask=mask), reference, atol=1e-5, rtol=1e-5)
print(
    "a future target token changes no earlier logit; every source token reaches every target position; "
    "padding changes nothing"
)

# %% [markdown]
# ## 5. Position-wise feed-forward network (§3.3)
#
# $$\mathrm{FFN}(x) = \max(0,\ x W_1 + b_1)\, W_2 + b_2$$
#
# Two linear maps with a ReLU between them, $512 \to 2048 \to 512$, applied to each position separately and
# identically: whatever mixes positions happens in attention.

# %%
ffn = model.model.encoder.layers[0].ffn
assert ffn.fc1.weight.shape == (config.encoder_ffn_dim, config.d_model) == (2048, 512)
by_hand = torch.relu(x @ ffn.fc1.weight.T + ffn.fc1.bias) @ ffn.fc2.weight.T + ffn.fc2.bias
torch.testing.assert_close(ffn(x), by_hand, atol=1e-5, rtol=1e-5)
order = torch.randperm(6, generator=g)
torch.testing.assert_close(ffn(x[:, order]), ffn(x)[:, order])  # shuffle the positions: the outputs follow
print("FFN = ReLU(x W1 + b1) W2 + b2, position by position")

# %% [markdown]
# ## 6. Residual connections and layer norm (§3.1)
#
# Each sub-layer (attention, FFN) is wrapped as $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$, with dropout on
# the sub-layer's output in training (§5.4): the *post-LN* block of the paper. Later work moved the norm in
# front, $x + \mathrm{Sublayer}(\mathrm{LayerNorm}(x))$, which later work found easier to train in deep stacks;
# the package offers it as the flag `norm_first=True`, off by default. Both, recomputed from the layers' parts:

# %%
layer = model.model.encoder.layers[0]
h = layer.self_attn_layer_norm(x + layer.self_attn(x)[0])
post_ln = layer.final_layer_norm(h + layer.ffn(h))
torch.testing.assert_close(layer(x), post_ln, atol=1e-5, rtol=1e-5)
# After a post-LN block every position is normalised (the norms start with gain 1 and bias 0):
assert torch.allclose(post_ln.mean(-1), torch.zeros(1, 6), atol=1e-5)
assert torch.allclose(post_ln.std(-1, unbiased=False), torch.ones(1, 6), atol=1e-3)

pre_config = VanillaTransformerConfig.base(vocab_size=1000, encoder_layers=2, decoder_layers=2, norm_first=True)
pre_layer = VanillaTransformerForConditionalGeneration(pre_config).eval().model.encoder.layers[0]
h = x + pre_layer.self_attn(pre_layer.self_attn_layer_norm(x))[0]
pre_ln = h + pre_layer.ffn(pre_layer.final_layer_norm(h))
torch.testing.assert_close(pre_layer(x), pre_ln, atol=1e-5, rtol=1e-5)
assert model.model.encoder.layer_norm is None  # post-LN: the paper has no final norm on a stack
print("post-LN: LayerNorm(x + Sublayer(x)); norm_first=True: x + Sublayer(LayerNorm(x)), plus a final norm per stack")

# %% [markdown]
# ## 7. Shared embeddings, × √d_model (§3.4)
#
# One matrix does three jobs: source embedding, target embedding, and the pre-softmax linear layer that turns
# the decoder's output into logits (source and target share one BPE vocabulary, so this works). In the model
# they are the same tensor object, not three copies:

# %%
shared = model.model.shared.weight  # [vocab_size, d_model]
for role, tensor in {
    "source embedding": model.model.encoder.embed_tokens.weight,
    "target embedding": model.model.decoder.embed_tokens.weight,
    "pre-softmax layer": model.lm_head.weight,
}.items():
    assert tensor is shared, role
    print(f"{role:18} is model.model.shared.weight")

# %% [markdown]
# The embeddings are multiplied by $\sqrt{d_{model}}$. The paper gives no initialisation; the package draws them
# with standard deviation $d_{model}^{-1/2}$ (variance $1/d_{model}$), as tensor2tensor and fairseq do, so that
# the product has unit scale, like the positional signal it is added to (whose entries have mean square 1/2).
# The input of the first encoder layer is exactly $\sqrt{d_{model}} \cdot E[x] + PE$:

# %%
ids = torch.randint(4, 1000, (1, 5), generator=g)
with torch.no_grad():
    first_input = model.model.encoder(input_ids=ids, output_hidden_states=True).hidden_states[0]
assert model.model.encoder.embed_scale == math.sqrt(config.d_model)
torch.testing.assert_close(first_input[0], shared[ids[0]] * math.sqrt(config.d_model) + pe[:5])
scaled_std = (shared * math.sqrt(config.d_model)).std().item()
assert 0.95 < scaled_std < 1.05
print(
    f"std of the embeddings {shared.std().item():.4f}, × √{config.d_model}: {scaled_std:.3f}; "
    f"root mean square of PE: {pe.pow(2).mean().sqrt().item():.3f}"
)

# %% [markdown]
# ## 8. The whole model
#
# `VanillaTransformerConfig.base()` is Table 3's base model with the paper's 37,000-token shared vocabulary.
# Built on PyTorch's `meta` device (shapes only, no memory), its parameters count 63.0M against the paper's
# 65M; the paper does not say how it counted.

# %%
with torch.device("meta"):
    paper_base = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.base())
parts = {}
for name, parameter in paper_base.named_parameters():  # a tied matrix is listed once, as model.shared.weight
    part = "shared embedding" if "shared" in name else name.split(".")[1] + " layers"
    parts[part] = parts.get(part, 0) + parameter.numel()
total = sum(parts.values())
for part, count in parts.items():
    print(f"{part:17} {count:>11,}")
print(f"{'total':17} {total:>11,}   (the paper: 65M)")
assert abs(total / 65e6 - 1) < 0.035

# %% [markdown]
# ## Why self-attention (§4, Table 1)
#
# The paper compares one layer of each kind over a sentence of $n$ positions of width $d$ (kernel width $k$ for
# convolutions, neighbourhood $r$ for restricted attention):
#
# | layer type | complexity per layer | sequential operations | maximum path length |
# |---|---|---|---|
# | self-attention | $O(n^2 \cdot d)$ | $O(1)$ | $O(1)$ |
# | recurrent | $O(n \cdot d^2)$ | $O(n)$ | $O(n)$ |
# | convolutional | $O(k \cdot n \cdot d^2)$ | $O(1)$ | $O(\log_k n)$ |
# | self-attention (restricted) | $O(r \cdot n \cdot d)$ | $O(1)$ | $O(n / r)$ |
#
# The path length is how many layers a signal crosses to get from one position to another. Measured: after *one*
# encoder layer, the output at position 0 depends on every one of 20 input positions (its gradient reaches them
# all), and the layer computes its $n \times n$ scores per head at once; a width-3 convolution reaches one
# neighbour per side per layer, so it takes 19 layers to connect the two ends:

# %%
n = 20
inputs = torch.randn(1, n, config.d_model, generator=torch.Generator().manual_seed(3), requires_grad=True)
encoder_layer = model.model.encoder.layers[0]
encoder_layer(inputs)[0, 0, 0].backward()  # one number of position 0's output (a layer norm's outputs sum to 0)
assert (inputs.grad[0].abs().sum(-1) > 0).all()  # position 0 reads all 20 positions: path length 1
pattern = encoder_layer.self_attn(inputs.detach(), output_attentions=True)[1]  # the attention weights
assert pattern.shape == (1, heads, n, n)  # n² scores per head: the O(n²·d) of the first column

conv = torch.nn.Conv1d(config.d_model, config.d_model, kernel_size=3, padding=1)
signal, layers_needed = torch.zeros(1, config.d_model, n), 0
signal[0, :, n - 1] = 1.0  # something at the last position; how many conv layers until position 0 sees it?
with torch.no_grad():
    while signal[0, :, 0].abs().sum() == 0:
        signal, layers_needed = conv(signal) - conv(torch.zeros_like(signal)), layers_needed + 1
assert layers_needed == n - 1
print(f"{n} positions: self-attention connects any two in 1 layer, a width-3 convolution in {layers_needed}")

# %% [markdown]
# ## 9. Training (§5)
#
# **The paper's scale, for comparison (§5.1, §5.2, §6.1).** WMT 2014 English–German, about 4.5 million sentence
# pairs, one shared BPE vocabulary of about 37,000 tokens (English–French: 36 million sentences, 32,000
# word-pieces); batches of about 25,000 source and 25,000 target tokens; 8 P100 GPUs. The base model trained
# 100,000 steps in 12 hours (0.4 s a step), the big one 300,000 steps in 3.5 days (1.0 s a step). Checkpoints
# were written every 10 minutes; the base model's result is the average of its last 5, the big one's of its
# last 20. Decoding: beam 4, length penalty α = 0.6, at most input length + 50 tokens. The run below sees about
# 0.7 million target tokens; the base model's run saw about 2.5 billion, nearly 4,000 times more.
#
# **Batches by tokens (§5.1).** The paper batched sentence pairs of similar length. First a tokenizer: one
# byte-level BPE vocabulary for both languages, trained on the bundled Tatoeba training split (100,000
# English–German pairs), here with 2,000 tokens.

# %%
from vanilla_transformer.data import TokenBucketBatchSampler, load_parallel_corpus
from vanilla_transformer.tokenization import save_tokenizer, train_joint_bpe

corpus = load_parallel_corpus(DATA, "en", "de")
pairs = corpus["train"]
tokenizer = train_joint_bpe(itertools.chain(pairs["source"], pairs["target"]), vocab_size=2000)
save_tokenizer(tokenizer, WORK / "tokenizer")
example = tokenizer("Tom is reading a book.")["input_ids"]
print({split: len(corpus[split]) for split in corpus})
raw = tokenizer.convert_ids_to_tokens(example)
print("tokens:", raw)
print("as the pictures label them:", viz.readable_tokens(raw, tokenizer))
assert raw[0].startswith("Ġ") and raw[-1] == tokenizer.eos_token  # a word start, and </s> appended

# %% [markdown]
# Byte-level BPE works on bytes shown as printable characters: `Ġ` is the space byte, so a token that starts
# with `Ġ` starts a word (the tokenizer adds a space before the first word), and non-ASCII letters show as two
# symbols (`Ã¤` for ä). The tokenizer appends `</s>`. For the labels of the attention pictures, the package
# decodes the bytes and marks a piece that *continues* a word with `##`, BERT's WordPiece convention, which is
# easier to read; it is a way of printing, not how this tokenizer works.
#
# `TokenBucketBatchSampler` sorts pairs by length and cuts batches of at most `max_tokens` padded tokens per
# side: many short sentences or a few long ones. Against batches of the same sizes drawn at random, it wastes
# far less on padding:

# %%
sample = pairs.select(range(5000))
src_len = [len(ids) for ids in tokenizer(list(sample["source"]))["input_ids"]]
tgt_len = [len(ids) for ids in tokenizer(text_target=list(sample["target"]))["input_ids"]]
batches = list(TokenBucketBatchSampler(list(zip(src_len, tgt_len)), max_tokens=2000, seed=0))


def padding_share(batches):
    padded = sum(len(b) * max(src_len[i] for i in b) + len(b) * max(tgt_len[i] for i in b) for b in batches)
    return 1 - (sum(src_len) + sum(tgt_len)) / padded


shuffled = torch.randperm(5000, generator=g).tolist()
sizes = [len(b) for b in batches]
random_batches = [shuffled[sum(sizes[:j]) : sum(sizes[: j + 1])] for j in range(len(sizes))]
for b in batches:
    assert len(b) * max(src_len[i] for i in b) <= 2000 and len(b) * max(tgt_len[i] for i in b) <= 2000
assert sorted(i for b in batches for i in b) == list(range(5000))  # every pair once
bucketed, at_random = padding_share(batches), padding_share(random_batches)
assert bucketed < at_random / 3
print(
    f"{len(batches)} batches of {min(sizes)}–{max(sizes)} pairs; padding: {bucketed:.1%} of the tokens "
    f"(random batches of the same sizes: {at_random:.1%})"
)

# %% [markdown]
# **The learning rate (§5.3).** Adam with $\beta_1 = 0.9$, $\beta_2 = 0.98$, $\epsilon = 10^{-9}$, and
#
# $$lrate = d_{model}^{-0.5} \cdot \min\!\left(step^{-0.5},\ step \cdot warmup\_steps^{-1.5}\right)$$
#
# a linear warm-up, then decay as $1/\sqrt{step}$. That is transformers' `inverse_sqrt` schedule with the
# paper's peak as learning rate; the package's `make_optimizer_and_schedule` builds exactly that.

# %%
from transformers.optimization import get_inverse_sqrt_schedule

from vanilla_transformer.schedule import make_optimizer_and_schedule, noam_learning_rate, peak_learning_rate

show(viz.plot_learning_rate(WORK / "learning_rate.png")["path"])

peak = peak_learning_rate(d_model=512, warmup_steps=4000)
plain = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=peak, betas=(0.9, 0.98), eps=1e-9)
schedules = {"transformers' inverse_sqrt": get_inverse_sqrt_schedule(plain, num_warmup_steps=4000)}
optimizer, schedules["make_optimizer_and_schedule"] = make_optimizer_and_schedule(torch.nn.Linear(2, 2), 512, 4000)
assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
paper = torch.tensor([noam_learning_rate(step, 512, 4000) for step in range(12000)], dtype=torch.float64)
for name, schedule in schedules.items():
    rates = []
    for step in range(12000):
        rates.append(schedule.get_last_lr()[0])
        schedule.optimizer.step()
        schedule.step()
    torch.testing.assert_close(torch.tensor(rates, dtype=torch.float64), paper, rtol=1e-9, atol=0)
assert f"{peak:.2e}" == "6.99e-04"
print(f"both schedules equal the paper's formula at steps 0 … 11,999; peak {peak:.2e} at step 4,000")

# %% [markdown]
# **Label smoothing (§5.4).** The paper gives $\epsilon_{ls} = 0.1$ and no formula. The package uses the form of
# Szegedy et al. (2016), the paper's citation, which is also torch's `label_smoothing`: the target for each token
# is $q = (1 - \epsilon) \cdot \text{one-hot} + \epsilon / V$, so the gold token gets $1 - \epsilon + \epsilon / V$
# and every other token of the vocabulary $\epsilon / V$. (tensor2tensor spreads $\epsilon$ over the $V - 1$ other
# tokens instead; for $V$ in the thousands the two differ by about $\epsilon / V$ per token.) The paper reports that
# it hurts perplexity and helps BLEU. The model computes it when given `smoothing=ε`:

# %%
smoothing = viz.plot_label_smoothing(WORK / "label_smoothing.png")
q = smoothing["distribution"]  # the target read off the loss's gradient, toy vocabulary of 12 tokens
V, gold = len(q), smoothing["gold"]
torch.testing.assert_close(q.sum(), torch.tensor(1.0, dtype=q.dtype))
torch.testing.assert_close(q[gold], torch.tensor(1 - 0.1 + 0.1 / V, dtype=q.dtype))
torch.testing.assert_close(q[torch.arange(V) != gold], torch.full((V - 1,), 0.1 / V, dtype=q.dtype))
show(smoothing["path"])

labels = torch.randint(4, 1000, (2, 6), generator=g)
out = model(input_ids=torch.randint(4, 1000, (2, 7), generator=g), labels=labels, smoothing=0.1)
log_p = out.logits.log_softmax(-1)
q_model = torch.full_like(log_p, 0.1 / config.vocab_size).scatter(
    -1, labels[..., None], 1 - 0.1 + 0.1 / config.vocab_size
)
torch.testing.assert_close(out.loss, -(q_model * log_p).sum(-1).mean())  # cross-entropy against q
torch.testing.assert_close(out.nll_loss, F.nll_loss(log_p.flatten(0, 1), labels.flatten()))  # and without smoothing
print(
    f"model loss with ε = 0.1: {out.loss.item():.4f} (= cross-entropy against q), plain NLL: {out.nll_loss.item():.4f}"
)

# %% [markdown]
# **A short real training run.** The training command's own function, `train(TrainConfig(...))`: the base
# preset scaled down to $d_{model} = 128$, 2 + 2 layers, 4 heads, $d_{ff} = 512$, dropout 0.1; batches of
# 2,000 tokens per side; the paper's Adam and schedule with a warm-up of 200 steps, times `lr_factor=1.5`; label
# smoothing 0.1; 350 steps (under two minutes on 2 CPU cores). For so short a run we keep the pairs of at most 10
# tokens a side (a third of the corpus), where a small model learns fastest.
#
# The peak learning rate is about 13 times the base model's. The schedule's formula itself gives a narrower
# model and a shorter warm-up a higher peak ($d_{model}^{-0.5} \cdot warmup^{-0.5}$: 6.2e-3 for 128 and 200,
# against 7.0e-4 for 512 and 4,000), and `lr_factor=1.5` raises it further, because 350 steps leave no time to
# creep up; a model this small trains stably at that rate, a base model would not.
#
# Checkpoints are written every 25 steps, and the final model is the average of the last five, steps 250–350,
# all past the warm-up: a scaled-down version of the paper's averaging of its last five checkpoints, written
# 10 minutes apart at the end of a 12-hour run (§6.1).

# %%
from vanilla_transformer.checkpoints import list_checkpoints
from vanilla_transformer.training import train
from vanilla_transformer.training_config import TrainConfig

run = WORK / "run"
summary = train(
    TrainConfig(
        dataset_name=str(DATA),
        tokenizer_name=str(WORK / "tokenizer"),
        max_length=10,
        test_split=None,
        preset="base",
        config_overrides=dict(
            d_model=128,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=512,
            decoder_ffn_dim=512,
            dropout=0.1,
        ),
        max_tokens=2000,
        max_steps=350,
        warmup_steps=200,
        lr_factor=1.5,
        label_smoothing_factor=0.1,
        logging_steps=25,
        eval_steps=350,
        eval_bleu_sentences=0,
        save_steps=25,
        average_last=5,
        output_dir=str(run),
        disable_tqdm=True,
        seed=0,
    )
)
peak_here = 1.5 * peak_learning_rate(d_model=128, warmup_steps=200)
assert 12 < peak_here / peak < 14
print(
    f"trained {summary['step']} steps, {summary['target_tokens']:,} target tokens, in {summary['train_seconds']:.0f} s; "
    f"peak learning rate {peak_here:.1e} ({peak_here / peak:.1f}× the base model's {peak:.1e})"
)
assert summary["averaged_checkpoints"] == [f"checkpoint-{step}" for step in (250, 275, 300, 325, 350)]
print("run/final is the average of", ", ".join(summary["averaged_checkpoints"]))

# %%
from matplotlib.figure import Figure

history = json.loads((list_checkpoints(run / "checkpoints")[-1] / "trainer_state.json").read_text())["history"]
steps = [record["step"] for record in history if "train_loss" in record]
losses = [record["train_loss"] for record in history if "train_loss" in record]
figure = Figure(figsize=(7, 3), dpi=90, layout="constrained")
axes = figure.subplots()
axes.plot(steps, losses, marker="o", markersize=3, label="training loss (label-smoothed), per 25 steps")
axes.axhline(
    summary["valid_loss"], color="tab:red", linestyle="--", label=f"validation loss of the step-{steps[-1]} weights"
)
axes.axhline(math.log(2000), color="gray", linestyle=":", label="uniform guess over 2,000 tokens: ln 2000")
axes.set(xlabel="step", ylabel="loss (nats per token)", title="350 steps of training on Tatoeba en→de")
axes.legend(fontsize=8)
figure.savefig(WORK / "loss.png")
show(WORK / "loss.png")

first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
assert first - last > 1.5, (first, last)  # the loss falls, by far more than its noise
assert summary["valid_loss"] < math.log(2000) - 3
print(
    f"training loss {first:.2f} → {last:.2f}; validation loss of the step-350 weights {summary['valid_loss']:.2f}, "
    f"perplexity {summary['valid_ppl']:.1f}"
)

# %% [markdown]
# The validation loss above was measured during training, on the weights of step 350. Everything below (the
# translations, the scores, the attention maps) comes from `run/final`, the average of the five checkpoints.

# %% [markdown]
# ## 10. Decoding (§6.1)
#
# The paper decodes with beam search: beam 4, length penalty $\alpha = 0.6$, at most source length + 50 tokens.
# These are the defaults of the saved model's `generation_config.json`; `num_beams=1` gives greedy decoding,
# which keeps only the single best token at each step. `translate` is the function behind the
# `vanilla-transformer translate` command.

# %%
from vanilla_transformer.evaluation import score, translate
from vanilla_transformer.loading import load_model_and_tokenizer

trained, tokenizer = load_model_and_tokenizer(run / "final")
decoding = trained.generation_config
assert (decoding.num_beams, decoding.length_penalty, decoding.source_length_offset) == (4, 0.6, 50)
print(
    f"saved decoding: beam {decoding.num_beams}, α = {decoding.length_penalty}, "
    f"at most source length + {decoding.source_length_offset} tokens\n"
)
sentences = [
    "I love you.",
    "Where is the train station?",
    "Tom is reading a book.",
    "We have to go home now.",
    "I don't know.",
    "The dog is sleeping.",
]
greedy, beam = translate(trained, tokenizer, sentences, num_beams=1), translate(trained, tokenizer, sentences)
for sentence, by_greedy, by_beam in zip(sentences, greedy, beam):
    print(f"{sentence:28} greedy: {by_greedy:30} beam 4: {by_beam}")

# %% [markdown]
# Beam search looks for the output with the best length-normalised log-probability. transformers (and
# CTranslate2) normalise by $|y|^{\alpha}$: the score is $\log P(y \mid x) / |y|^{\alpha}$. The paper's α = 0.6
# comes from GNMT (Wu et al., 2016), whose penalty is $((5 + |y|) / 6)^{\alpha}$; the package's beam search
# computes either (`length_penalty_form`, see [model.md](model.md)), and the cells here use the saved model's
# setting. Greedy decoding commits to one token at a time. On the first 200 pairs of
# the test split within the training's length limit, both scored by the model itself (teacher-forced
# log-probabilities of the generated tokens), and by sacreBLEU against the references:


# %%
def short(source, target, limit=10):
    return len(tokenizer(source)["input_ids"]) <= limit and len(tokenizer(text_target=target)["input_ids"]) <= limit


test = [(s, t) for s, t in zip(corpus["test"]["source"], corpus["test"]["target"]) if short(s, t)][:200]
sources, references = [s for s, _ in test], [t for _, t in test]
batch = tokenizer(sources, padding=True, return_tensors="pt")


def normalised_log_probability(sequences, alpha=0.6):
    labels = sequences[:, 1:].clone()  # drop the decoder start token; what follows </s> is padding
    labels[labels == tokenizer.pad_token_id] = -100
    with torch.no_grad():
        log_p = trained(**batch, labels=labels).logits.log_softmax(-1)
    picked = log_p.gather(-1, labels.clamp(min=0)[..., None])[..., 0] * (labels != -100)
    length = (labels != -100).sum(-1)
    gnmt = getattr(decoding, "length_penalty_form", "power") == "gnmt"
    return picked.sum(-1) / (((5 + length) / 6) ** alpha if gnmt else length**alpha)


with torch.no_grad():
    greedy_ids = trained.generate(**batch, num_beams=1)
    beam_ids = trained.generate(**batch)
greedy_score, beam_score = normalised_log_probability(greedy_ids), normalised_log_probability(beam_ids)
better = (beam_score > greedy_score + 1e-4).sum().item()
worse = (beam_score < greedy_score - 1e-4).sum().item()
assert beam_score.mean() > greedy_score.mean()
print(
    f"mean normalised log P(y|x): greedy {greedy_score.mean():.3f}, beam 4 {beam_score.mean():.3f}; "
    f"beam better on {better}, worse on {worse}, equal on {len(test) - better - worse} sentences"
)
for name, ids in (("greedy", greedy_ids), ("beam 4", beam_ids)):
    result = score(tokenizer.batch_decode(ids, skip_special_tokens=True), references)
    print(f"{name}: sacreBLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f}")

# %% [markdown]
# **Greedy decoding, written out.** The decoder's input is the output so far, *shifted right*: it starts with the
# start token, and each step appends the most likely next token, until `</s>` or the limit. Ten lines, checked
# against `generate(num_beams=1)` on the same 200 sentences, with the same limit for all (30 tokens) and without
# a cache, so that both compute each step the same way (the cache changes the last bits of the logits):


# %%
def greedy_by_hand(batch, limit):
    memory = trained.get_encoder()(**batch).last_hidden_state  # the encoder runs once
    out = torch.full((len(memory), 1), trained.config.decoder_start_token_id)  # shifted right: <s> first
    done = torch.zeros(len(memory), dtype=torch.bool)
    for _ in range(limit):
        logits = trained(
            encoder_outputs=(memory,), attention_mask=batch["attention_mask"], decoder_input_ids=out
        ).logits
        next_token = logits[:, -1].argmax(-1).masked_fill(done, tokenizer.pad_token_id)  # finished rows get padding
        out, done = torch.cat([out, next_token[:, None]], 1), done | (next_token == tokenizer.eos_token_id)
        if done.all():
            break
    return out


with torch.no_grad():
    by_hand = greedy_by_hand(batch, limit=30)
    by_generate = trained.generate(**batch, num_beams=1, max_new_tokens=30, use_cache=False)
assert torch.equal(by_hand, by_generate)
print(f"greedy search by hand = generate(num_beams=1) on all {len(sources)} sentences")

# %% [markdown]
# Two minutes of training make a weak translator: short, common sentences come out right or nearly so, many
# others do not (the main job below gets much further). The attention of its last layer, all four heads, for one
# sentence: what each source token reads in the source (encoder self-attention), what each target position reads in
# the source (encoder–decoder attention), and in the target so far (masked self-attention). The rows are labelled
# differently on purpose: an encoder row is a source token, the input it belongs to; a decoder row is the position
# that *predicts* the labelled token, since position $t$ reads the tokens up to $t - 1$ and outputs token $t$.

# %%
drawn = viz.draw_attention_maps(trained, tokenizer, "Tom is reading a book.", WORK / "attention")
assert drawn["decoder"].triu(diagonal=1).abs().max() == 0  # no head looks ahead, trained or not
torch.testing.assert_close(drawn["cross"].sum(-1), torch.ones(drawn["cross"].shape[:2]))
print("translation:", drawn["target"])
torch.testing.assert_close(drawn["encoder"].sum(-1), torch.ones(drawn["encoder"].shape[:2]))
show(drawn["files"]["encoder"])
show(drawn["files"]["cross"])
show(drawn["files"]["decoder"])

# %% [markdown]
# ## Where to go next
#
# * **Train for real.** `bash scripts/main.sh` trains the same small model for 6 minutes on all 100,000 pairs
#   and scores the 2,000 test pairs: sacreBLEU 26.75 ([training.md](training.md#the-main-job)). The command
#   line is `vanilla-transformer train --config configs/tatoeba_en_de_small.yaml`, every option in
#   [training.md](training.md#options).
# * **An hour on Multi30k.** $d_{model}$ 256, 3 + 3 layers, 60 minutes on 2 CPU cores: German→English
#   sacreBLEU 41.01, English→German 38.33
#   ([results](../benchmarks/results/multi30k-60min.md), [benchmarks.md](benchmarks.md#quality-at-a-fixed-budget-multi30k)).
# * **Table 3.** The paper's variations of the base model (heads and head sizes, model size, dropout and label
#   smoothing, learned positions) are rerun at a small scale in
#   [table3.md](../benchmarks/results/table3.md), with `python benchmarks/table3.py`; at its budget of 750 steps
#   a row, it compares how fast each variation learns, not converged quality, and its report says so.
# * **Model cards.** [`model_cards/`](../model_cards) holds one Hugging Face card per preset and per trained
#   model, with its measured scores and the command that produced them.
# * **transformers' `Seq2SeqTrainer`.** `vanilla_transformer.finetuning` sets it up with the paper's recipe;
#   [`examples/finetune_seq2seq_trainer.py`](../examples/finetune_seq2seq_trainer.py) runs it
#   ([transformers.md](transformers.md#fine-tuning-with-seq2seqtrainer)).
# * **The Hub.** `vanilla-transformer train --push-to-hub your-name/repo` uploads the final folder, model card
#   included; then anyone with transformers can run
#   `pipeline("vanilla-translation", model="your-name/repo", trust_remote_code=True)`
#   ([transformers.md](transformers.md#sharing-on-the-hub)).
# * **The code.** [`modeling_vanilla_transformer.py`](../vanilla_transformer/modeling_vanilla_transformer.py)
#   reads in the paper's order; [model.md](model.md) lists what the paper leaves open and what was chosen.

# %% [markdown]
# ## Appendix: saving, loading and `trust_remote_code`
#
# The untrained model of §1–8, saved and loaded back, first through the package, then without it.
#
# **Save and load.** `save_pretrained` writes the weights, `config.json`, `generation_config.json` (the paper's
# decoding) and the model's own source files. `import vanilla_transformer` registered the model with
# transformers' Auto classes, so `AutoModelForSeq2SeqLM` loads the folder like any other:

# %%
from transformers import AutoModelForSeq2SeqLM

folder = WORK / "walkthrough-model"
model.save_pretrained(folder)
print(sorted(path.name for path in folder.iterdir()))
print("auto_map:", json.loads((folder / "config.json").read_text())["auto_map"])

reloaded = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
assert type(reloaded) is VanillaTransformerForConditionalGeneration
assert reloaded.lm_head.weight is reloaded.model.shared.weight  # still one matrix after loading
assert torch.equal(logits_for(source, target), reloaded(input_ids=source, decoder_input_ids=target).logits)
print("reloaded: identical logits")

# %% [markdown]
# **Without the package: `trust_remote_code`.** `config.json` carries an `auto_map` (which class of which file
# each Auto class should use), and the folder carries those files, which import only torch and transformers.
# Where the package is *not* installed, `AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)`
# imports the folder's own `modeling_vanilla_transformer.py` and builds the model from it; the flag is your
# consent to run code that came with the weights (from the Hub, say). Where the package *is* imported, as here,
# the registered class is used and the flag changes nothing. Without the package, `AutoTokenizer` needs the
# flag too for such a folder, because it reads `config.json` first. The subprocess below hides the package and
# loads the folder:

# %%
torch.save({"source": source, "target": target}, WORK / "inputs.pt")
script = f"""
import sys, torch
sys.modules["vanilla_transformer"] = None  # the package cannot be imported: only transformers + the folder
from transformers import AutoModelForSeq2SeqLM
model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True, attn_implementation="eager").eval()
inputs = torch.load({str(WORK / "inputs.pt")!r})
with torch.no_grad():
    logits = model(input_ids=inputs["source"], decoder_input_ids=inputs["target"]).logits
torch.save({{"module": type(model).__module__, "logits": logits}}, {str(WORK / "remote.pt")!r})
"""
loaded = subprocess.run([sys.executable, "-c", script], env=os.environ.copy(), capture_output=True, text=True)
assert loaded.returncode == 0, loaded.stderr[-2000:]
remote = torch.load(WORK / "remote.pt")
assert remote["module"].startswith("transformers_modules.")  # the folder's copy of the code ran
assert torch.equal(remote["logits"], logits_for(source, target))
print(
    f"without the package the class came from {remote['module'].split('.')[-1]}.py in the folder "
    f"(module {remote['module'].split('.')[0]}.…); identical logits"
)

# %% [markdown]
# Everything this notebook wrote, the trained model in `run/final` included, lies in one temporary folder.
# Copy what you want to keep first (`shutil.copytree(run / "final", "my-model")` keeps the translator and its
# tokenizer), then remove it:

# %%
shutil.rmtree(WORK)
assert not WORK.exists()
print("removed this run's temporary folder")
