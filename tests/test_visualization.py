"""The pictures: valid, reasonably sized PNGs whose data is the real thing (buffer, masks, schedule,
loss target, attention weights, tokens). The `visualize` command is tested in test_cli.py, the
training hook in test_training.py."""

import pytest
import torch
import torch.nn.functional as F
from conftest import SOURCE, TARGET, tiny_model

pytest.importorskip("matplotlib")

from vanilla_transformer import (  # noqa: E402
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    sinusoidal_position_encoding,
)
from vanilla_transformer.schedule import noam_learning_rate  # noqa: E402
from vanilla_transformer.visualization import (  # noqa: E402
    FILES,
    attention_maps,
    attention_weights,
    draw_attention,
    draw_attention_maps,
    label_smoothing_distribution,
    plot_architecture,
    plot_label_smoothing,
    plot_learning_rate,
    plot_masks,
    plot_positional_encoding,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_width=900, max_width=1800, min_height=250, max_height=1800):
    """A real PNG, of a size for a README (about 1000-1600 px wide), under 200 KB."""
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    with Image.open(path) as image:
        width, height = image.size
    assert min_width <= width <= max_width and min_height <= height <= max_height, (path.name, width, height)
    assert path.stat().st_size < 200_000, (path.name, path.stat().st_size)


@pytest.fixture(scope="module")
def model(sentence_tokenizer):
    return tiny_model(vocab_size=len(sentence_tokenizer))


def rebuild(labels):
    """Readable labels back to text: '##' continues the previous word."""
    words = []
    for label in labels:
        if label.startswith("##"):
            words[-1] += label[2:]
        elif not (label.startswith("<") and label.endswith(">")):
            words.append(label)
    return " ".join(words)


# ------------------------------------------------------------------ §3 Figure 1
def test_figure_1_is_read_off_the_models_modules(tmp_path):
    config = VanillaTransformerConfig.base(vocab_size=300, encoder_layers=3, decoder_layers=2)
    data = plot_architecture(tmp_path / "figure1.png", VanillaTransformerForConditionalGeneration(config))
    assert data["encoder"]["layer"] == ["Multi-Head Attention", "Add & Norm", "Feed Forward", "Add & Norm"]
    assert data["decoder"]["layer"] == [
        "Masked Multi-Head Attention",
        "Add & Norm",
        "Multi-Head Attention (K, V: encoder)",
        "Add & Norm",
        "Feed Forward",
        "Add & Norm",
    ]
    assert (data["encoder"]["layers"], data["decoder"]["layers"]) == (3, 2)
    assert data["shared_output_matrix"] and not data["encoder"]["final_norm"]
    assert {"3×", "2×", "Input Embedding × √d_model", "Positional Encoding", "Linear (= embedding matrixᵀ)"} <= set(
        data["texts"]
    )
    assert data["texts"].count("Add & Norm") == 2 + 3  # every box of one layer of each stack is drawn
    assert_png(tmp_path / "figure1.png", min_height=900)

    # the deviations change the picture: pre-LN blocks and final norms, untied output layer, unscaled embeddings
    config = VanillaTransformerConfig.base(
        vocab_size=300,
        encoder_layers=1,
        decoder_layers=1,
        norm_first=True,
        tie_word_embeddings=False,
        scale_embedding=False,
        position_embedding_type="learned",
    )
    data = plot_architecture(tmp_path / "variant.png", VanillaTransformerForConditionalGeneration(config))
    assert data["encoder"]["layer"] == ["Norm", "Multi-Head Attention", "Add", "Norm", "Feed Forward", "Add"]
    assert data["encoder"]["final_norm"] and data["decoder"]["final_norm"] and not data["shared_output_matrix"]
    assert data["encoder"]["inputs"] == ["Input Embedding", "Learned Positions"]
    assert "Linear" in data["texts"] and "Norm (final, pre-LN)" in data["texts"]


# ------------------------------------------------------------------ §3.5 positional encodings
def test_positional_encoding_picture_shows_the_models_own_buffer(tmp_path, model):
    data = plot_positional_encoding(tmp_path / "pe.png", model=model, num_positions=50)
    buffer = model.model.encoder.embed_positions.pe
    assert torch.equal(data["encoding"], buffer[:50])
    assert data["dims"] and all(torch.equal(data["curves"][d], buffer[:50, d]) for d in data["dims"])
    assert_png(tmp_path / "pe.png")
    # past the stored table (64 rows here) the picture stops at the table
    assert torch.equal(
        plot_positional_encoding(tmp_path / "pe2.png", model=model, num_positions=500)["encoding"], buffer
    )
    # without a model: the module the model uses, at the paper's d_model
    default = plot_positional_encoding(tmp_path / "pe3.png")
    assert torch.equal(default["encoding"], sinusoidal_position_encoding(torch.arange(100), 512))
    with pytest.raises(ValueError, match=r"0\.\.31"):
        plot_positional_encoding(tmp_path / "pe4.png", model=model, dims=[32])


