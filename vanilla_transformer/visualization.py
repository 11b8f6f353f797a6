"""See inside: the paper's pictures, drawn from the real code and a real model.

Every function here computes its data with the objects the model and the training loop use, draws
it with matplotlib (the Agg renderer, no window, no pyplot state) into a PNG, and returns the data it
plotted, so that tests can check the picture's content and not only that a file exists:

    §3    the model (Figure 1)       -> plot_architecture          (read off a model's modules)
    §3.5  positional encodings       -> plot_positional_encoding   (the model's own ``pe`` buffer)
    §3.2.3 causal and padding masks  -> plot_masks                 (the model's create_causal_mask /
                                                                    create_bidirectional_mask)
    §5.3  learning-rate schedule     -> plot_learning_rate         (schedule.noam_learning_rate)
    §5.4  label smoothing            -> plot_label_smoothing       (the target distribution of
                                                                    F.cross_entropy's smoothing)
    §3.2  attention maps             -> attention_maps, plot_attention, draw_attention, draw_attention_maps
                                         (eager attention weights of a saved or training model)

``draw_all`` writes all of them into a folder; the command line is ``vanilla-transformer visualize``.
Needs matplotlib: ``pip install -e '.[viz]'`` in a clone.
"""

from __future__ import annotations

import copy
import io
import math
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerSinusoidalPositionalEncoding,
    create_bidirectional_mask,
    create_causal_mask,
)
from .schedule import noam_learning_rate

__all__ = [
    "attention_maps",
    "attention_weights",
    "draw_all",
    "draw_attention",
    "draw_attention_maps",
    "label_smoothing_distribution",
    "architecture",
    "plot_architecture",
    "plot_attention",
    "plot_label_smoothing",
    "plot_learning_rate",
    "plot_masks",
    "plot_positional_encoding",
    "readable_tokens",
    "require_matplotlib",
]

#: File names written by ``draw_all`` / ``vanilla-transformer visualize``.
FILES = {
    "architecture": "architecture.png",
    "positional_encoding": "positional_encoding.png",
    "masks": "masks.png",
    "learning_rate": "learning_rate.png",
    "label_smoothing": "label_smoothing.png",
    "encoder": "attention_encoder.png",
    "decoder": "attention_decoder.png",
    "cross": "attention_cross.png",
}
#: The learning-rate settings drawn: (d_model, warmup_steps); the first is the paper's base model.
SCHEDULES = ((512, 4000), (512, 8000), (1024, 4000), (1024, 8000))
DPI = 100


# --------------------------------------------------------------------------------------------
# Figures: matplotlib's object API with the Agg canvas (no pyplot, no global backend switch).
# --------------------------------------------------------------------------------------------
def require_matplotlib() -> None:
    """Raise a clear ImportError when matplotlib (the ``viz`` extra) is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "Pictures need matplotlib: pip install -e '.[viz]' in a clone of this package (or pip install matplotlib)."
        ) from error


def _figure(width: float, height: float):
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path) -> Path:
    """PNG with nothing clipped (tight bounding box), optimised, and reduced to 256 colours when still large."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", pad_inches=0.15, facecolor="white")
    buffer.seek(0)
    image, out = Image.open(buffer).convert("RGB"), io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    if out.tell() > 150_000:  # many colours (the positional-encoding heat map): a 256-colour palette
        out = io.BytesIO()
        image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, format="PNG", optimize=True)
    path.write_bytes(out.getvalue())
    return path


def _numpy(tensor: torch.Tensor):
    return tensor.detach().float().cpu().numpy()


def _label_fontsize(n: int) -> float:
    return 9 if n <= 16 else 7.5 if n <= 28 else 6 if n <= 45 else 4.5


# --------------------------------------------------------------------------------------------
# §3 The model (Figure 1), read off its modules
# --------------------------------------------------------------------------------------------
def _base_model(model):
    """The encoder–decoder inside a ...ForConditionalGeneration (or the model itself)."""
    return model.model if hasattr(model, "model") and hasattr(model.model, "encoder") else model


def _layer_blocks(layer) -> list[str]:
    """The boxes of one encoder or decoder layer, bottom up, from its sub-layer modules and its
    ``norm_first`` (post-LN: Sub-layer, Add & Norm; pre-LN: Norm, Sub-layer, Add)."""
    sublayers = [("self_attn", "Masked Multi-Head Attention" if layer.self_attn.is_causal else "Multi-Head Attention")]
    if hasattr(layer, "encoder_attn"):  # a decoder layer: queries from below, keys and values from the encoder
        sublayers.append(("encoder_attn", "Multi-Head Attention (K, V: encoder)"))
    sublayers.append(("ffn", "Feed Forward"))
    blocks = []
    for _, name in sublayers:
        blocks += ["Norm", name, "Add"] if layer.norm_first else [name, "Add & Norm"]
    return blocks


