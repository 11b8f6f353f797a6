"""vanilla_transformer: the Transformer of "Attention Is All You Need" as a transformers 5 model.

Importing the package registers the model with transformers' Auto classes, so that
``AutoConfig``, ``AutoModel`` and ``AutoModelForSeq2SeqLM`` know ``model_type="vanilla_transformer"``,
and marks the classes so that ``save_pretrained`` writes ``auto_map`` and copies the two
Hub-portable files (configuration + modeling) next to the weights.

It also registers the translation pipeline (task ``"vanilla-translation"``, see
``pipeline_vanilla_transformer.py``) with transformers' ``PIPELINE_REGISTRY``; the model's
``save_pretrained`` writes that file and its ``custom_pipelines`` entry next to the weights, so that
``pipeline("vanilla-translation", model=folder, trust_remote_code=True)`` works where only
transformers is installed.

The modules form layers, lowest first. A module imports only modules of lower layers, or of its own
layer without a circle; ``tests/test_layers.py`` checks every import, including those in functions:

1. configuration: ``configuration_vanilla_transformer``
2. modeling: ``modeling_vanilla_transformer`` and its Hub-portable siblings ``pipeline_vanilla_transformer``,
   ``generation_vanilla_transformer``, ``kernels_vanilla_transformer`` (every ``*_vanilla_transformer.py``
   imports only torch, transformers, huggingface_hub, safetensors, the standard library and, relatively,
   the others), and this ``__init__``
3. foundations: ``tokenization``, ``data``, ``schedule``, ``checkpoints`` (and the atomic writes of the whole
   package), ``prepared`` (a corpus tokenised once into memory-mapped token arrays, above ``checkpoints``),
   ``distributed`` (decisions and collectives that every process takes together), ``training_config``
   (run settings and the presets they name), ``loading`` (above ``training_config``), ``deployment`` (the
   CTranslate2 export and engine, above ``loading``)
4. evaluation: ``evaluation`` (the translation interface both engines implement, scoring, perplexity)
5. reporting: ``visualization``, ``cards``, and ``explorer`` (the attention explorer, a Gradio app, with its
   beam-candidate inspection)
6. training: ``training`` (Accelerate) and ``finetuning`` (transformers' Seq2SeqTrainer)
7. command line: ``cli``, ``__main__``

``examples/``, ``benchmarks/`` and ``scripts/`` sit above the package, which never imports them.
"""

from importlib.metadata import PackageNotFoundError, version

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .modeling_vanilla_transformer import (
    CUSTOM_PIPELINES,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
    shift_tokens_right,
    sinusoidal_position_encoding,
)
from .pipeline_vanilla_transformer import TASK as PIPELINE_TASK
from .pipeline_vanilla_transformer import VanillaTranslationPipeline

try:  # the installed distribution's version (pyproject.toml), so that the two cannot disagree
    __version__ = version("vanilla-transformer")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"


def _register() -> None:
    AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
    AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
    AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)
    VanillaTransformerConfig.register_for_auto_class("AutoConfig")
    VanillaTransformerModel.register_for_auto_class("AutoModel")
    VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
    registered = PIPELINE_REGISTRY.supported_tasks.get(PIPELINE_TASK)
    if registered is None or registered["impl"] is not VanillaTranslationPipeline:
        PIPELINE_REGISTRY.register_pipeline(
            PIPELINE_TASK, pipeline_class=VanillaTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
        )


_register()

__all__ = [
    "CUSTOM_PIPELINES",
    "PIPELINE_TASK",
    "VanillaTranslationPipeline",
    "VanillaTransformerConfig",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerPreTrainedModel",
    "shift_tokens_right",
    "sinusoidal_position_encoding",
]
