"""vanilla_transformer: the Transformer of "Attention Is All You Need" as a transformers 5 model.

Importing the package registers the model with transformers' Auto classes, so that
``AutoConfig``, ``AutoModel`` and ``AutoModelForSeq2SeqLM`` know ``model_type="vanilla_transformer"``,
and marks the classes so that ``save_pretrained`` writes ``auto_map`` and copies the two
Hub-portable files (configuration + modeling) next to the weights.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
    shift_tokens_right,
    sinusoidal_position_encoding,
)

__version__ = "0.1.0"


def _register() -> None:
    AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
    AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
    AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)
    VanillaTransformerConfig.register_for_auto_class("AutoConfig")
    VanillaTransformerModel.register_for_auto_class("AutoModel")
    VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


_register()

__all__ = [
    "VanillaTransformerConfig",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerPreTrainedModel",
    "shift_tokens_right",
    "sinusoidal_position_encoding",
]