def architecture(model) -> dict[str, Any]:
    """What Figure 1 shows, read off ``model`` (a VanillaTransformerModel or ...ForConditionalGeneration):
    for each stack its input boxes, the boxes of one layer (bottom up), its number of layers and its
    final norm (pre-LN only); whether the pre-softmax linear layer is the embedding matrix itself; and
    the sizes the labels quote."""
    base = _base_model(model)
    config = model.config
    stacks = {}
    for side, stack in (("encoder", base.encoder), ("decoder", base.decoder)):
        scaled = stack.embed_scale != 1.0
        positions = "Positional Encoding" if config.position_embedding_type == "sinusoidal" else "Learned Positions"
        stacks[side] = {
            "inputs": [
                ("Input" if side == "encoder" else "Output") + " Embedding" + (" × √d_model" if scaled else ""),
                positions,
            ],
            "layer": _layer_blocks(stack.layers[0]),
            "layers": len(stack.layers),
            "final_norm": stack.layer_norm is not None,
        }
    head = getattr(model, "lm_head", None)
    shared = head is not None and head.weight is base.encoder.embed_tokens.weight  # tied: one Parameter
    return {
        **stacks,
        "shared_output_matrix": shared,
        "sizes": {
            "d_model": config.d_model,
            "heads": config.encoder_attention_heads,
            "d_ff": config.encoder_ffn_dim,
            "vocab": config.vocab_size,
        },
    }


def _paper_base_model():
    """The paper's base model (Table 3), built on the meta device: its modules without its 63M numbers."""
    with torch.device("meta"):
        return VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.base())


def plot_architecture(path: str | Path, model) -> dict[str, Any]:
    """The paper's Figure 1, drawn from ``model``'s own modules (see ``architecture``): the encoder on the
    left, the decoder on the right, one layer of each with "N×" its count, the residual connections, and
    the encoder's output entering every decoder layer's encoder–decoder attention.

    Returns ``architecture(model)`` plus ``"texts"`` (every label drawn) and ``"path"``.
    """
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    plan = architecture(model)
    colours = {
        "Attention": "#fbe3c4",
        "Feed Forward": "#cfe8f7",
        "Norm": "#f6f3b5",
        "Add": "#f6f3b5",
        "Embedding": "#f7d0d0",
        "Linear": "#dcd0f0",
        "Softmax": "#d4efd4",
    }
    width, height, gap = 3.4, 0.55, 0.3
    texts: list[str] = []
    fig = _figure(9.5, 11)
    ax = fig.subplots()
    ax.set_axis_off()

    def box(x, y, label):
        colour = next((c for key, c in colours.items() if key in label), "#eeeeee")
        ax.add_patch(
            FancyBboxPatch(
                (x - width / 2, y),
                width,
                height,
                boxstyle="round,pad=0.02,rounding_size=0.1",
                facecolor=colour,
                edgecolor="#444444",
                linewidth=1,
            )
        )
        ax.text(x, y + height / 2, label, ha="center", va="center", fontsize=9.5)
        texts.append(label)
        return y + height

    def arrow(start, end, **style):
        ax.add_patch(
            FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11, color="#333333", linewidth=1.1, **style)
        )

    def stack(x, side, caption):
        """Draw one stack bottom up; return the y of its top and the y of each box's middle, by label index."""
        s = plan[side]
        y = 0.0
        ax.text(x, y, caption, ha="center", va="bottom", fontsize=10, style="italic")
        texts.append(caption)
        y += 0.45
        arrow((x, y), (x, y + gap))
        y = box(x, y + gap, s["inputs"][0])
        arrow((x, y), (x, y + gap))
        ax.text(x, y + gap + 0.12, "+", ha="center", va="center", fontsize=15)  # embeddings + positions
        outside = -1 if side == "encoder" else 1  # labels and residual paths on the outer side of each stack
        ax.text(
            x + outside * 0.3,
            y + gap + 0.12,
            s["inputs"][1],
            ha="left" if outside > 0 else "right",
            va="center",
            fontsize=9,
        )
        texts.append(s["inputs"][1])
        y += gap + 0.25
        layer_bottom = y + gap / 2
        middles = []
        residual_from = y + gap / 2
        for label in s["layer"]:
            arrow((x, y), (x, y + gap))
            bottom = y + gap
            y = box(x, bottom, label)
            middles.append((label, bottom + height / 2))
            if label.startswith("Add"):  # the residual: from below the sub-layer (and its norm) to the sum
                side_x = x + (width / 2 + 0.25) * outside
                ax.plot(
                    [x, side_x, side_x],
                    [residual_from, residual_from, bottom + height / 2],
                    color="#777777",
                    linewidth=1,
                )
                arrow((side_x, bottom + height / 2), (x + (width / 2) * outside, bottom + height / 2))
                residual_from = y + gap / 2
        frame_top = y + gap / 2
        ax.add_patch(
            FancyBboxPatch(
                (x - width / 2 - 0.45, layer_bottom),
                width + 0.9,
                frame_top - layer_bottom,
                boxstyle="round,pad=0.05,rounding_size=0.2",
                facecolor="none",
                edgecolor="#888888",
                linewidth=1.2,
            )
        )
        count = f"{s['layers']}×"
        ax.text(
            x + outside * (width / 2 + 0.75),
            (layer_bottom + frame_top) / 2,
            count,
            ha="center",
            va="center",
            fontsize=13,
            weight="bold",
        )
        texts.append(count)
        if s["final_norm"]:
            arrow((x, frame_top), (x, frame_top + gap))
            y = box(x, frame_top + gap, "Norm (final, pre-LN)")
        else:
            y = frame_top
        return y, middles

    encoder_x, decoder_x = 2.6, 7.4
    encoder_top, _ = stack(encoder_x, "encoder", "Inputs (source tokens)")
    decoder_top, decoder_middles = stack(decoder_x, "decoder", "Outputs (target tokens, shifted right)")
    cross = next(middle for label, middle in decoder_middles if "K, V" in label)
    route_y = encoder_top + 0.35  # the encoder's output goes up, across, and into every decoder layer
    ax.plot(
        [encoder_x, encoder_x, (encoder_x + decoder_x) / 2, (encoder_x + decoder_x) / 2],
        [encoder_top, route_y, route_y, cross],
        color="#333333",
        linewidth=1.1,
    )
    arrow(((encoder_x + decoder_x) / 2, cross), (decoder_x - width / 2, cross))
    ax.text(encoder_x, route_y + 0.12, "encoder output (K, V)", ha="center", va="bottom", fontsize=8.5)
    texts.append("encoder output (K, V)")
    linear = "Linear (= embedding matrixᵀ)" if plan["shared_output_matrix"] else "Linear"
    y = decoder_top
    for label in (linear, "Softmax"):
        arrow((decoder_x, y), (decoder_x, y + gap))
        y = box(decoder_x, y + gap, label)
    arrow((decoder_x, y), (decoder_x, y + gap))
    ax.text(decoder_x, y + gap + 0.05, "Output probabilities", ha="center", va="bottom", fontsize=10, style="italic")
    texts.append("Output probabilities")
    sizes = plan["sizes"]
    title = (
        f"The Transformer (Figure 1), read off this model: d_model {sizes['d_model']}, {sizes['heads']} heads, "
        f"d_ff {sizes['d_ff']}, vocabulary {sizes['vocab']:,}"
    )
    ax.set_title(title, fontsize=10.5)
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.2, y + gap + 0.6)
    return {**plan, "texts": texts, "path": _save(fig, path)}


