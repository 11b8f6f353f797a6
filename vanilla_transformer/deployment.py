"""Serve a trained translator with CTranslate2: export the model, then translate with the engine.

CTranslate2 (the inference engine of OpenNMT, also behind faster-whisper) runs Transformer models on the
CPU with fused kernels and int8 weights. Its ``TransformerSpec`` expresses the paper's model exactly:
post-LN blocks (``pre_norm=False``), ReLU, embeddings × √d_model, one matrix for source embedding, target
embedding and pre-softmax layer, and an explicit table of positions. Its built-in sinusoid is
tensor2tensor's layout (all sines, then all cosines), not the paper's interleaved one, so the export
carries this model's own table (§3.5), of a length chosen at export time.

* :func:`export_ctranslate2` — a saved model folder (``RUN/final``) to a CTranslate2 folder, with the
  tokenizer and the decoding defaults beside it; written through CTranslate2's public converter API
  (``ctranslate2.converters.Converter`` and the spec classes), which this module subclasses.
* :class:`CTranslate2Translator` — an exported folder, ready to translate: same text in, same text out
  as :func:`vanilla_transformer.evaluation.translate`, with the paper's decoding (§6.1).

Decoding, compared with transformers' ``generate`` (docs/deployment.md has the measurements):

* **Length penalty.** Both engines divide a finished hypothesis' log-probability by ``length ** α``.
  transformers counts the ``</s>`` in ``length``; CTranslate2 counts it when asked to return it
  (``return_end_token=True``), which this module does, so the formula is the same.
* **When beam search stops.** CTranslate2 stops a sentence once ``num_beams`` hypotheses have finished.
  transformers, by default (``early_stopping=False``), goes on while its heuristic says a running beam could
  still win; with ``early_stopping=True`` it stops as CTranslate2 does, and then the two engines agree token
  for token (the tests check it).
* **The per-sentence length limit** (source length + 50, ``</s>`` included): CTranslate2's
  ``max_decoding_length`` holds per call. Greedy search decodes a batch up to the longest limit and cuts
  each sentence at its own, which is exact (a greedy output's beginning does not depend on where it stops).
  Beam search is not prefix-stable, so a beam batch is decoded up to the limit most of its sentences have
  (for them the search is their own) and each other sentence is checked: CTranslate2 stops a sentence once
  ``num_beams`` hypotheses have finished, and all of them are returned, so the longest one ended at the step
  where the search stopped. A search that stopped before both the batch's last step and the sentence's own
  went exactly as it would have with its own limit, and its best hypothesis is kept; a sentence whose search
  got within two tokens of either is decoded again, in a batch of sentences of that one limit (the exact
  path, ``group_by_limit=True``). Identical outputs assume that a
  sentence's scores do not depend on the other sentences of its batch; padding changes them in the last
  bits, so near-ties can break the other way (docs/deployment.md counts how often).
  A hypothesis cut by the limit ends differently: transformers forces ``</s>`` as its last token (and counts
  it in the length), CTranslate2 stops one token earlier; with α = 0 the two agree, otherwise they can differ
  for sentences whose best translations run into the limit.
* **Threads.** On a CPU, ``threads // threads_per_batch`` batches are decoded at once, each by a worker of
  CTranslate2's own pool (``inter_threads``). Every batch is queued before any result is read, and a sentence
  to decode again is queued as soon as its first search returns, so the workers stay busy to the end. The
  outputs do not depend on the layout (each batch is decoded as it would be alone).

``ctranslate2`` is an optional dependency: ``pip install -e '.[ctranslate2]'`` in a clone.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import GenerationConfig, PreTrainedConfig
from transformers.utils import logging

from .checkpoints import save_folder_atomically, write_json_atomically
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .loading import load_model_and_tokenizer, load_tokenizer
from .modeling_vanilla_transformer import sinusoidal_position_encoding
from .tokenization import check_source_lengths

logger = logging.get_logger(__name__)

try:  # optional: pip install -e '.[ctranslate2]'
    import ctranslate2
    from ctranslate2.converters import Converter
    from ctranslate2.specs import common_spec, transformer_spec
except ImportError:  # the module still imports, and says how to install the engine when it is used
    ctranslate2 = None
    Converter = object

__all__ = ["QUANTIZATIONS", "CTranslate2Translator", "export_ctranslate2", "require_ctranslate2"]

#: Weight types of ``export_ctranslate2`` (CTranslate2's names). ``int8_float32``: int8 weights, float32
#: activations; ``int8`` is the same on a CPU.
QUANTIZATIONS = ("float32", "int8", "int8_float32", "bfloat16")
INSTALL_HINT = "pip install -e '.[ctranslate2]' in a clone of this package (or pip install 'ctranslate2>=4,<5')"
EXPORT_FILE = "vanilla_transformer_export.json"  # what was exported, and the limits of the export
TOKENIZER_FOLDER = "tokenizer"  # beside CTranslate2's own config.json, which transformers must not read

# Every field of VanillaTransformerConfig, and how the export represents it. A field missing here (a newer
# flag of the model) is refused when it differs from its default, rather than exported wrongly.
_EXPORTED_FIELDS = {
    "vocab_size": "the vocabulary and the embedding matrices",
    "d_model": "the weight shapes",
    "encoder_layers": "TransformerEncoderSpec(num_layers)",
    "decoder_layers": "TransformerDecoderSpec(num_layers)",
    "encoder_attention_heads": "TransformerEncoderSpec(num_heads)",
    "decoder_attention_heads": "TransformerDecoderSpec(num_heads)",
    "head_dim": "TransformerEncoderSpec / TransformerDecoderSpec(head_dim), when set (None: d_model / heads)",
    "encoder_ffn_dim": "the weight shapes",
    "decoder_ffn_dim": "the weight shapes",
    "max_position_embeddings": "the position table (learned), or the default length of the sinusoid table",
    "layer_norm_eps": "TransformerConfig(layer_norm_epsilon)",
    "scale_embedding": "scale_embeddings (√d_model or 1)",
    "tie_word_embeddings": "each embedding and the output layer are exported as they are (shared ones aliased)",
    "norm_first": "pre_norm, with the final LayerNorm of each stack",
    "attention_bias": "the attention layers' biases, written when the model has them (CTranslate2's are optional)",
    "position_embedding_type": "position_encodings.encodings: the sinusoid table or the learned one",
    "pad_token_id": "lengths instead of padding",
    "bos_token_id": "TransformerConfig(bos_token)",
    "eos_token_id": "TransformerConfig(eos_token)",
    "unk_token_id": "TransformerConfig(unk_token)",
    "decoder_start_token_id": "TransformerConfig(decoder_start_token)",
    # inference does not use these
    "dropout": None,
    "attention_dropout": None,
    "activation_dropout": None,
    "init_std": None,
    "use_cache": None,
    "is_encoder_decoder": None,
}


def require_ctranslate2() -> None:
    """Raise an ImportError that says how to install CTranslate2, if it is missing."""
    if ctranslate2 is None:
        raise ImportError(f"CTranslate2 is not installed; it is an optional extra: {INSTALL_HINT}")


def unexportable_fields(config: VanillaTransformerConfig) -> list[str]:
    """The configuration's settings that the export cannot represent: fields it does not know, set to a
    value other than their default (transformers' own settings, such as ``architectures``, are not the model's)."""
    generic = set(PreTrainedConfig().to_dict())
    return sorted(
        f"{name}={value!r}"
        for name, value in config.to_diff_dict().items()
        if name not in _EXPORTED_FIELDS
        and name not in generic
        and not name.startswith("_")
        and name not in ("auto_map", "custom_pipelines", "model_type", "transformers_version", "architectures")
    )


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy()


class VanillaTransformerConverter(Converter):
    """CTranslate2's converter interface (``convert(output_dir, quantization=...)``) for this model.

    ``_load`` builds the ``TransformerSpec``: CTranslate2's names on the left, ours (Marian's) on the right.
    """

    def __init__(self, model: Any, tokenizer: Any, max_positions: int):
        self.model, self.tokenizer, self.max_positions = model, tokenizer, max_positions

    def _load(self):
        config = self.model.config
        encoder = transformer_spec.TransformerEncoderSpec(
            config.encoder_layers,
            config.encoder_attention_heads,
            pre_norm=config.norm_first,
            activation=common_spec.Activation.RELU,
            head_dim=config.head_dim,
        )
        decoder = transformer_spec.TransformerDecoderSpec(
            config.decoder_layers,
            config.decoder_attention_heads,
            pre_norm=config.norm_first,
            activation=common_spec.Activation.RELU,
            head_dim=config.head_dim,
        )
        spec = transformer_spec.TransformerSpec(encoder, decoder)
        model = self.model.model
        self._set_stack(spec.encoder, model.encoder, spec.encoder.embeddings[0])
        self._set_stack(spec.decoder, model.decoder, spec.decoder.embeddings)
        for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers):
            self._set_attention(
                layer_spec.self_attention, layer.self_attn, layer.self_attn_layer_norm, self_attention=True
            )
            self._set_ffn(layer_spec.ffn, layer)
        for layer_spec, layer in zip(spec.decoder.layer, model.decoder.layers):
            self._set_attention(
                layer_spec.self_attention, layer.self_attn, layer.self_attn_layer_norm, self_attention=True
            )
            self._set_attention(
                layer_spec.attention, layer.encoder_attn, layer.encoder_attn_layer_norm, self_attention=False
            )
            self._set_ffn(layer_spec.ffn, layer)
        spec.decoder.projection.weight = _array(self.model.lm_head.weight)  # tied: an alias of the embedding

        tokens = self._vocabulary()
        spec.register_source_vocabulary(tokens)
        spec.register_target_vocabulary(tokens)
        spec.config.bos_token = tokens[config.bos_token_id]
        spec.config.eos_token = tokens[config.eos_token_id]
        spec.config.unk_token = tokens[config.unk_token_id] if config.unk_token_id is not None else "<unk>"
        spec.config.decoder_start_token = tokens[config.decoder_start_token_id]
        spec.config.layer_norm_epsilon = config.layer_norm_eps
        return spec

    def _vocabulary(self) -> list[str]:
        """One token string per id; ids the tokenizer does not have (vocab_size > len(tokenizer)) get placeholders."""
        size = self.model.config.vocab_size
        tokens = self.tokenizer.convert_ids_to_tokens(list(range(min(size, len(self.tokenizer)))))
        tokens += [f"<unused_{i}>" for i in range(len(tokens), size)]
        if len(set(tokens)) != len(tokens):
            raise ValueError("The tokenizer maps two ids to the same token string; CTranslate2 needs distinct tokens.")
        return tokens

    def _set_stack(self, spec, stack, embeddings_spec) -> None:
        """Token embeddings, × √d_model, positions (§3.4, §3.5) and, for pre-LN, the final LayerNorm."""
        embeddings_spec.weight = _array(stack.embed_tokens.weight)
        spec.scale_embeddings = float(stack.embed_scale)  # 1.0: no scaling (CTranslate2 reads a number too)
        config = self.model.config
        if config.position_embedding_type == "learned":
            table = stack.embed_positions.weight[: self.max_positions]
        else:  # the paper's interleaved sinusoids, not CTranslate2's built-in (sines first) layout
            table = sinusoidal_position_encoding(torch.arange(self.max_positions), config.d_model)
        spec.position_encodings.encodings = _array(table)
        if config.norm_first:
            self._set_layer_norm(spec.layer_norm, stack.layer_norm)

    @staticmethod
    def _set_layer_norm(spec, norm) -> None:
        spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)

    @staticmethod
    def _set_linear(spec, linears: Sequence[torch.nn.Linear]) -> None:
        """One linear layer, or several fused into one (their outputs stacked): CTranslate2 computes Q, K, V
        of self-attention in one matrix product, and K, V of encoder–decoder attention in another."""
        spec.weight = np.concatenate([_array(linear.weight) for linear in linears])
        if linears[0].bias is not None:  # bias-free attention (the paper's) leaves CTranslate2's optional bias unset
            spec.bias = np.concatenate([_array(linear.bias) for linear in linears])

    def _set_attention(self, spec, attention, norm, self_attention: bool) -> None:
        """One attention sublayer. CTranslate2 fuses the input projections that read the same input: Q, K and V
        of self-attention in one matrix, K and V of encoder–decoder attention (which read the encoder's output)."""
        projections = [attention.q_proj, attention.k_proj, attention.v_proj]
        if self_attention:  # [Q K V], out
            self._set_linear(spec.linear[0], projections)
        else:  # encoder–decoder attention: Q, [K V], out
            self._set_linear(spec.linear[0], projections[:1])
            self._set_linear(spec.linear[1], projections[1:])
        self._set_linear(spec.linear[-1], [attention.out_proj])
        self._set_layer_norm(spec.layer_norm, norm)

    def _set_ffn(self, spec, layer) -> None:
        self._set_linear(spec.linear_0, [layer.ffn.fc1])
        self._set_linear(spec.linear_1, [layer.ffn.fc2])
        self._set_layer_norm(spec.layer_norm, layer.final_layer_norm)


def export_ctranslate2(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    quantization: str = "float32",
    max_positions: int | None = None,
    force: bool = False,
) -> Path:
    """Export a saved model folder to a CTranslate2 model folder.

    The folder holds CTranslate2's ``model.bin``, ``config.json`` and ``shared_vocabulary.json``, plus
    ``tokenizer/`` (the model's tokenizer), ``generation_config.json`` (the decoding defaults: beam 4,
    α = 0.6, source length + 50) and ``vanilla_transformer_export.json`` (what was exported). It is written
    to a temporary folder beside ``output_dir`` and renamed at the end, so a crash leaves no half export
    (:func:`~vanilla_transformer.checkpoints.save_folder_atomically`).

    Args:
        model_dir: what ``save_pretrained`` wrote (``RUN/final`` of ``vanilla-transformer train``), tokenizer included.
        quantization: the weights' type, one of :data:`QUANTIZATIONS`.
        max_positions: rows of the position table, so the longest source sentence and the longest output
            (each counted in tokens, ``</s>`` included) the export accepts. Default: the model's
            ``max_position_embeddings``, and at least 1024 for sinusoids (a learned table cannot be made longer).
        force: replace ``output_dir`` if it exists.

    Raises:
        ImportError: CTranslate2 is not installed.
        ValueError: the folder is not a saved model, the configuration has settings the export cannot
            represent, ``quantization`` or ``max_positions`` is invalid, or ``output_dir`` exists without ``force``.
    """
    require_ctranslate2()
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}.")
    output_dir = Path(output_dir)
    if output_dir.exists() and not force:
        raise ValueError(f"{str(output_dir)!r} exists; choose another --output_dir or pass --force to replace it.")
    model, tokenizer = load_model_and_tokenizer(model_dir)
    config = model.config
    refused = unexportable_fields(config)
    if refused:
        raise ValueError(
            f"Cannot export {str(model_dir)!r} to CTranslate2 exactly: the export does not know the setting(s) "
            f"{', '.join(refused)}. Translate this model with the default engine (transformers)."
        )
    learned = config.position_embedding_type == "learned"
    if max_positions is None:
        max_positions = config.max_position_embeddings if learned else max(config.max_position_embeddings, 1024)
    if not isinstance(max_positions, int) or max_positions < 2:
        raise ValueError(f"max_positions must be an integer of at least 2, got {max_positions!r}.")
    if learned and max_positions > config.max_position_embeddings:
        raise ValueError(
            f"max_positions={max_positions} is longer than this model's learned position table "
            f"(max_position_embeddings={config.max_position_embeddings}); use at most that."
        )

    def write(folder: Path) -> None:
        VanillaTransformerConverter(model, tokenizer, max_positions).convert(str(folder), quantization=quantization)
        tokenizer.save_pretrained(folder / TOKENIZER_FOLDER)
        model.generation_config.save_pretrained(folder)
        info = {
            "format": "ctranslate2",
            "ctranslate2_version": ctranslate2.__version__,
            "quantization": quantization,
            "max_positions": max_positions,
            "position_embedding_type": config.position_embedding_type,
            "exported_from": Path(model_dir).name,
        }
        write_json_atomically(folder / EXPORT_FILE, info)

    save_folder_atomically(output_dir, write)
    return output_dir


