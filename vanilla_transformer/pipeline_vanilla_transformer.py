"""``pipeline("vanilla-translation", ...)``: texts in, translations out, in one line.

transformers 5 removed its ``translation`` and ``text2text-generation`` pipelines (and reserves those task
names), so this file defines a small custom pipeline for the task ``"vanilla-translation"``. It is
Hub-portable, like the configuration and modeling files: it imports only transformers (and, through it,
torch), and ``save_pretrained`` copies it next to the weights and names it in ``config.json`` under
``custom_pipelines``, so that anyone with transformers installed can run::

    from transformers import pipeline

    translate = pipeline("vanilla-translation", model="folder-or-hub-repo", trust_remote_code=True)
    translate("A sentence.")                      # one string in, one string out
    translate(["One.", "Two."], batch_size=32)    # a list in, a list out (in the same order)

Decoding is ``model.generate`` with the model's own ``generation_config`` (the paper's §6.1 defaults:
beam 4, length penalty α = 0.6, at most *source length + 50* tokens per sentence), then
``tokenizer.decode(..., skip_special_tokens=True)``: the same text as ``vanilla_transformer.evaluation.translate``
gives. Generation parameters (``num_beams=1``, ``max_new_tokens=20``, ...) can be given when the pipeline is
built or at each call; they override the generation config for that call.
"""

from transformers import AutoModelForSeq2SeqLM, Pipeline

#: The task name. transformers reserves "translation" (and "translation_xx_to_yy") as removed tasks.
TASK = "vanilla-translation"


class VanillaTranslationPipeline(Pipeline):
    """Translate text with a ``VanillaTransformerForConditionalGeneration`` and its tokenizer.

    Call it with one string (returns one string) or a list of strings (returns a list of strings, in
    order); ``batch_size=N`` translates N sentences per ``generate`` call (padded on the right, as the model
    expects). Any other keyword argument is a generation parameter passed to ``model.generate``.
    """

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    # Shared transformers logic for generating pipelines: generation parameters given when the pipeline is
    # built are set aside and applied to every call (`Pipeline._prepare_generate_kwargs`).
    _pipeline_calls_generate = True

    def __call__(self, texts, **kwargs):
        """Translate ``texts`` (a string, or a list of strings) and return detokenised translation(s).

        Args:
            texts: the source sentence(s).
            batch_size: sentences per ``generate`` call (default 1).
            **kwargs: generation parameters for this call (``num_beams``, ``length_penalty``, ``max_new_tokens``...).
        """
        return super().__call__(texts, **kwargs)

    def _sanitize_parameters(self, **generate_kwargs):
        if generate_kwargs.get("num_return_sequences", 1) != 1:
            raise ValueError(f"{TASK} returns one translation per text; num_return_sequences must be 1.")
        return {}, generate_kwargs, {}

    def preprocess(self, text):
        if not isinstance(text, str):
            raise ValueError(f"{TASK} translates strings; got {type(text).__name__}.")
        # The tokenizer appends </s> to the source, as in training (add_special_tokens=True).
        encoded = self.tokenizer(text, return_tensors="pt")
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}

    def _forward(self, model_inputs, **generate_kwargs):
        # Add the generation parameters given when the pipeline was built (this call's win).
        prepare = getattr(self, "_prepare_generate_kwargs", None)
        if prepare is not None:
            generate_kwargs = prepare(generate_kwargs)
        elif getattr(self, "generation_config", None) is not None and "generation_config" not in generate_kwargs:
            generate_kwargs["generation_config"] = self.generation_config  # older transformers releases
        output_ids = self.model.generate(
            input_ids=model_inputs["input_ids"], attention_mask=model_inputs["attention_mask"], **generate_kwargs
        )
        return {"output_ids": output_ids}

    def postprocess(self, model_outputs):
        return self.tokenizer.decode(model_outputs["output_ids"][0], skip_special_tokens=True)


# What `PIPELINE_REGISTRY.register_pipeline(TASK, VanillaTranslationPipeline, pt_model=AutoModelForSeq2SeqLM,
# type="text")` records on the class (the package registers it so). Set here too so that `Pipeline.save_pretrained`
# and `push_to_hub` write `custom_pipelines` and copy this file also where it was loaded as remote code.
VanillaTranslationPipeline._registered_impl = {
    TASK: {"impl": VanillaTranslationPipeline, "pt": (AutoModelForSeq2SeqLM,), "type": "text"}
}

__all__ = ["TASK", "VanillaTranslationPipeline"]
