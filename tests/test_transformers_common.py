"""transformers' own generic model tests, run against this model.

Every model inside transformers passes the same suites: ``ModelTesterMixin`` (forward, save/load, outputs,
attention implementations, gradient checkpointing, ...), ``GenerationTesterMixin`` (greedy, sampling, beam
search, caches, assisted decoding, compilation, ...) and ``ConfigTester``. A model's test file defines a tiny
"model tester" and one ``unittest.TestCase`` inheriting them; this file does the same, in the manner of
transformers' ``tests/models/marian/test_modeling_marian.py``.

The suites are transformers' files, not this project's: they are read from a copy of transformers' test folder
(``shared/transformers-tests`` beside the repository, or the folder named by ``TRANSFORMERS_TESTS_DIR``) and
imported as the package ``tests``. Without that folder this module is skipped, with the reason.

Not inherited: ``PipelineTesterMixin``, whose tests load transformers' tiny models of each architecture from the
Hub (every one of them skips offline, for Marian too); this model's pipeline is tested in ``test_pipeline.py``.
"""

import os
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import pytest
import torch

from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)


def _suites_folder() -> Path | None:
    given = os.environ.get("TRANSFORMERS_TESTS_DIR")
    folder = Path(given) if given else Path(__file__).resolve().parents[2] / "shared" / "transformers-tests"
    return folder if (folder / "tests" / "test_modeling_common.py").is_file() else None


SUITES = _suites_folder()
if SUITES is None:
    pytest.skip(
        "transformers' common model tests are not here: put a copy of transformers' tests/ folder (with "
        "test_modeling_common.py, test_configuration_common.py and generation/test_utils.py) in "
        "shared/transformers-tests/ beside the repository, or name its folder in TRANSFORMERS_TESTS_DIR",
        allow_module_level=True,
    )
if str(SUITES) not in sys.path:
    sys.path.insert(0, str(SUITES))  # transformers' files import each other as the package `tests`

import tests.test_modeling_common as modeling_common  # noqa: E402
from tests.generation.test_utils import GenerationTesterMixin  # noqa: E402
from tests.test_configuration_common import ConfigTester  # noqa: E402
from tests.test_modeling_common import ModelTesterMixin, ids_tensor  # noqa: E402

PAD, BOS, EOS = 0, 1, 2  # this model's defaults (the tokenizer's order): <pad> <s> </s> <unk>


class VanillaTransformerModelTester:
    """Tiny sizes and random batches for the generic tests (the sizes transformers' Marian tester uses)."""

    def __init__(
        self,
        parent,
        batch_size=13,
        seq_length=7,
        vocab_size=99,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=4,
        dropout=0.1,
        max_position_embeddings=100,
    ):
        self.parent = parent
        self.batch_size, self.seq_length, self.vocab_size = batch_size, seq_length, vocab_size
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads = (
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
        )
        self.intermediate_size, self.dropout, self.max_position_embeddings = (
            intermediate_size,
            dropout,
            max_position_embeddings,
        )
        # read by the generic tests
        self.is_training = True
        self.encoder_seq_length = self.decoder_seq_length = seq_length
        self.pad_token_id, self.bos_token_id, self.eos_token_id = PAD, BOS, EOS

    def get_config(self) -> VanillaTransformerConfig:
        return VanillaTransformerConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            dropout=self.dropout,
            attention_dropout=self.dropout,
            max_position_embeddings=self.max_position_embeddings,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
            decoder_start_token_id=BOS,
        )

    def prepare_config_and_inputs(self) -> tuple[VanillaTransformerConfig, dict]:
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(4)  # no special tokens
        input_ids[:, -1] = EOS
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(4)
        inputs = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": input_ids.ne(PAD).long(),
            "decoder_attention_mask": decoder_input_ids.ne(PAD).long(),
        }
        return self.get_config(), inputs

    def prepare_config_and_inputs_for_common(self) -> tuple[VanillaTransformerConfig, dict]:
        return self.prepare_config_and_inputs()


class VanillaTransformerModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (VanillaTransformerModel, VanillaTransformerForConditionalGeneration)
    is_encoder_decoder = True
    test_missing_keys = False  # as Marian: the tied embeddings are saved once

    def setUp(self):
        self.model_tester = VanillaTransformerModelTester(self)
        self.config_tester = ConfigTester(self, config_class=VanillaTransformerConfig, d_model=16)
        # The suites tell a base model from a sequence-to-sequence LM head by the class names in transformers'
        # auto mappings, which list built-in models only; name these classes there too, as for Marian's
        # (MarianModel, MarianMTModel), so that the same checks apply to each (labels and the loss go to the head).
        for name, cls in (
            ("MODEL_MAPPING_NAMES", VanillaTransformerModel),
            ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", VanillaTransformerForConditionalGeneration),
        ):
            names = {**getattr(modeling_common, name), VanillaTransformerConfig.model_type: cls.__name__}
            patcher = mock.patch.object(modeling_common, name, names)
            patcher.start()
            self.addCleanup(patcher.stop)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_save_load_strict(self):
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(folder)
                _, info = model_class.from_pretrained(folder, output_loading_info=True)
            self.assertEqual(info["missing_keys"], set())

    def test_generate_keeps_the_papers_per_sentence_limit(self):
        """The one thing this model's generate adds: without a length, each sentence stops at its source length +
        ``source_length_offset`` (§6.1), alone or in a padded batch."""
        config, inputs = self.model_tester.prepare_config_and_inputs()
        model = VanillaTransformerForConditionalGeneration(config).eval()
        model.generation_config.source_length_offset = 2
        model.generation_config.num_beams = 1
        ids = inputs["input_ids"][:2].clone()
        mask = torch.ones_like(ids)
        ids[1, 3:], mask[1, 3:] = PAD, 0  # the second sentence has 3 tokens
        model.generation_config.suppress_tokens = [
            EOS,
            PAD,
        ]  # run to the limit (a random model may emit <pad>, counted as none)
        out = model.generate(input_ids=ids, attention_mask=mask)
        produced = (out[:, 1:] != PAD).sum(-1)
        self.assertEqual(produced.tolist(), [7 + 2, 3 + 2])
