"""The "vanilla-translation" pipeline, the files save_pretrained writes for it, and `train --push_to_hub`."""

import json
from pathlib import Path

import huggingface_hub
import pytest
from conftest import tiny_model
from transformers import AutoModelForSeq2SeqLM, pipeline
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS, check_task

import vanilla_transformer
from vanilla_transformer import CUSTOM_PIPELINES, PIPELINE_TASK, VanillaTranslationPipeline
from vanilla_transformer.cli import build_parser, main
from vanilla_transformer.evaluation import translate
from vanilla_transformer.training import TrainConfig, push_folder_to_hub

PIPELINE_FILE = Path(vanilla_transformer.__file__).with_name("pipeline_vanilla_transformer.py")
ENTRY = {
    "vanilla-translation": {
        "impl": "pipeline_vanilla_transformer.VanillaTranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


@pytest.fixture(scope="module")
def mt_model(tokenizer):
    # seed 2 gives different (random-model) outputs for different sentences, so equality means something
    return tiny_model(seed=2, vocab_size=len(tokenizer), max_position_embeddings=256)


@pytest.fixture(scope="module")
def texts(valid_sentences, tokenizer) -> list[str]:
    chosen = [valid_sentences["en"][i] for i in (0, 5, 17, 42, 60)]
    assert len({len(tokenizer(t)["input_ids"]) for t in chosen}) > 2  # batches need padding
    return chosen


def _generate_and_decode(model, tokenizer, text: str, **kwargs) -> str:
    encoded = tokenizer(text, return_tensors="pt")
    return tokenizer.decode(model.generate(**encoded, **kwargs)[0], skip_special_tokens=True)


# ------------------------------------------------------------------ the task name
def test_task_is_our_own_name_and_registered_with_transformers():
    assert PIPELINE_TASK == "vanilla-translation"
    assert PIPELINE_TASK not in REMOVED_TASKS and not PIPELINE_TASK.startswith("translation_")
    registered = PIPELINE_REGISTRY.supported_tasks[PIPELINE_TASK]
    assert registered["impl"] is VanillaTranslationPipeline
    assert registered["pt"] == (AutoModelForSeq2SeqLM,)
    assert check_task(PIPELINE_TASK)[0] == PIPELINE_TASK
    with pytest.raises(KeyError, match="removed"):  # why we need our own task: transformers 5 removed this one
        check_task("translation")


# ------------------------------------------------------------------ same text as generate + decode and translate()
def test_pipeline_gives_the_texts_of_generate_and_of_translate_with_the_papers_defaults(mt_model, tokenizer, texts):
    pipe = pipeline(PIPELINE_TASK, model=mt_model, tokenizer=tokenizer, device="cpu")
    assert isinstance(pipe, VanillaTranslationPipeline)
    expected = [_generate_and_decode(mt_model, tokenizer, t) for t in texts]  # beam 4, α 0.6, source + 50
    assert len(set(expected)) > 1

    single = pipe(texts[0])
    assert isinstance(single, str) and single == expected[0]
    assert translate(mt_model, tokenizer, texts) == expected  # length-sorted batches of 32
    assert pipe(texts) == expected  # one sentence per generate call
    assert pipe(texts, batch_size=3) == expected  # input-order batches of 3, right-padded


def test_generation_parameters_at_build_and_at_call_time(mt_model, tokenizer, texts):
    kwargs = dict(num_beams=1, max_new_tokens=6)
    expected = translate(mt_model, tokenizer, texts, **kwargs)
    assert expected == [_generate_and_decode(mt_model, tokenizer, t, **kwargs) for t in texts]
    pipe = pipeline(PIPELINE_TASK, model=mt_model, tokenizer=tokenizer, device="cpu")
    assert pipe(texts, batch_size=3, **kwargs) == expected
    built = pipeline(PIPELINE_TASK, model=mt_model, tokenizer=tokenizer, device="cpu", **kwargs)
    assert built(texts, batch_size=3) == expected
    assert pipe(texts[:2]) != expected[:2]  # the call-time parameters did not stick to `pipe`
    with pytest.raises(ValueError, match="strings"):
        pipe([texts[0], 3])


# ------------------------------------------------------------------ what save_pretrained writes
def test_save_pretrained_writes_the_pipeline_file_and_custom_pipelines(mt_model, tokenizer, texts, tmp_path):
    assert CUSTOM_PIPELINES == ENTRY
    registered = PIPELINE_REGISTRY.supported_tasks[PIPELINE_TASK]
    assert registered["impl"] is VanillaTranslationPipeline and registered["type"] == "text"
    mt_model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / PIPELINE_FILE.name).read_bytes() == PIPELINE_FILE.read_bytes()
    assert json.loads((tmp_path / "model" / "config.json").read_text())["custom_pipelines"] == ENTRY

    # transformers' own way (Pipeline.save_pretrained) writes the same entry and files
    VanillaTranslationPipeline(model=mt_model, tokenizer=tokenizer, device="cpu").save_pretrained(tmp_path / "pipe")
    assert json.loads((tmp_path / "pipe" / "config.json").read_text())["custom_pipelines"] == ENTRY
    assert sorted(p.name for p in (tmp_path / "pipe").iterdir()) == sorted(
        p.name for p in (tmp_path / "model").iterdir()
    )

    # With the package installed, `pipeline_class=` uses its class and needs no remote code.
    pipe = pipeline(
        PIPELINE_TASK, model=str(tmp_path / "model"), pipeline_class=VanillaTranslationPipeline, device="cpu"
    )
    assert pipe(texts[:2], num_beams=1, max_new_tokens=6) == translate(
        mt_model, tokenizer, texts[:2], num_beams=1, max_new_tokens=6
    )


# ------------------------------------------------------------------ train --push_to_hub
def test_push_to_hub_option_and_repository_id_check(tmp_path):
    args = build_parser().parse_args(
        ["train", "--push_to_hub", "--hub_model_id", "someone/vanilla-en-de", "--hub_private_repo"]
    )
    assert (args.push_to_hub, args.hub_model_id, args.hub_private_repo) == (True, "someone/vanilla-en-de", True)
    assert build_parser().parse_args(["train"]).push_to_hub is False
    assert TrainConfig().push_to_hub is False
    with pytest.raises(ValueError, match="push_to_hub needs hub_model_id"):
        TrainConfig(push_to_hub=True)
    with pytest.raises(ValueError, match="not a Hub repository id"):
        TrainConfig(push_to_hub=True, hub_model_id="not a repo id")
    with pytest.raises(ValueError, match="not a saved model folder"):
        push_folder_to_hub(tmp_path, "someone/vanilla-en-de")


def test_push_to_hub_fails_before_training_when_offline(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE"):
        main(
            [
                "--debug",
                "train",
                "--dataset_name",
                str(corpus),
                "--output_dir",
                str(tmp_path / "run"),
                "--push_to_hub",
                "--hub_model_id",
                "someone/x",
            ]
        )
    assert not (tmp_path / "run").exists()


def test_push_to_hub_needs_a_token(tmp_path, monkeypatch):
    from vanilla_transformer.training import _check_hub_upload_possible

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    with pytest.raises(ValueError, match="token"):
        _check_hub_upload_possible("someone/x")
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    _check_hub_upload_possible("someone/x")


def test_without_the_option_nothing_is_uploaded(corpus, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, *a, **k: calls.append(("create_repo", a, k)))
    monkeypatch.setattr(
        huggingface_hub.HfApi, "upload_folder", lambda self, *a, **k: calls.append(("upload_folder", a, k))
    )
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "test_split": None,
                "model": {
                    "d_model": 32,
                    "encoder_ffn_dim": 64,
                    "decoder_ffn_dim": 64,
                    "encoder_layers": 1,
                    "decoder_layers": 1,
                },
            }
        )
    )
    main(
        [
            "train",
            "--config",
            str(config),
            "--dataset_name",
            str(corpus),
            "--output-dir",
            str(tmp_path / "run"),
            "--vocab-size",
            "400",
            "--max-tokens",
            "512",
            "--max-steps",
            "1",
            "--warmup-steps",
            "1",
            "--save_steps",
            "1",
            "--eval-bleu-sentences",
            "0",
            "--disable_tqdm",
            "--use_cpu",
        ]
    )
    assert (tmp_path / "run" / "final" / PIPELINE_FILE.name).is_file()
    assert calls == []
    assert "hub_commit" not in json.loads((tmp_path / "run" / "results.json").read_text())