# --------------------------------------------------------------------------------------------
# §3.5 Positional encodings
# --------------------------------------------------------------------------------------------
def plot_positional_encoding(
    path: str | Path,
    model=None,
    d_model: int = 512,
    num_positions: int = 100,
    dims: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Heat map (positions × dimensions) of the encoder's positional-encoding module, plus curves.

    With ``model``, the table is its encoder's ``embed_positions`` (the ``pe`` buffer of
    ``VanillaTransformerSinusoidalPositionalEncoding``; learned positions are drawn too). Without,
    a ``VanillaTransformerSinusoidalPositionalEncoding(num_positions, d_model)`` is built: the
    module the model uses. Returns ``{"encoding": [num_positions, d_model] tensor, "dims",
    "curves": {dim: [num_positions] tensor}, "learned", "path"}``.
    """
    if model is not None:
        module = _base_model(model).encoder.embed_positions
    else:
        module = VanillaTransformerSinusoidalPositionalEncoding(num_positions, d_model)
    learned = not hasattr(module, "pe")
    table_rows = module.num_embeddings if learned else module.pe.shape[0]
    num_positions = min(num_positions, table_rows)  # the stored table itself, not positions computed past it
    with torch.no_grad():
        encoding = module(num_positions).detach().float().cpu()  # [positions, d_model]: pe[0:num_positions]
    d_model = encoding.shape[1]
    if dims is None:
        # a fast sine/cosine pair and two slower sines: wavelengths of about 10, 40 and 160 positions
        fast, medium, slow = (min(2 * round(f * d_model / 2), d_model - 2) for f in (0.05, 0.2, 0.35))
        dims = sorted({fast, fast + 1, medium, slow})
    for d in dims:
        if not 0 <= d < d_model:
            raise ValueError(f"dims: dimension {d} does not exist; valid dimensions are 0..{d_model - 1}.")
    curves = {d: encoding[:, d].clone() for d in dims}

    fig = _figure(15, 5)
    heat, lines = fig.subplots(1, 2, width_ratios=[1.25, 1])
    limit = 1.0 if not learned else float(encoding.abs().max())
    image = heat.imshow(
        _numpy(encoding), aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="antialiased"
    )
    heat.set_xlabel("dimension i (even: sine, odd: cosine)")
    heat.set_ylabel("position")
    kind = (
        "learned position embeddings"
        if learned
        else "PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))"
    )
    heat.set_title(f"Positional encodings (§3.5), d_model = {d_model}\n{kind}", fontsize=10)
    fig.colorbar(image, ax=heat, label="value added to the embedding", shrink=0.9)
    positions = torch.arange(num_positions).numpy()
    for d, values in curves.items():
        wavelength = 2 * math.pi * 10000 ** ((d - d % 2) / d_model)
        wave = "" if learned else f": {'sin' if d % 2 == 0 else 'cos'}, wavelength ≈ {wavelength:.0f}"
        lines.plot(positions, _numpy(values), label=f"dimension {d}{wave}", linewidth=1.6)
    lines.set_xlabel("position")
    lines.set_ylabel("value")
    lines.set_title("A few dimensions along the positions", fontsize=10)
    lines.grid(alpha=0.3)
    lines.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return {"encoding": encoding, "dims": list(dims), "curves": curves, "learned": learned, "path": _save(fig, path)}


# --------------------------------------------------------------------------------------------
# §3.2.3 Masks: built by the functions the model calls (eager attention: additive 0 / -inf masks)
# --------------------------------------------------------------------------------------------
def _eager_config(config=None):
    config = copy.deepcopy(config) if config is not None else VanillaTransformerConfig()
    config._attn_implementation = "eager"
    return config


def plot_masks(
    path: str | Path,
    tokenizer=None,
    sentences: Sequence[str] | None = None,
    lengths: Sequence[int] = (9, 5),
    config=None,
) -> dict[str, Any]:
    """The decoder's causal mask and the padding mask of a padded batch, as the model builds them.

    The masks come from ``create_causal_mask`` / ``create_bidirectional_mask`` (imported by the
    modeling file, called as the encoder and decoder call them) with eager attention, whose masks
    are added to the attention scores: 0 where a query may attend, the dtype's minimum ("-inf")
    where it may not. The batch is ``sentences`` tokenised and padded by ``tokenizer``, or
    sequences of ``lengths`` tokens. The picture shows the batch's most padded sequence.

    Returns boolean ``[T, T]`` masks (True = attended) ``causal`` (no padding), ``padding`` (the
    encoder's mask of the padded sequence) and ``decoder`` (causal and padding together), the
    additive masks ``*_additive`` they were read from, the 2-D ``attention_mask`` [B, T] of the
    batch, ``padded_index``, ``length`` (its real tokens), ``tokens`` and ``path``.
    """
    if tokenizer is not None:
        sentences = list(sentences or ("Ein Mann fährt Fahrrad auf der Straße.", "Zwei Hunde spielen."))
        batch = tokenizer(sentences, padding=True, return_tensors="pt")
        attention_mask = batch["attention_mask"].long()
        tokens = [tokenizer.convert_ids_to_tokens(row.tolist()) for row in batch["input_ids"]]
        labels = [readable_tokens(row, tokenizer) for row in tokens]
    else:
        width = max(lengths)
        attention_mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
        tokens = [[f"x{i + 1}" for i in range(n)] + ["<pad>"] * (width - n) for n in lengths]
        labels = tokens
    batch_size, seq_len = attention_mask.shape
    config = _eager_config(config)
    inputs_embeds = torch.zeros(batch_size, seq_len, 1)  # only its shape, dtype and device are read
    causal = create_causal_mask(
        config=config, inputs_embeds=inputs_embeds, attention_mask=torch.ones_like(attention_mask), cache=None
    )
    padded_causal = create_causal_mask(
        config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, cache=None
    )
    padding = create_bidirectional_mask(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
    if padding is None:  # nothing padded: the model passes no mask at all
        padding = torch.zeros(batch_size, 1, seq_len, seq_len)
    index = int(attention_mask.sum(-1).argmin())
    length = int(attention_mask[index].sum())
    additive = {"causal": causal[index, 0], "padding": padding[index, 0], "decoder": padded_causal[index, 0]}
    allowed = {name: mask == 0 for name, mask in additive.items()}

    require_matplotlib()
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap(["#eeeeee", "#2b6cb0"])
    fig = _figure(16, 5.6)
    axes = fig.subplots(1, 3)
    positions = [str(i) for i in range(seq_len)]
    pad_labels = [p if i < length else f"{p} pad" for i, p in enumerate(positions)]
    panels = (
        ("causal", "Decoder self-attention: causal mask\n(no attention to later positions)", positions, positions),
        (
            "padding",
            f"Encoder self-attention: padding mask\n(sentence {index + 1} of a padded batch of {batch_size})",
            labels[index],
            labels[index],
        ),
        (
            "decoder",
            "Decoder self-attention of a padded target:\ncausal and padding masks together",
            pad_labels,
            pad_labels,
        ),
    )
    fontsize = _label_fontsize(seq_len)
    for ax, (name, title, ylabels, xlabels) in zip(axes, panels):
        image = ax.imshow(_numpy(allowed[name].float()), cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks(range(seq_len), xlabels, rotation=90, fontsize=fontsize)
        ax.set_yticks(range(seq_len), ylabels, fontsize=fontsize)
        ax.set_xticks([x - 0.5 for x in range(1, seq_len)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, seq_len)], minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("key (attended position)")
        ax.set_ylabel("query position")
        ax.set_title(title, fontsize=10)
    bar = fig.colorbar(image, ax=list(axes), ticks=[0.25, 0.75], shrink=0.7)
    bar.ax.set_yticklabels(["masked: -inf\nadded to the score", "attended: 0\nadded"], fontsize=9)
    return {
        **allowed,
        **{f"{name}_additive": mask for name, mask in additive.items()},
        "attention_mask": attention_mask,
        "padded_index": index,
        "length": length,
        "tokens": tokens,
        "path": _save(fig, path),
    }


# --------------------------------------------------------------------------------------------
# §5.3 Learning-rate schedule
# --------------------------------------------------------------------------------------------
def plot_learning_rate(
    path: str | Path, settings: Sequence[tuple[int, int]] = SCHEDULES, max_steps: int = 40000
) -> dict[str, Any]:
    """lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), from ``schedule.noam_learning_rate``
    (which ``make_optimizer_and_schedule``'s scheduler is tested to equal) for each (d_model, warmup).

    Returns ``{"steps": [max_steps] tensor (1..max_steps), "curves": {(d_model, warmup): tensor}, "path"}``.
    """
    steps = torch.arange(1, max_steps + 1)
    curves = {
        (d, w): torch.tensor([noam_learning_rate(s, d, w) for s in steps.tolist()], dtype=torch.float64)
        for d, w in settings
    }
    fig = _figure(12, 5)
    ax = fig.subplots()
    for (d, w), values in curves.items():
        paper = " (the paper's base model)" if (d, w) == (512, 4000) else ""
        (line,) = ax.plot(steps.numpy(), values.numpy(), linewidth=1.8, label=f"d_model = {d}, warmup = {w}{paper}")
        peak = noam_learning_rate(w, d, w)
        ax.plot([w], [peak], "o", color=line.get_color(), markersize=5)
        ax.annotate(
            f"{peak:.2e}", (w, peak), textcoords="offset points", xytext=(6, 4), fontsize=8, color=line.get_color()
        )
    ax.set_xlabel("training step")
    ax.set_ylabel("learning rate")
    ax.set_title(
        "Learning rate (§5.3): linear warm-up, then ∝ 1/√step;  "
        "lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)",
        fontsize=10,
    )
    ax.set_xlim(0, max_steps)
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    return {"steps": steps, "curves": curves, "path": _save(fig, path)}


# --------------------------------------------------------------------------------------------
# §5.4 Label smoothing
# --------------------------------------------------------------------------------------------
def label_smoothing_distribution(vocab_size: int, gold: int, epsilon: float = 0.1) -> torch.Tensor:
    """The target distribution q that the model's loss uses for one token, read off the loss itself.

    The loss is ``F.cross_entropy(logits, labels, label_smoothing=ε)`` (the model's ``smoothing=``);
    its gradient with respect to the logits z is ``softmax(z) - q``, so q = softmax(z) - ∂loss/∂z
    for any z. (That is 1-ε+ε/V on the gold token and ε/V on every other one, padding included.)
    """
    if not 0 <= gold < vocab_size:
        raise ValueError(f"gold={gold} is not a token id of a vocabulary of {vocab_size}; valid: 0..{vocab_size - 1}.")
    logits = torch.randn(
        1, vocab_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True
    )
    loss = F.cross_entropy(logits, torch.tensor([gold]), label_smoothing=epsilon)
    (gradient,) = torch.autograd.grad(loss, logits)
    return (logits.softmax(-1) - gradient).detach()[0]


def plot_label_smoothing(
    path: str | Path,
    epsilon: float = 0.1,
    tokens: Sequence[str] = ("<pad>", "<s>", "</s>", "<unk>", "a", "man", "rides", "bike", "on", "the", "street", "."),
    gold: int = 5,
    vocab_size: int = 37000,
) -> dict[str, Any]:
    """The label-smoothed target for one token (§5.4), over a toy vocabulary ``tokens`` (gold
    ``tokens[gold]``) and over a real-size vocabulary of ``vocab_size`` (log scale).

    Returns ``{"distribution": [len(tokens)], "tokens", "gold", "epsilon", "vocab_size",
    "large_distribution": [vocab_size], "large_gold" (its gold id), "path"}``.
    """
    small = label_smoothing_distribution(len(tokens), gold, epsilon)
    large_gold = vocab_size // 2  # any id would do; mid-axis, where the spike is visible
    large = label_smoothing_distribution(vocab_size, large_gold, epsilon)
    fig = _figure(15, 4.8)
    left, right = fig.subplots(1, 2, width_ratios=[1.3, 1])
    x = torch.arange(len(tokens)).numpy()
    one_hot = torch.zeros(len(tokens))
    one_hot[gold] = 1
    left.bar(
        x, _numpy(one_hot), width=0.8, color="none", edgecolor="#999999", linestyle="--", label="one-hot target (ε = 0)"
    )
    left.bar(x, _numpy(small), width=0.55, color="#2b6cb0", label=f"smoothed target (ε = {epsilon:g})")
    left.set_xticks(x, list(tokens), fontsize=9)
    left.set_ylim(0, 1.08)
    left.set_ylabel("target probability")
    v = len(tokens)
    left.set_title(
        f"Label smoothing (§5.4): the target for the gold token “{tokens[gold]}”, toy vocabulary of V = {v}\n"
        f"1 − ε + ε/V = {small[gold].item():.4f} on the gold token, ε/V = {small[(gold + 1) % v].item():.4f} "
        f"on every other one (padding included)",
        fontsize=10,
    )
    left.legend(fontsize=9, loc="upper right")
    for i, value in enumerate(small.tolist()):
        if i != gold:
            left.annotate(
                f"{value:.3f}", (i, value), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7
            )
    right.semilogy(
        torch.arange(vocab_size).numpy(),
        _numpy(large),
        color="#2b6cb0",
        linewidth=1.2,
        label=f"ε/V on each of the other {vocab_size - 1:,} tokens",
    )
    gold_value = large[large_gold].item()
    right.vlines([large_gold], large.min().item(), gold_value, color="#c0392b", linewidth=2)
    right.plot([large_gold], [gold_value], "o", color="#c0392b", label=f"gold token (id {large_gold:,})")
    right.annotate(
        f"{gold_value:.6f}", (large_gold, gold_value), textcoords="offset points", xytext=(8, -4), fontsize=9
    )
    right.legend(fontsize=9, loc="center right")
    right.set_xlim(0, vocab_size - 1)
    right.set_ylim(large.min().item() / 5, 2)
    right.set_xlabel("token id")
    right.set_ylabel("target probability (log scale)")
    right.set_title(
        f"The same with a real vocabulary, V = {vocab_size:,}:\n"
        f"{large[large_gold].item():.6f} on the gold token, ε/V = {large.min().item():.2e} on each other one",
        fontsize=10,
    )
    right.grid(alpha=0.3, which="major")
    return {
        "distribution": small,
        "tokens": list(tokens),
        "gold": gold,
        "epsilon": epsilon,
        "vocab_size": vocab_size,
        "large_distribution": large,
        "large_gold": large_gold,
        "path": _save(fig, path),
    }


# --------------------------------------------------------------------------------------------
# §3.2 Attention maps of a real model
# --------------------------------------------------------------------------------------------
_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    """Inverse of byte-level BPE's byte -> printable character table (GPT-2's ``bytes_to_unicode``)."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
        chars, extra = {b: b for b in printable}, 0
        for b in range(256):
            if b not in chars:
                chars[b], extra = 256 + extra, extra + 1
        _BYTE_DECODER = {chr(c): b for b, c in chars.items()}
    return _BYTE_DECODER


def readable_tokens(tokens: Sequence[str], tokenizer=None) -> list[str]:
    """Sub-word tokens as people read them: byte-level BPE symbols decoded to text ('fÃ¤hrt' -> 'fährt'),
    the word-start marker ('Ġ', or SentencePiece's '▁') dropped, and a piece that continues the
    previous word prefixed with '##' ('Fahr', '##rad'). Special tokens are kept as they are.
    """
    decoder = _byte_decoder()
    special = set(getattr(tokenizer, "all_special_tokens", None) or ())
    labels = []
    for i, token in enumerate(tokens):
        if token in special or (token.startswith("<") and token.endswith(">")):
            labels.append(token)
            continue
        if all(ch in decoder for ch in token):
            text = bytes(decoder[ch] for ch in token).decode("utf-8", errors="replace")
        else:
            text = token.replace("▁", " ")
        word_start = text.startswith(" ")
        text = text.strip() or "(space)"
        labels.append(text if word_start or i == 0 else f"##{text}")
    return labels


@contextmanager
def _eager_attention(model):
    """Eager attention (the one that returns weights) for the duration, then the model's own again."""
    previous = model.config._attn_implementation
    if previous != "eager":
        model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        if previous not in (None, "eager"):
            model.set_attn_implementation(previous)


def _check_index(what: str, index: int, count: int, where: str) -> int:
    if not isinstance(index, int) or isinstance(index, bool) or not -count <= index < count:
        raise ValueError(
            f"{what} {index!r} does not exist: the {where} has {count} {what}s, so valid values are "
            f"0..{count - 1} (or -{count}..-1, counted from the last)."
        )
    return index % count


def _check_layer_and_heads(config, layer: int, heads: Sequence[int] | None) -> tuple[int, int, list[int], list[int]]:
    encoder_layer = _check_index("layer", layer, config.encoder_layers, "encoder")
    decoder_layer = _check_index("layer", layer, config.decoder_layers, "decoder")
    encoder_heads = list(range(config.encoder_attention_heads)) if heads is None else heads
    decoder_heads = list(range(config.decoder_attention_heads)) if heads is None else heads
    encoder_heads = [
        _check_index("head", h, config.encoder_attention_heads, "encoder's attention") for h in encoder_heads
    ]
    decoder_heads = [
        _check_index("head", h, config.decoder_attention_heads, "decoder's attention") for h in decoder_heads
    ]
    if not encoder_heads:
        raise ValueError("heads is empty: give at least one head, or None for all of them.")
    return encoder_layer, decoder_layer, encoder_heads, decoder_heads


@torch.no_grad()
def attention_weights(
    model,
    input_ids: torch.Tensor,
    decoder_input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    decoder_attention_mask: torch.Tensor | None = None,
    layer: int = -1,
) -> dict[str, torch.Tensor]:
    """Attention weights of one layer (all heads) for a batch, computed with eager attention whatever
    the model's setting (restored afterwards), in eval mode (no dropout; the mode is restored).

    Returns float32 CPU tensors ``encoder`` [B, H, S, S], ``decoder`` [B, H, T, T] and ``cross``
    [B, H, T, S] (softmax rows: each sums to 1 over the keys; masked keys get 0).
    """
    encoder_layer, decoder_layer, _, _ = _check_layer_and_heads(model.config, layer, None)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with _eager_attention(model):
            out = model(
                input_ids=input_ids.to(device),
                attention_mask=None if attention_mask is None else attention_mask.to(device),
                decoder_input_ids=decoder_input_ids.to(device),
                decoder_attention_mask=None if decoder_attention_mask is None else decoder_attention_mask.to(device),
                output_attentions=True,
                use_cache=False,
            )
    finally:
        model.train(was_training)
    return {
        "encoder": out.encoder_attentions[encoder_layer].float().cpu(),
        "decoder": out.decoder_attentions[decoder_layer].float().cpu(),
        "cross": out.cross_attentions[decoder_layer].float().cpu(),
    }


@torch.no_grad()
def attention_maps(
    model,
    tokenizer,
    source: str,
    target: str | None = None,
    layer: int = -1,
    heads: Sequence[int] | None = None,
    num_beams: int | None = None,
    generate_kwargs: dict | None = None,
) -> dict[str, Any]:
    """Attention maps of every head (or ``heads``) of one layer for a sentence pair.

    The target is ``target`` or, when it is None, the model's own translation (``generate``; beam
    search with ``num_beams``, default the model's: 4 as in the paper). The decoder reads the target
    as in training, ``<s> y1 … yn``, and predicts ``y1 … yn </s>``.

    Returns: ``layer`` (encoder / decoder layer index, from 0), ``heads`` (encoder / decoder),
    ``encoder`` [H, S, S], ``decoder`` [H, T, T], ``cross`` [H, T, S] weights of the chosen heads;
    ``source_tokens`` (S), ``decoder_input_tokens`` (T) and ``output_tokens`` (T, the token each
    decoder position predicts), exactly as ``tokenizer.convert_ids_to_tokens`` gives them, and their
    ``readable_tokens`` as ``source_labels``, ``decoder_input_labels``, ``output_labels``;
    ``source``, ``target`` (the text), ``generated`` (whether the model wrote it).
    """
    encoder_layer, decoder_layer, encoder_heads, decoder_heads = _check_layer_and_heads(model.config, layer, heads)
    config = model.config
    device = next(model.parameters()).device
    input_ids = tokenizer(source, return_tensors="pt")["input_ids"]
    if target is None:
        was_training = model.training
        model.eval()
        try:
            kwargs = {**({"num_beams": num_beams} if num_beams is not None else {}), **(generate_kwargs or {})}
            sequence = model.generate(
                input_ids.to(device), attention_mask=torch.ones_like(input_ids).to(device), **kwargs
            )[0].cpu()
        finally:
            model.train(was_training)
        ids = sequence.tolist()
        if config.eos_token_id in ids[1:]:  # what follows the first end-of-sentence is padding
            ids = ids[: ids.index(config.eos_token_id, 1) + 1]
        decoder_input, output = ids[:-1], ids[1:]
        target_text = tokenizer.decode(output, skip_special_tokens=True)
    else:
        output = tokenizer(text_target=target)["input_ids"]
        decoder_input = [config.decoder_start_token_id, *output[:-1]]
        target_text = target
    weights = attention_weights(model, input_ids, torch.tensor([decoder_input]), layer=layer)
    source_tokens = tokenizer.convert_ids_to_tokens(input_ids[0].tolist())
    decoder_input_tokens = tokenizer.convert_ids_to_tokens(decoder_input)
    output_tokens = tokenizer.convert_ids_to_tokens(output)
    return {
        "layer": {"encoder": encoder_layer, "decoder": decoder_layer},
        "num_layers": {"encoder": config.encoder_layers, "decoder": config.decoder_layers},
        "heads": {"encoder": encoder_heads, "decoder": decoder_heads},
        "encoder": weights["encoder"][0, encoder_heads],
        "decoder": weights["decoder"][0, decoder_heads],
        "cross": weights["cross"][0, decoder_heads],
        "source_tokens": source_tokens,
        "decoder_input_tokens": decoder_input_tokens,
        "output_tokens": output_tokens,
        "source_labels": readable_tokens(source_tokens, tokenizer),
        "decoder_input_labels": readable_tokens(decoder_input_tokens, tokenizer),
        "output_labels": readable_tokens(output_tokens, tokenizer),
        "source": source,
        "target": target_text,
        "generated": target is None,
    }


def plot_attention(
    path: str | Path,
    weights: torch.Tensor,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    title: str,
    heads: Sequence[int] | None = None,
    query_axis: str = "query",
    key_axis: str = "key",
) -> dict[str, Any]:
    """One panel per head of ``weights`` [H, queries, keys], rows labelled ``query_labels`` and
    columns ``key_labels``, on one colour scale from 0 to 1. Returns ``{"weights", "path"}``."""
    n_heads, n_queries, n_keys = weights.shape
    if len(query_labels) != n_queries or len(key_labels) != n_keys:
        raise ValueError(
            f"{len(query_labels)} query and {len(key_labels)} key labels for weights of shape {tuple(weights.shape)}."
        )
    heads = list(range(n_heads)) if heads is None else list(heads)
    columns = min(4, n_heads)
    rows = math.ceil(n_heads / columns)
    panel_width = 14.5 / columns
    panel_height = min(max(panel_width * n_queries / max(n_keys, 1), 1.8), 5.0)
    fig = _figure(16, rows * panel_height + 1.6)
    axes = fig.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)
    fontsize = _label_fontsize(max(n_queries, n_keys))
    for i, ax in enumerate(axes.flat):
        if i >= n_heads:
            ax.set_visible(False)
            continue
        image = ax.imshow(_numpy(weights[i]), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_title(f"head {heads[i]}", fontsize=10)
        ax.set_xticks(range(n_keys), list(key_labels), rotation=90, fontsize=fontsize)
        ax.set_yticks(range(n_queries), list(query_labels), fontsize=fontsize)
        ax.tick_params(length=2)
        if i % columns == 0:
            ax.set_ylabel(query_axis, fontsize=9)
        if i >= n_heads - columns:
            ax.set_xlabel(key_axis, fontsize=9)
            ax.tick_params(labelbottom=True)
    fig.suptitle(title, fontsize=11)
    fig.colorbar(image, ax=[ax for ax in axes.flat if ax.get_visible()], shrink=0.8, label="attention weight")
    return {"weights": weights, "path": _save(fig, path)}


#: The three kinds of attention maps: (title, query labels, key labels, query axis, key axis), labels by key of
#: ``attention_maps``' result.
ATTENTION_KINDS = {
    "encoder": (
        "Encoder self-attention",
        "source_labels",
        "source_labels",
        "source token (query)",
        "source token (key)",
    ),
    "decoder": (
        "Decoder (masked) self-attention",
        "decoder_input_labels",
        "decoder_input_labels",
        "decoder input (query)",
        "decoder input (key)",
    ),
    "cross": (
        "Encoder–decoder attention",
        "output_labels",
        "source_labels",
        "predicted target token (query)",
        "source token (key)",
    ),
}


def draw_attention(
    path: str | Path, maps: dict[str, Any], kind: str, heads: Sequence[int] | None = None
) -> dict[str, Any]:
    """One kind of ``attention_maps``' result drawn into ``path``: ``kind`` is ``"encoder"`` (encoder
    self-attention), ``"decoder"`` (masked decoder self-attention) or ``"cross"`` (encoder–decoder attention,
    rows labelled with the token each decoder position predicts); ``heads``: head numbers among the maps'
    heads (default: all of them). Returns ``plot_attention``'s ``{"weights", "path"}`` plus ``heads``."""
    if kind not in ATTENTION_KINDS:
        raise ValueError(
            f"kind {kind!r} is not a kind of attention map; use one of {', '.join(map(repr, ATTENTION_KINDS))}."
        )
    stack = "encoder" if kind == "encoder" else "decoder"
    available = list(maps["heads"][stack])
    heads = available if heads is None else list(heads)
    missing = [h for h in heads if h not in available]
    if missing or not heads:
        raise ValueError(f"heads {heads!r}: the maps hold the {stack}'s heads {_ranges(available)}; choose among them.")
    weights = maps[kind][[available.index(h) for h in heads]]
    title, query_key, key_key, query_axis, key_axis = ATTENTION_KINDS[kind]
    index, count = maps["layer"][stack], maps["num_layers"][stack]
    where = f"layer {index} (layers 0–{count - 1}), {'heads' if len(heads) > 1 else 'head'} {_ranges(heads)}"
    extra = "; each row is labelled with the token it predicts" if kind == "cross" else ""
    pair = f"“{_shorten(maps['source'])}” → “{_shorten(maps['target'])}”" + (
        " (the model's translation)" if maps["generated"] else ""
    )
    drawn = plot_attention(
        path,
        weights,
        maps[query_key],
        maps[key_key],
        f"{title}, {where}{extra}\n{pair}",
        heads=heads,
        query_axis=query_axis,
        key_axis=key_axis,
    )
    return {**drawn, "heads": heads}


def draw_attention_maps(
    model,
    tokenizer,
    source: str,
    output_dir: str | Path,
    target: str | None = None,
    layer: int = -1,
    heads: Sequence[int] | None = None,
    num_beams: int | None = None,
    generate_kwargs: dict | None = None,
) -> dict[str, Any]:
    """``attention_maps`` drawn into ``attention_encoder.png``, ``attention_decoder.png`` and
    ``attention_cross.png`` in ``output_dir``; returns the maps plus ``files`` (the three paths)."""
    maps = attention_maps(model, tokenizer, source, target, layer, heads, num_beams, generate_kwargs)
    output_dir = Path(output_dir)
    files = {kind: draw_attention(output_dir / FILES[kind], maps, kind)["path"] for kind in ATTENTION_KINDS}
    return {**maps, "files": files}


def _ranges(indices: Sequence[int]) -> str:
    """[0, 1, ..., 7] -> '0–7'; [1, 3] -> '1, 3'."""
    indices = list(indices)
    if len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}–{indices[-1]}"
    return ", ".join(map(str, indices))


