"""A joint source+target BPE tokenizer for the Transformer, as a plain transformers fast tokenizer.

The paper (Vaswani et al., 2017, §5.1) encodes English–German with byte-pair encoding and one
*shared* source/target vocabulary of about 37,000 tokens, which is what lets us tie the encoder,
decoder and pre-softmax embedding matrices (§3.4). This module trains such a vocabulary.

The BPE itself is done by the Hugging Face ``tokenizers`` library (Rust, fast, and what
``transformers`` fast tokenizers are made of); we only configure its normaliser, pre-tokenizer,
model, decoder and post-processor, then wrap the result in ``transformers.PreTrainedTokenizerFast``.
There is deliberately no custom tokenizer class: ``save_pretrained`` writes a ``tokenizer.json``
that transformers' own fast tokenizer class loads. A tokenizer folder alone loads with
``AutoTokenizer.from_pretrained(folder)``. Next to a model, without this package installed, pass
``trust_remote_code=True`` as for the model: ``AutoTokenizer`` first reads the folder's ``config.json``,
whose ``AutoConfig`` is the folder's own code, and transformers otherwise asks on standard input whether to
run it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

__all__ = [
    "SPECIAL_TOKENS",
    "SPECIAL_TOKEN_IDS",
    "check_source_lengths",
    "check_tokenizer_matches_model",
    "drop_load_time_keys",
    "save_tokenizer",
    "train_joint_bpe",
]

#: The special tokens, in id order. Their ids (pad=0, bos=1, eos=2, unk=3) are the defaults of
#: ``VanillaTransformerConfig`` (``pad_token_id``, ``bos_token_id`` = ``decoder_start_token_id``,
#: ``eos_token_id``, ``unk_token_id``).
SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
SPECIAL_TOKEN_IDS = {"pad": 0, "bos": 1, "eos": 2, "unk": 3}

#: transformers' "no limit" (``VERY_LARGE_INTEGER``): the paper's sinusoidal positions have no length limit,
#: so a tokenizer alone claims none (with 1,024 it warned that longer inputs "will result in indexing
#: errors", which is false). ``match_model_max_length`` sets the limit of a model with learned positions.
#: Sequences are never truncated by the tokenizer either way.
DEFAULT_MODEL_MAX_LENGTH = int(1e30)


def train_joint_bpe(
    texts: Iterable[str],
    vocab_size: int = 8000,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train one BPE vocabulary on source *and* target sentences and wrap it for transformers.

    Args:
        texts: sentences of both languages (e.g. ``itertools.chain(sources, targets)``).
        vocab_size: final vocabulary size, the 4 special tokens and 256 byte symbols included
            (the paper: ~37,000 for En–De; a few thousand suffice for Multi30k).
        min_frequency: a pair must occur at least this often to be merged.
        show_progress: show the ``tokenizers`` progress bar.

    Returns:
        A fast tokenizer that appends ``</s>`` to every sequence (sources, and targets passed as
        ``text_target=``, which come back as ``labels``), prepends nothing (the decoder's start
        token ``<s>`` is added by the model when it shifts the labels), and never truncates.
    """
    n_reserved = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size <= n_reserved:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: {len(SPECIAL_TOKENS)} special tokens and 256 byte "
            f"symbols are always in the vocabulary, so use vocab_size > {n_reserved} (the paper used ~37000)."
        )

    specials = [SPECIAL_TOKENS[name] for name in ("pad", "bos", "eos", "unk")]  # ids 0, 1, 2, 3
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk"]))
    # NFC so that a composed "ü" and "u" + combining diaeresis get the same tokens.
    tok.normalizer = normalizers.NFC()
    # Byte-level BPE (as GPT-2/RoBERTa/BART) rather than SentencePiece-style Metaspace, because it is
    # lossless: every byte is in the base alphabet, so no character is ever <unk> (emoji, CJK, tabs
    # in Tatoeba sentences) and decoding restores the exact text, spaces and punctuation included.
    # `add_prefix_space=True` makes a sentence-initial word tokenise like the same word mid-sentence;
    # the decoder's Strip removes that one added space again, so "Hello, world!" round-trips exactly.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(content=" ", left=1, right=0)])

    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    length = len(texts) if hasattr(texts, "__len__") else None
    tok.train_from_iterator(texts, trainer=trainer, length=length)

    for name, token in SPECIAL_TOKENS.items():
        assert tok.token_to_id(token) == SPECIAL_TOKEN_IDS[name], (name, tok.token_to_id(token))

    # "</s>" after every sequence, no "<s>" before: the encoder input is `x </s>`, the labels are
    # `y </s>`, and the decoder input `<s> y` is made from the labels by the model.
    eos = SPECIAL_TOKENS["eos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {eos}:0",
        pair=f"$A:0 {eos}:0 $B:1 {eos}:1",
        special_tokens=[(eos, SPECIAL_TOKEN_IDS["eos"])],
    )

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIAL_TOKENS["pad"],
        bos_token=SPECIAL_TOKENS["bos"],
        eos_token=SPECIAL_TOKENS["eos"],
        unk_token=SPECIAL_TOKENS["unk"],
        model_max_length=DEFAULT_MODEL_MAX_LENGTH,
        padding_side="right",
        # The byte-level decoder already restores the exact text; transformers' legacy clean-up
        # (" ." -> ".", " 's" -> "'s", ...) would only corrupt it.
        clean_up_tokenization_spaces=False,
    )