# ------------------------------------------------------------------ §3.2.3 masks
def test_mask_pictures_are_the_masks_the_model_builds(tmp_path, sentence_tokenizer):
    data = plot_masks(tmp_path / "masks.png")  # sequences of 9 and 5 tokens
    n, length = 9, 5
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool))
    real = (torch.arange(n) < length)[None, :].expand(n, n)  # key j is a real token
    assert data["padded_index"] == 1 and data["length"] == length
    assert torch.equal(data["causal"], lower)
    assert torch.equal(data["padding"], real)  # zero exactly at the padding keys
    assert torch.equal(data["decoder"], lower & real)
    minimum = torch.finfo(torch.float32).min
    for name in ("causal", "padding", "decoder"):  # the additive masks: 0 or "-inf"
        additive = data[f"{name}_additive"]
        assert torch.equal(additive == 0, data[name]) and torch.all(additive[~data[name]] == minimum)
    assert_png(tmp_path / "masks.png")

    # a batch tokenised and padded by a real tokenizer
    data = plot_masks(tmp_path / "masks2.png", sentence_tokenizer, [SOURCE, "Zwei Hunde."])
    batch = sentence_tokenizer([SOURCE, "Zwei Hunde."], padding=True)
    assert data["tokens"] == [sentence_tokenizer.convert_ids_to_tokens(ids) for ids in batch["input_ids"]]
    assert data["tokens"][1][-1] == "<pad>" and data["padded_index"] == 1
    keep = torch.tensor(batch["attention_mask"][1], dtype=torch.bool)
    assert torch.equal(data["padding"], keep[None, :].expand_as(data["padding"]))
    assert_png(tmp_path / "masks2.png")


# ------------------------------------------------------------------ §5.3 learning rate
def test_learning_rate_curves_are_the_training_schedule(tmp_path):
    data = plot_learning_rate(tmp_path / "lr.png")
    assert set(data["curves"]) == {(512, 4000), (512, 8000), (1024, 4000), (1024, 8000)}
    steps = data["steps"].tolist()
    assert steps[0] == 1 and steps[-1] == 40000
    for (d_model, warmup), curve in data["curves"].items():
        assert curve.tolist() == [noam_learning_rate(s, d_model, warmup) for s in steps]
        assert steps[int(curve.argmax())] == warmup  # the peak is at the end of the warm-up
    assert_png(tmp_path / "lr.png")


# ------------------------------------------------------------------ §5.4 label smoothing
def test_label_smoothing_picture_is_the_target_of_the_models_loss(tmp_path, model):
    data = plot_label_smoothing(tmp_path / "ls.png", epsilon=0.1, vocab_size=1000)
    small, large = (
        (data["distribution"], len(data["tokens"]), data["gold"]),
        (data["large_distribution"], 1000, data["large_gold"]),
    )
    for q, vocab, gold in (small, large):
        assert q.sum().item() == pytest.approx(1.0, abs=1e-12)
        assert q[gold].item() == pytest.approx(1 - 0.1 + 0.1 / vocab, abs=1e-12)
        others = torch.cat([q[:gold], q[gold + 1 :]])
        assert torch.allclose(others, torch.full_like(others, 0.1 / vocab), rtol=0, atol=1e-12)
    assert_png(tmp_path / "ls.png")

    # the model's label-smoothed loss is exactly the cross-entropy against these targets
    input_ids, labels = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[8, 9, 2]])
    out = model(input_ids=input_ids, labels=labels, smoothing=0.1)
    log_probs = F.log_softmax(out.logits[0].double(), dim=-1)
    targets = torch.stack([label_smoothing_distribution(model.config.vocab_size, int(y), 0.1) for y in labels[0]])
    assert out.loss.item() == pytest.approx(-(targets * log_probs).sum(-1).mean().item(), rel=1e-5)


# ------------------------------------------------------------------ §3.2 attention maps
def test_attention_maps_of_a_sentence_pair_with_the_real_tokens(tmp_path, model, sentence_tokenizer):
    implementation = model.config._attn_implementation
    maps = draw_attention_maps(model, sentence_tokenizer, SOURCE, tmp_path, target=TARGET)
    source_ids = sentence_tokenizer(SOURCE)["input_ids"]
    target_ids = sentence_tokenizer(text_target=TARGET)["input_ids"]
    assert maps["source_tokens"] == sentence_tokenizer.convert_ids_to_tokens(source_ids)
    assert maps["output_tokens"] == sentence_tokenizer.convert_ids_to_tokens(target_ids)
    assert maps["decoder_input_tokens"] == ["<s>", *maps["output_tokens"][:-1]]
    # readable labels: no byte-level symbols, and they spell the sentences again
    assert not any("Ġ" in label or "Ã" in label for label in maps["source_labels"] + maps["output_labels"])
    assert rebuild(maps["source_labels"]) == SOURCE and rebuild(maps["output_labels"]) == TARGET
    assert maps["source_labels"][-1] == "</s>"

    s, t, heads = len(source_ids), len(target_ids), model.config.encoder_attention_heads
    assert maps["layer"] == {"encoder": 1, "decoder": 1}  # the last of 2
    assert maps["encoder"].shape == (heads, s, s) and maps["decoder"].shape == (heads, t, t)
    assert maps["cross"].shape == (heads, t, s)
    for kind in ("encoder", "decoder", "cross"):
        rows = maps[kind].sum(-1)
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5), kind
    future = ~torch.tril(torch.ones(t, t, dtype=torch.bool))
    assert torch.all(maps["decoder"][:, future] == 0)  # no attention to later target positions
    for kind in ("encoder", "decoder", "cross"):
        assert_png(maps["files"][kind])
        assert maps["files"][kind].name == FILES[kind]
    assert model.config._attn_implementation == implementation  # eager only while drawing

    # chosen heads of the first layer
    some = draw_attention_maps(
        model, sentence_tokenizer, SOURCE, tmp_path / "some", target=TARGET, layer=0, heads=[1, 3]
    )
    assert some["encoder"].shape[0] == 2 and some["heads"]["encoder"] == [1, 3]
    assert_png(some["files"]["cross"], min_height=150)