def _shorten(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------------------------
# Everything at once (the `visualize` command)
# --------------------------------------------------------------------------------------------
def _shorter_sentence(source: str) -> str:
    words = source.split()
    return " ".join(words[: max(1, len(words) // 2)])


def draw_all(
    output_dir: str | Path,
    model=None,
    tokenizer=None,
    source: str | None = None,
    target: str | None = None,
    layer: int = -1,
    heads: Sequence[int] | None = None,
    num_beams: int | None = None,
) -> list[Path]:
    """Write every picture into ``output_dir``: Figure 1 of ``model`` (or of the paper's base model), and
    the attention maps only when ``model``, ``tokenizer`` and ``source`` are given. Returns the paths written."""
    output_dir = Path(output_dir)
    if model is not None and (tokenizer is None or source is None):
        raise ValueError("The attention maps need the model's tokenizer and a source sentence.")
    if model is not None:  # fail on a bad layer / head before drawing anything
        _check_layer_and_heads(model.config, layer, heads)
    paths = [
        plot_architecture(output_dir / FILES["architecture"], model if model is not None else _paper_base_model())[
            "path"
        ]
    ]
    paths.append(plot_positional_encoding(output_dir / FILES["positional_encoding"], model=model)["path"])
    if tokenizer is not None and source is not None:
        masks = plot_masks(
            output_dir / FILES["masks"],
            tokenizer,
            [source, _shorter_sentence(source)],
            config=None if model is None else model.config,
        )
    else:
        masks = plot_masks(output_dir / FILES["masks"])
    paths.append(masks["path"])
    paths.append(plot_learning_rate(output_dir / FILES["learning_rate"])["path"])
    vocab_size = model.config.vocab_size if model is not None else 37000
    paths.append(plot_label_smoothing(output_dir / FILES["label_smoothing"], vocab_size=vocab_size)["path"])
    if model is not None:
        drawn = draw_attention_maps(model, tokenizer, source, output_dir, target, layer, heads, num_beams)
        paths.extend(drawn["files"].values())
    return paths