#: What ``from_pretrained`` adds to a tokenizer's init kwargs about how it was loaded (from a local folder,
#: offline, at which commit). ``save_pretrained`` would write them into ``tokenizer_config.json``, a file
#: that describes the tokenizer and is uploaded to the Hub.
LOAD_TIME_KEYS = ("is_local", "local_files_only", "_commit_hash")


def drop_load_time_keys(tok: Any) -> Any:
    """Remove :data:`LOAD_TIME_KEYS` from ``tok.init_kwargs`` (in place; returns ``tok``), so that whatever
    saves it next (``save_pretrained``, a ``Trainer``) writes only the tokenizer's own settings."""
    for key in LOAD_TIME_KEYS:
        tok.init_kwargs.pop(key, None)
    return tok


def save_tokenizer(tok: PreTrainedTokenizerFast, folder: str | os.PathLike) -> tuple[str, ...]:
    """Save ``tok`` to ``folder`` (``tokenizer.json`` + ``tokenizer_config.json``), without the keys that
    only say how it was loaded (:func:`drop_load_time_keys`).

    Reload with ``transformers.AutoTokenizer.from_pretrained(folder)``; with a model's ``config.json`` in
    the same folder and without this package installed, add ``trust_remote_code=True``.
    """
    return drop_load_time_keys(tok).save_pretrained(folder)


def match_model_max_length(tokenizer: Any, config: Any) -> None:
    """Set ``tokenizer.model_max_length`` to what the model can read: ``max_position_embeddings`` with learned
    positions, no limit with the paper's sinusoids. Called before a tokenizer is saved beside a model."""
    learned = getattr(config, "position_embedding_type", "sinusoidal") == "learned"
    tokenizer.model_max_length = config.max_position_embeddings if learned else DEFAULT_MODEL_MAX_LENGTH


def config_ids_from_tokenizer(tokenizer: Any) -> dict[str, int]:
    """The config fields a new model takes from its tokenizer: ``vocab_size`` and the special token ids
    (generation starts from ``<s>``, which is also ``decoder_start_token_id``)."""
    return dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        unk_token_id=tokenizer.unk_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )


def check_tokenizer_matches_model(tokenizer: Any, config: Any) -> None:
    """Raise ``ValueError`` if ``tokenizer`` cannot feed a model built from ``config``.

    Checks that every token id fits the embedding matrix (``len(tokenizer) <= config.vocab_size``)
    and that the pad, eos and bos ids agree. ``config`` is anything with ``vocab_size``,
    ``pad_token_id``, ``eos_token_id`` and ``bos_token_id`` attributes.
    """
    problems = []
    n_tokens = len(tokenizer)
    if n_tokens > config.vocab_size:
        problems.append(
            f"the tokenizer has {n_tokens} tokens but config.vocab_size={config.vocab_size}, so ids "
            f">= {config.vocab_size} would index past the embedding matrix. Build the config with "
            f"vocab_size={n_tokens} (or larger), or retrain the tokenizer with vocab_size<={config.vocab_size}."
        )
    for name in ("pad", "eos", "bos"):
        attr = f"{name}_token_id"
        tok_id, cfg_id = getattr(tokenizer, attr, None), getattr(config, attr, None)
        if tok_id != cfg_id:
            problems.append(
                f"{attr} differs: tokenizer {tok_id} ({getattr(tokenizer, f'{name}_token', None)!r}), "
                f"config {cfg_id}. Build the config with {attr}={tok_id}, or use a tokenizer whose "
                f"{name} token has id {cfg_id} (train_joint_bpe uses {SPECIAL_TOKEN_IDS[name]})."
            )
    if problems:
        raise ValueError("Tokenizer and model config do not match:\n" + "\n".join(f"  - {p}" for p in problems))


def check_source_lengths(lengths: list[int], limit: int, *, table: str, fix: str) -> None:
    """Refuse tokenised sources longer than a position table of ``limit`` rows.

    ``lengths`` are the sources' lengths in tokens (``</s>`` included); ``table`` names the table in the message
    (e.g. "this export's position table (512 positions)") and ``fix`` adds what else can be done besides
    shortening or splitting the sentences.

    Raises:
        ValueError: naming the first five sentences that are too long, with their lengths.
    """
    too_long = [i for i, n in enumerate(lengths) if n > limit]
    if too_long:
        shown = ", ".join(f"text {i} has {lengths[i]} tokens" for i in too_long[:5])
        raise ValueError(
            f"{len(too_long)} source sentence(s) are longer than {table}: {shown}. Shorten or split them ({fix})."
        )
