"""The attention explorer: look inside a trained translator in the browser (``vanilla-transformer explore``).

A Gradio app. Type a sentence, choose the decoding (beam size, length penalty, or greedy) and see:

* the translation, by :func:`~vanilla_transformer.evaluation.translate`;
* beam search's finished candidates with the scores that ranked them and each token's probability, by
  :func:`translate_candidates`;
* a heat map of the encoder self-attention, the masked decoder self-attention or the encoder–decoder
  attention of one layer and one head (or all heads of the layer), over the tokenizer's readable sub-words,
  by :func:`~vanilla_transformer.visualization.attention_maps` and
  :func:`~vanilla_transformer.visualization.draw_attention`.

The page only calls :class:`Explorer`, whose methods do the work and raise ``ValueError`` with a clear
message on bad input (an empty source, one over the stated limit, a folder that holds no model); the page
shows that message. :func:`build_app` lays out the page, :func:`launch` serves it on 127.0.0.1.

Nothing leaves the machine: Gradio's analytics are switched off (``GRADIO_ANALYTICS_ENABLED=False``, set
before gradio is imported, and ``analytics_enabled=False``), and the page's fonts and scripts are served by
the app itself (``tests/test_explorer.py`` counts, in a real browser, every request that is not to
127.0.0.1: none). Needs gradio and matplotlib: ``pip install -e '.[app]'`` in a clone.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from .evaluation import translate
from .loading import load_model_and_tokenizer
from .tokenization import check_tokenizer_matches_model
from .visualization import ATTENTION_KINDS, attention_maps, draw_attention, readable_tokens, require_matplotlib

__all__ = [
    "KIND_NAMES",
    "MAX_BEAMS",
    "MAX_SOURCE_CHARACTERS",
    "MAX_SOURCE_TOKENS",
    "Explorer",
    "build_app",
    "launch",
    "require_gradio",
    "translate_candidates",
]

logger = logging.getLogger(__name__)

#: The input limit stated in the page: characters, and sub-word tokens of the model's tokenizer (``</s>`` included).
MAX_SOURCE_CHARACTERS = 500
MAX_SOURCE_TOKENS = 100
#: The largest beam the page offers.
MAX_BEAMS = 8
#: The kinds of attention, as the page names them.
KIND_NAMES = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (masked)",
    "cross": "encoder–decoder attention",
}
ALL_HEADS = "all"
INSTALL = "pip install -e '.[app]' in a clone of this package (or pip install 'gradio>=6,<7' matplotlib)"
MODEL_HINT = (
    "Give the folder that `vanilla-transformer train` saved (RUN/final), or any folder where "
    "save_pretrained wrote a model and its tokenizer."
)


def require_gradio():
    """gradio, imported with its analytics switched off; a clear ImportError when it is missing."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # read when gradio is imported and when a Blocks is built
    try:
        import gradio
    except ImportError as error:
        raise ImportError(f"The explorer needs gradio: {INSTALL}") from error
    return gradio