class CTranslate2Translator:
    """An exported model (:func:`export_ctranslate2`) with its tokenizer and decoding defaults.

    Args:
        folder: the export's folder.
        device: ``"cpu"`` or ``"cuda"``.
        compute_type: CTranslate2's compute type; ``"default"``: the type the weights were exported in.
        threads: CPU threads in all; 0: one per core this process may use.
        threads_per_batch: threads that decode one batch (CTranslate2's ``intra_threads``). On a CPU,
            ``threads // threads_per_batch`` batches are decoded at once (its ``inter_threads``): with the
            default of 1, each core decodes batches of its own: on a 2-core machine, int8 beam search took a
            quarter of the time of one batch at a time with both threads (docs/performance-log.md, "Threads").
            Raise it for the latency of a single batch on a large model. On CUDA, one batch at a time.

    Raises:
        ImportError: CTranslate2 is not installed.
        ValueError: ``folder`` is not an export (for instance a model folder that was never exported).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        device: str = "cpu",
        compute_type: str = "default",
        threads: int = 0,
        threads_per_batch: int = 1,
    ):
        require_ctranslate2()
        for name, value, least in (("threads", threads, 0), ("threads_per_batch", threads_per_batch, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}.")
        folder = Path(folder)
        if not (folder / EXPORT_FILE).is_file() or not (folder / "model.bin").is_file():
            hint = (
                "it looks like a saved model: export it first with "
                f"`vanilla-transformer export --model_name_or_path {folder} "
                f"--output_dir DIR`, then use DIR"
                if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
                else "give the folder that `vanilla-transformer export` wrote"
            )
            raise ValueError(
                f"{str(folder)!r} is not a CTranslate2 export ({EXPORT_FILE} or model.bin is missing): {hint}."
            )
        self.folder = folder
        self.info = json.loads((folder / EXPORT_FILE).read_text(encoding="utf-8"))
        self.tokenizer = load_tokenizer(folder / TOKENIZER_FOLDER)
        self.generation_config = GenerationConfig.from_pretrained(folder)
        self.max_positions = int(self.info["max_positions"])
        if not threads:
            threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads_per_batch = min(threads_per_batch, threads)
        # CTranslate2's worker pool runs up to inter_threads batches at once, each with intra_threads threads, and
        # shares the weights between them (a second worker added 21 MB to int8's peak RSS on a Multi30k model of
        # d_model 128).
        batches_at_once = max(1, threads // threads_per_batch) if device == "cpu" else 1
        self.translator = ctranslate2.Translator(
            str(folder),
            device=device,
            compute_type=compute_type,
            intra_threads=threads_per_batch,
            inter_threads=batches_at_once,
        )
        self.redecoded = 0  # sentences the last beam search decoded a second time (see translate_ids)

    def _limits(self, lengths: list[int], max_new_tokens: int | None) -> list[int]:
        """Tokens each output may have, ``</s>`` included; refuses what the position table cannot hold."""
        check_source_lengths(
            lengths,
            self.max_positions,
            table=f"this export's position table ({self.max_positions} positions)",
            fix="or export again with a larger --max-positions",
        )
        if max_new_tokens is not None:
            limits = [int(max_new_tokens)] * len(lengths)
        else:
            offset = getattr(self.generation_config, "source_length_offset", None)
            if offset is None:
                raise ValueError("The export's generation_config.json sets no length: pass max_new_tokens.")
            limits = [n + int(offset) for n in lengths]
        too_long = [i for i, n in enumerate(limits) if n > self.max_positions]
        if too_long:
            raise ValueError(
                f"{len(too_long)} sentence(s) may produce up to {max(limits[i] for i in too_long)} tokens (their "
                f"source length + {self.generation_config.source_length_offset}, or max_new_tokens), more than this "
                f"export's position table ({self.max_positions} positions). Pass a smaller max_new_tokens, or export "
                f"again with a larger --max-positions."
            )
        return limits

    def translate_ids(
        self,
        texts: list[str],
        batch_size: int = 32,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        max_new_tokens: int | None = None,
        progress: bool = False,
        group_by_limit: bool = False,
    ) -> list[list[int]]:
        """Token ids of each translation (without the decoder start token and ``</s>``), in the input order.

        Arguments as :meth:`translate`; ``group_by_limit=True`` puts only sentences of one limit (one source
        length) into a beam batch, the slower path the default is measured against (docs/deployment.md).
        Afterwards ``self.redecoded`` counts the sentences decoded a second time with their own limit.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts) or not len(texts):
            raise ValueError("`texts` must be a non-empty list of strings.")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        config = self.generation_config
        # transformers' own defaults where the export's generation config leaves a setting unset
        num_beams = int(num_beams if num_beams is not None else (config.num_beams or 1))
        length_penalty = float(
            length_penalty
            if length_penalty is not None
            else (config.length_penalty if config.length_penalty is not None else 1.0)
        )
        if getattr(config, "length_penalty_form", None) == "gnmt" and num_beams > 1 and length_penalty:
            logger.warning_once(
                "The export's generation_config.json asks for GNMT's length penalty ((5 + |Y|) / 6)^α, "
                "which CTranslate2 "
                "does not compute: it ranks beams by log P / |Y|^α. For GNMT's penalty, translate with the saved model "
                "(--engine transformers)."
            )
        tokenizer = self.tokenizer
        # The tokens CTranslate2 reads come with the ids (the encodings of a fast tokenizer), so they need no
        # conversion back from ids; the tokenizer's own call sets its padding and truncation off.
        tokens = [encoding.tokens for encoding in tokenizer(list(texts), add_special_tokens=True).encodings]
        limits = self._limits([len(t) for t in tokens], max_new_tokens)
        eos = tokenizer.convert_ids_to_tokens(config.eos_token_id)
        outputs: list[list[int] | None] = [None] * len(texts)

        def submit(batch: list[int], limit: int, num_hypotheses: int = 1) -> list[Any]:
            """Queue one batch: CTranslate2's workers decode queued batches in parallel (``inter_threads``)."""
            return self.translator.translate_batch(
                [tokens[i] for i in batch],
                beam_size=num_beams,
                num_hypotheses=num_hypotheses,
                length_penalty=length_penalty,
                max_decoding_length=limit - 1,  # + the </s> transformers would force
                min_decoding_length=0,  # </s> may come first, as in transformers
                max_input_length=0,  # never truncate the source
                return_end_token=True,  # counted in the length penalty's length, as transformers does
                max_batch_size=0,
                asynchronous=True,
            )

        def keep(i: int, hypothesis: list[str]) -> None:
            if hypothesis and hypothesis[-1] == eos:
                hypothesis = hypothesis[:-1]
            outputs[i] = tokenizer.convert_tokens_to_ids(hypothesis[: limits[i] - 1])

        def batched(indices: list[int], same_limit: bool) -> list[list[int]]:
            """Longest first (an out-of-memory error shows at once), in batches of similar source length."""
            batches: list[list[int]] = []
            for i in sorted(indices, key=lambda i: (-limits[i], i)):
                last = batches[-1] if batches else []
                if last and len(last) < batch_size and (not same_limit or limits[last[0]] == limits[i]):
                    last.append(i)
                else:
                    batches.append([i])
            return batches

        exact = num_beams == 1 or group_by_limit  # greedy: cutting at a sentence's own limit is exact
        # Every batch is queued before any result is read, so that all workers stay busy; results are read in
        # the order they were queued.
        queued = []
        for batch in batched(list(range(len(texts))), same_limit=num_beams > 1 and group_by_limit):
            if exact:
                queued.append((batch, None, submit(batch, max(limits[i] for i in batch))))
                continue
            # The batch runs with the limit most of its sentences have (the longest among equals): for those
            # the search is exactly their own. Every finished hypothesis comes back (with α ≠ 0 CTranslate2
            # stops a sentence once num_beams have finished, so asking for all of them does not change the
            # search); the longest one finished at the step the search stopped. If that step lies before
            # both the batch's last step and the sentence's own, the search with its own limit went the same
            # way and stopped there too: same hypotheses, same best.
            counts = Counter(limits[i] for i in batch)
            limit = max(counts, key=lambda n: (counts[n], n))
            queued.append((batch, limit, submit(batch, limit, num_hypotheses=num_beams)))
        again: list[int] = []  # beam search only: sentences whose search may have run into their own limit
        redo: list[tuple[list[int], list[Any]]] = []  # their second decoding, queued as soon as they are known
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(texts), unit="sent", desc="translating (CTranslate2)")
        try:
            for batch, limit, pending in queued:
                done, near = 0, []
                for i, waiting in zip(batch, pending):
                    result = waiting.result()
                    if limit is not None and limits[i] != limit:
                        longest = max((len(h) for h in result.hypotheses), default=limits[i])
                        if len(result.hypotheses) < num_beams or longest >= min(limit, limits[i]) - 2:  # 2: </s>
                            near.append(i)
                            continue
                    keep(i, result.hypotheses[0])
                    done += 1
                # Decoded again in batches of one limit each: exactly the search with each sentence's own limit.
                redo += [(group, submit(group, limits[group[0]])) for group in batched(near, same_limit=True)]
                again += near
                if bar is not None:
                    bar.update(done)
            for batch, pending in redo:
                for i, waiting in zip(batch, pending):
                    keep(i, waiting.result().hypotheses[0])
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
        self.redecoded = len(again)
        return outputs  # type: ignore[return-value]

    def translate(
        self,
        texts: list[str],
        batch_size: int = 32,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        max_new_tokens: int | None = None,
        progress: bool = False,
    ) -> list[str]:
        """Translate ``texts`` and return detokenised strings in the input order.

        Args:
            texts: source sentences, one string each.
            batch_size: sentences per call of the engine.
            num_beams, length_penalty, max_new_tokens: override the export's ``generation_config.json``; by
                default the paper's decoding: beam 4, α = 0.6, at most *source length + 50* tokens per sentence.
            progress: show a progress bar.

        Raises:
            ValueError: ``texts`` is empty or not a list of strings, or a sentence or its output limit is
                longer than the export's position table.
        """
        ids = self.translate_ids(texts, batch_size, num_beams, length_penalty, max_new_tokens, progress)
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)