def test_attention_maps_of_the_models_own_translation(tmp_path, model, sentence_tokenizer):
    maps = draw_attention_maps(
        model, sentence_tokenizer, SOURCE, tmp_path, num_beams=1, generate_kwargs={"max_new_tokens": 6}
    )
    input_ids = torch.tensor([sentence_tokenizer(SOURCE)["input_ids"]])
    generated = model.generate(input_ids, num_beams=1, max_new_tokens=6)[0].tolist()
    assert maps["generated"] and maps["decoder_input_tokens"] == sentence_tokenizer.convert_ids_to_tokens(
        generated[:-1]
    )
    assert maps["output_tokens"] == sentence_tokenizer.convert_ids_to_tokens(generated[1:])
    assert maps["cross"].shape[1] == len(generated) - 1
    assert all(path.is_file() for path in maps["files"].values())


def test_one_kind_of_attention_for_chosen_heads(tmp_path, model, sentence_tokenizer):
    maps = attention_maps(model, sentence_tokenizer, SOURCE, TARGET, layer=0, heads=[0, 2, 3])
    drawn = draw_attention(tmp_path / "cross.png", maps, "cross", heads=[3])
    assert drawn["heads"] == [3] and torch.equal(drawn["weights"], maps["cross"][[2]])  # head 3 is the maps' third
    assert_png(drawn["path"], min_height=150)
    every = draw_attention(tmp_path / "encoder.png", maps, "encoder")
    assert every["heads"] == [0, 2, 3] and torch.equal(every["weights"], maps["encoder"])
    with pytest.raises(ValueError, match=r"heads \[1\]: the maps hold the decoder's heads 0, 2, 3"):
        draw_attention(tmp_path / "x.png", maps, "decoder", heads=[1])
    with pytest.raises(
        ValueError, match="'self' is not a kind of attention map; use one of 'encoder', 'decoder', 'cross'"
    ):
        draw_attention(tmp_path / "x.png", maps, "self")
    assert not (tmp_path / "x.png").exists()


def test_masked_positions_get_no_attention_in_a_padded_batch(model):
    input_ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    decoder_input_ids = torch.tensor([[1, 11, 12, 13], [1, 14, 0, 0]])
    weights = attention_weights(
        model,
        input_ids,
        decoder_input_ids,
        attention_mask=(input_ids != 0).long(),
        decoder_attention_mask=(decoder_input_ids != 0).long(),
        layer=0,
    )
    assert weights["encoder"].shape == (2, 4, 5, 5) and weights["cross"].shape == (2, 4, 4, 5)
    for kind in ("encoder", "decoder", "cross"):
        rows = weights[kind].sum(-1)
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5), kind
    assert torch.all(weights["encoder"][1, :, :, 3:] == 0) and torch.all(weights["cross"][1, :, :, 3:] == 0)
    assert torch.all(weights["decoder"][1, :, :, 2:] == 0)  # target padding
    assert torch.all(weights["decoder"][:, :, ~torch.tril(torch.ones(4, 4, dtype=torch.bool))] == 0)  # the future


@pytest.mark.parametrize(
    "layer, heads, message",
    [
        (2, None, r"layer 2 does not exist.*2 layers.*0\.\.1"),
        (-3, None, r"layer -3 does not exist.*0\.\.1"),
        (-1, [4], r"head 4 does not exist.*4 heads.*0\.\.3"),
        (0, [0, -5], r"head -5 does not exist.*0\.\.3"),
    ],
)
def test_a_layer_or_head_that_does_not_exist_is_a_clear_error(
    tmp_path, model, sentence_tokenizer, layer, heads, message
):
    with pytest.raises(ValueError, match=message):
        draw_attention_maps(model, sentence_tokenizer, SOURCE, tmp_path, target=TARGET, layer=layer, heads=heads)
    assert not list(tmp_path.iterdir())  # nothing drawn