# --------------------------------------------------------------------------------------------
# The work, without the page
# --------------------------------------------------------------------------------------------
def translate_candidates(
    model: Any,
    tokenizer: Any,
    text: str,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    num_return_sequences: int | None = None,
    max_new_tokens: int | None = None,
) -> list[dict[str, Any]]:
    """The best candidates that beam search finished for one sentence, best first, with their scores.

    One ``model.generate`` call with ``num_return_sequences``, ``output_scores`` and
    ``return_dict_in_generate``: the candidates are transformers' own finished hypotheses, ranked by
    its ``sequences_scores``. With the same settings the first candidate is
    :func:`~vanilla_transformer.evaluation.translate`'s output.

    Args:
        text: one source sentence.
        num_beams, length_penalty, max_new_tokens: as in :func:`~vanilla_transformer.evaluation.translate`;
            ``None`` keeps the model's generation config (the paper's beam 4, α = 0.6, source length + 50).
            ``num_beams=1`` is greedy decoding, which has one candidate.
        num_return_sequences: how many candidates, at most ``num_beams``; ``None``: ``num_beams``.

    Returns:
        One dict per candidate, best first: ``text`` (detokenised), ``score`` (what ranked it:
        transformers' ``sequences_scores``, the sum of the token log-probabilities divided by
        ``length ** length_penalty``; for greedy decoding, which has no length penalty, the sum itself),
        ``log_probability`` (the sum of the token log-probabilities under the model), ``length`` (tokens
        generated, ``</s>`` included), ``token_ids`` and ``tokens`` (those tokens, as
        ``tokenizer.convert_ids_to_tokens`` gives them) and ``token_log_probabilities`` (one per token).

    Raises:
        ValueError: ``text`` is not a non-empty string; ``num_beams`` or ``num_return_sequences`` is not a
            positive integer, or more candidates are asked for than there are beams; the tokenizer does not
            match the model.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"`text` must be one non-empty sentence (a string), got {text!r}.")
    config = model.config
    check_tokenizer_matches_model(tokenizer, config)
    beams = (model.generation_config.num_beams or 1) if num_beams is None else num_beams  # unset: greedy, as generate()
    if not isinstance(beams, int) or isinstance(beams, bool) or beams < 1:
        raise ValueError(f"num_beams must be a positive integer (1: greedy decoding), got {beams!r}.")
    count = beams if num_return_sequences is None else num_return_sequences
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= beams:
        raise ValueError(
            f"num_return_sequences must be an integer from 1 to num_beams={beams} (beam search finishes at most "
            f"one candidate per beam), got {count!r}. Ask for fewer candidates or use more beams."
        )
    overrides = {"length_penalty": length_penalty, "max_new_tokens": max_new_tokens}
    generate_kwargs = {name: value for name, value in overrides.items() if value is not None}
    device = next(model.parameters()).device
    input_ids = tokenizer([text], return_tensors="pt")["input_ids"].to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            output = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                num_beams=beams,
                num_return_sequences=count,
                output_scores=True,
                output_logits=True,
                return_dict_in_generate=True,
                **generate_kwargs,
            )
            # Log-probabilities of the chosen tokens under the model: log-softmax of its raw logits. (Beam
            # search's `scores` are these before the logits processors; greedy search's are processed logits.)
            token_scores = (
                model.compute_transition_scores(
                    output.sequences, output.logits, getattr(output, "beam_indices", None), normalize_logits=True
                )
                .float()
                .cpu()
            )
    finally:
        model.train(was_training)
    sequences = output.sequences[:, 1:].cpu()  # without the decoder start token
    eos = config.eos_token_id
    candidates = []
    for row, ids in enumerate(sequences.tolist()):
        length = ids.index(eos) + 1 if eos in ids else len(ids)  # after </s> comes padding
        ids = ids[:length]
        log_probabilities = token_scores[row, :length]
        log_probability = float(log_probabilities.sum())
        if beams > 1:
            score = float(output.sequences_scores[row])
        else:
            score = log_probability
        candidates.append(
            {
                "text": tokenizer.decode(ids, skip_special_tokens=True),
                "score": score,
                "log_probability": log_probability,
                "length": length,
                "token_ids": ids,
                "tokens": tokenizer.convert_ids_to_tokens(ids),
                "token_log_probabilities": log_probabilities.tolist(),
            }
        )
    return candidates


class Explorer:
    """Models by folder, translations and attention pictures: what the page calls.

    Models stay loaded (the two used last); pictures are written into ``picture_dir`` (default: a new
    temporary folder, removed by :meth:`close`). A translation is a dict (:meth:`translate`); the page
    keeps it per browser session, and the attention maps of each layer are computed once and kept in it.
    """

    def __init__(self, picture_dir: str | os.PathLike | None = None, device: str | None = None):
        require_matplotlib()
        self._own_dir = picture_dir is None
        self.picture_dir = Path(
            tempfile.mkdtemp(prefix="vanilla-transformer-explorer-") if picture_dir is None else picture_dir
        )
        self.picture_dir.mkdir(parents=True, exist_ok=True)
        self.device = device
        self._models: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._numbers = itertools.count()

    def close(self) -> None:
        """Remove the picture folder (when the explorer made it) and forget the models."""
        if self._own_dir:
            shutil.rmtree(self.picture_dir, ignore_errors=True)
        self._models.clear()

    # -------------------------------------------------------------------- models
    def load(self, folder: str | os.PathLike) -> tuple[Any, Any]:
        """The model and tokenizer saved in ``folder`` (loaded once, then kept).

        Raises:
            ValueError: the folder is empty text, does not exist, or holds no model and tokenizer that fit.
        """
        text = str(folder).strip()
        if not text:
            raise ValueError(f"The model folder is empty. {MODEL_HINT}")
        path = Path(text).expanduser().resolve()
        key = str(path)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        if not path.is_dir():
            raise ValueError(f"There is no folder {text!r}. {MODEL_HINT}")
        try:
            loaded = load_model_and_tokenizer(path, device=self.device)
        except ValueError as error:
            raise ValueError(f"{error} {MODEL_HINT}") from None
        except Exception as error:  # a config.json of another model, unreadable weights...
            raise ValueError(
                f"{text!r} does not hold a model of this package ({type(error).__name__}: {error}). {MODEL_HINT}"
            ) from None
        self._models[key] = loaded
        while len(self._models) > 2:
            self._models.popitem(last=False)
        return loaded

    def describe(self, folder: str | os.PathLike) -> str:
        """One line (markdown) about the model in ``folder``: its sizes and decoding defaults."""
        model, tokenizer = self.load(folder)
        c, g = model.config, model.generation_config
        heads = f"{c.encoder_attention_heads} heads" + (
            f" of size {c.head_dim}" if c.head_dim else ""
        )  # else d_model / heads
        return (
            f"**Model** `{str(folder).strip()}`: {c.encoder_layers} encoder and {c.decoder_layers} "
            f"decoder layers, {heads}, d_model {c.d_model}, vocabulary {c.vocab_size:,} "
            f"sub-words. Its decoding: beam {g.num_beams}, length penalty α = {g.length_penalty:g}."
        )

    def layers(self, folder: str | os.PathLike) -> list[int]:
        """The layers whose maps can be drawn: those that both the encoder and the decoder have."""
        config = self.load(folder)[0].config
        return list(range(min(config.encoder_layers, config.decoder_layers)))

    def heads(self, folder: str | os.PathLike, kind: str) -> list[int]:
        """The heads of the attention of ``kind`` (``"encoder"``, ``"decoder"`` or ``"cross"``)."""
        config = self.load(folder)[0].config
        return list(range(config.encoder_attention_heads if kind == "encoder" else config.decoder_attention_heads))

    # -------------------------------------------------------------------- translation
    def check_source(self, folder: str | os.PathLike, text: Any) -> str:
        """``text`` without surrounding spaces, when it is within the stated limit.

        Raises:
            ValueError: nothing but spaces, more than MAX_SOURCE_CHARACTERS characters, or more than
                MAX_SOURCE_TOKENS sub-word tokens of the model's tokenizer.
        """
        text = text.strip() if isinstance(text, str) else ""
        if not text:
            raise ValueError("The source box is empty: type a sentence to translate.")
        limit = (
            f"this explorer takes at most {MAX_SOURCE_CHARACTERS} characters and {MAX_SOURCE_TOKENS} sub-word tokens"
        )
        if len(text) > MAX_SOURCE_CHARACTERS:
            raise ValueError(
                f"The source has {len(text)} characters; {limit}. Shorten it, or translate it one sentence at a time."
            )
        tokens = len(self.load(folder)[1](text)["input_ids"])
        if tokens > MAX_SOURCE_TOKENS:
            raise ValueError(
                f"The source has {tokens} sub-word tokens; {limit}. Shorten it, or translate it one sentence at a time."
            )
        return text

    @staticmethod
    def decoding(
        num_beams: Any = None, length_penalty: Any = None, greedy: bool = False
    ) -> tuple[int | None, float | None]:
        """(num_beams, length_penalty) for ``translate``: ``(1, None)`` when greedy; ``None`` keeps the model's.

        Raises:
            ValueError: a beam size that is not a whole number from 1 to MAX_BEAMS, or a length penalty that is
                not a finite number.
        """
        if greedy:
            return 1, None
        if num_beams is not None:
            if (
                isinstance(num_beams, bool)
                or not isinstance(num_beams, (int, float))
                or num_beams != int(num_beams)
                or not 1 <= num_beams <= MAX_BEAMS
            ):
                raise ValueError(f"The beam size must be a whole number from 1 to {MAX_BEAMS}, got {num_beams!r}.")
            num_beams = int(num_beams)
        if length_penalty is not None:
            if (
                isinstance(length_penalty, bool)
                or not isinstance(length_penalty, (int, float))
                or not math.isfinite(length_penalty)
            ):
                raise ValueError(f"The length penalty must be a number (the paper's α is 0.6), got {length_penalty!r}.")
            length_penalty = float(length_penalty)
        return num_beams, length_penalty

    def translate(
        self,
        folder: str | os.PathLike,
        text: Any,
        num_beams: Any = None,
        length_penalty: Any = None,
        greedy: bool = False,
    ) -> dict[str, Any]:
        """Translate one sentence: ``{"folder", "source", "translation", "candidates", "num_beams",
        "length_penalty", "maps"}``. ``translation`` is :func:`translate`'s; ``candidates`` are
        :func:`translate_candidates`' (every beam's, best first); ``maps`` is filled by :meth:`maps`."""
        model, tokenizer = self.load(folder)
        source = self.check_source(folder, text)
        num_beams, length_penalty = self.decoding(num_beams, length_penalty, greedy)
        beams = num_beams if num_beams is not None else (model.generation_config.num_beams or 1)  # unset: greedy
        translation = translate(model, tokenizer, [source], num_beams=num_beams, length_penalty=length_penalty)[0]
        candidates = translate_candidates(
            model, tokenizer, source, num_beams=beams, length_penalty=length_penalty if beams > 1 else None
        )
        return {
            "folder": str(folder).strip(),
            "source": source,
            "translation": translation,
            "candidates": candidates,
            "num_beams": beams,
            "length_penalty": length_penalty,
            "maps": {},
        }

    def candidate_rows(self, result: dict[str, Any]) -> list[list[Any]]:
        """The candidates as table rows: rank, text, score, log-probability, tokens with their probabilities."""
        tokenizer = self.load(result["folder"])[1]
        rows = []
        for rank, candidate in enumerate(result["candidates"], start=1):
            labels = readable_tokens(candidate["tokens"], tokenizer)
            tokens = "  ".join(
                f"{label} {math.exp(lp):.2f}" for label, lp in zip(labels, candidate["token_log_probabilities"])
            )
            rows.append(
                [rank, candidate["text"], round(candidate["score"], 4), round(candidate["log_probability"], 4), tokens]
            )
        return rows

    # -------------------------------------------------------------------- attention
    def maps(self, result: dict[str, Any], layer: int) -> dict[str, Any]:
        """``attention_maps`` of every head of ``layer`` for the translation in ``result`` (computed once)."""
        if layer not in result["maps"]:
            model, tokenizer = self.load(result["folder"])
            beams, alpha = result["num_beams"], result["length_penalty"]
            kwargs = {"length_penalty": alpha} if alpha is not None and beams > 1 else {}
            # the model's own tokens, decoded again with the translation's settings
            result["maps"][layer] = attention_maps(
                model, tokenizer, result["source"], layer=layer, num_beams=beams, generate_kwargs=kwargs
            )
        return result["maps"][layer]

    def draw(self, result: dict[str, Any], kind: str, layer: int, head: int | str = ALL_HEADS) -> Path:
        """A PNG of one kind of attention (``"encoder"``, ``"decoder"``, ``"cross"``) of ``layer``, for one
        head or ``"all"`` of them; a new file each time."""
        if kind not in ATTENTION_KINDS:
            raise ValueError(
                f"{kind!r} is not a kind of attention; choose one of {', '.join(map(repr, ATTENTION_KINDS))}."
            )
        layers = self.layers(result["folder"])
        if layer not in layers:
            raise ValueError(f"Layer {layer!r} does not exist here: choose one of {layers}.")
        heads = None if head in (None, ALL_HEADS) else [int(head)]
        path = self.picture_dir / f"attention-{next(self._numbers)}.png"
        draw_attention(path, self.maps(result, layer), kind, heads)
        return path


# --------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------
def _problem(error: Exception) -> str:
    if isinstance(error, ValueError):
        return f"**Cannot do that:** {error}"
    logger.exception("explorer: unexpected error")
    return f"**Something went wrong** ({type(error).__name__}): {error}"


def build_app(explorer: Explorer, folder: str | os.PathLike, source: str = ""):
    """The page for the model in ``folder`` (the page can load another), as a ``gradio.Blocks``."""
    gr = require_gradio()
    model, _ = explorer.load(folder)
    folder = str(folder)
    generation = model.generation_config
    layers = explorer.layers(folder)

    def head_choices(folder: str, kind: str) -> list[tuple[str, str]]:
        return [("all heads", ALL_HEADS), *((f"head {h}", str(h)) for h in explorer.heads(folder, kind))]

    with gr.Blocks(title="Attention explorer · vanilla_transformer", analytics_enabled=False) as app:
        folder_state = gr.State(folder)
        result_state = gr.State(None)
        gr.Markdown(
            "# Attention explorer\nThe Transformer of *Attention Is All You Need*, translating: its beam "
            "search, and where each layer and head looks."
        )
        with gr.Row():
            model_box = gr.Textbox(value=folder, label="Model folder", elem_id="model-folder", scale=4)
            load_button = gr.Button("Load model", elem_id="load", scale=1)
        model_info = gr.Markdown(explorer.describe(folder), elem_id="model-info")
        source_box = gr.Textbox(
            value=source,
            label="Source sentence",
            elem_id="source",
            lines=2,
            info=f"At most {MAX_SOURCE_CHARACTERS} characters and {MAX_SOURCE_TOKENS} sub-word tokens.",
        )
        with gr.Row():
            beams = gr.Slider(
                1, MAX_BEAMS, value=min(generation.num_beams, MAX_BEAMS), step=1, label="Beam size", elem_id="beams"
            )
            alpha = gr.Slider(
                0.0,
                2.0,
                value=generation.length_penalty,
                step=0.1,
                label="Length penalty α",
                info="score = log p / length^α",
                elem_id="alpha",
            )
            greedy = gr.Checkbox(False, label="Greedy (beam size 1)", elem_id="greedy")
        translate_button = gr.Button("Translate", variant="primary", elem_id="translate")
        message = gr.Markdown("", elem_id="message")
        translation_box = gr.Textbox(label="Translation", elem_id="translation", interactive=False)
        candidates = gr.Dataframe(
            headers=["rank", "candidate", "score", "log p", "tokens and their probabilities"],
            label="Beam search's finished candidates, best first (score = log p / length^α)",
            elem_id="candidates",
            interactive=False,
            wrap=True,
        )
        with gr.Row():
            kind = gr.Radio(
                [(name, key) for key, name in KIND_NAMES.items()], value="cross", label="Attention", elem_id="kind"
            )
            layer = gr.Radio([(f"layer {i}", i) for i in layers], value=layers[-1], label="Layer", elem_id="layer")
            head = gr.Radio(head_choices(folder, "cross"), value=ALL_HEADS, label="Head", elem_id="head")
        heatmap = gr.Image(
            type="filepath", format="png", label="Attention weights", elem_id="heatmap", interactive=False
        )

        def on_load(text, current):
            try:
                loaded = explorer.load(text)[0].generation_config
                new_layers = explorer.layers(text)
                return {
                    beams: min(loaded.num_beams, MAX_BEAMS),
                    alpha: loaded.length_penalty,
                    folder_state: text.strip(),
                    result_state: None,
                    model_info: explorer.describe(text),
                    message: "",
                    translation_box: "",
                    candidates: None,
                    heatmap: None,
                    layer: gr.Radio(choices=[(f"layer {i}", i) for i in new_layers], value=new_layers[-1]),
                    head: gr.Radio(choices=head_choices(text, "cross"), value=ALL_HEADS),
                    kind: "cross",
                }
            except Exception as error:
                return {message: f"{_problem(error)} The page still shows the model in `{current}`."}

        def on_translate(folder, text, num_beams, length_penalty, is_greedy, chosen_kind, chosen_layer, chosen_head):
            try:
                result = explorer.translate(folder, text, num_beams, length_penalty, is_greedy)
                picture = explorer.draw(result, chosen_kind, chosen_layer, chosen_head)
                return {
                    result_state: result,
                    translation_box: result["translation"],
                    candidates: explorer.candidate_rows(result),
                    heatmap: str(picture),
                    message: "",
                }
            except Exception as error:
                return {
                    result_state: None,
                    translation_box: "",
                    candidates: None,
                    heatmap: None,
                    message: _problem(error),
                }

        def on_view(folder, result, chosen_kind, chosen_layer, chosen_head):
            try:
                heads = head_choices(folder, chosen_kind)
                if chosen_head not in {value for _, value in heads}:
                    chosen_head = ALL_HEADS
                update = {head: gr.Radio(choices=heads, value=chosen_head)}
                if result is None:
                    return {**update, message: "Translate a sentence first: the maps are those of its translation."}
                return {
                    **update,
                    heatmap: str(explorer.draw(result, chosen_kind, chosen_layer, chosen_head)),
                    message: "",
                }
            except Exception as error:
                return {message: _problem(error)}

        model_outputs = {"concurrency_id": "model", "concurrency_limit": 1}  # one model call at a time
        load_outputs = {
            folder_state,
            result_state,
            model_info,
            message,
            translation_box,
            candidates,
            heatmap,
            layer,
            head,
            kind,
            beams,
            alpha,
        }
        load_button.click(on_load, [model_box, folder_state], load_outputs, **model_outputs)
        translate_inputs = [folder_state, source_box, beams, alpha, greedy, kind, layer, head]
        translate_outputs = {result_state, translation_box, candidates, heatmap, message}
        translate_button.click(on_translate, translate_inputs, translate_outputs, **model_outputs)
        source_box.submit(on_translate, translate_inputs, translate_outputs, **model_outputs)
        for control in (kind, layer, head):
            control.input(
                on_view, [folder_state, result_state, kind, layer, head], {head, heatmap, message}, **model_outputs
            )
    return app


def launch(
    folder: str | os.PathLike,
    port: int | None = None,
    host: str = "127.0.0.1",
    block: bool = True,
    quiet: bool = False,
    source: str = "",
    explorer: Explorer | None = None,
) -> tuple[Any, str, Explorer]:
    """Serve the explorer of the model in ``folder`` at ``http://host:port`` (port ``None``: Gradio's
    first free one from 7860). With ``block`` it serves until Ctrl-C, then closes; otherwise it returns at
    once and the caller closes the app (``app.close()``, ``explorer.close()``). Returns ``(app, url, explorer)``.

    Raises:
        ValueError: ``folder`` holds no model (checked before gradio is imported).
        ImportError: gradio is missing.
    """
    explorer = explorer or Explorer()
    try:
        explorer.load(folder)
        app = build_app(explorer, folder, source=source)
        app.queue(default_concurrency_limit=1)
        _, url, _ = app.launch(
            server_name=host,
            server_port=port,
            prevent_thread_lock=not block,
            quiet=quiet,
            share=False,
            ssr_mode=False,
            allowed_paths=[str(explorer.picture_dir)],
        )
    except BaseException:
        explorer.close()
        raise
    if block:
        app.close()
        explorer.close()
    return app, url, explorer
