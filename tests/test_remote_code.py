"""A saved folder must load with only transformers installed (trust_remote_code=True)."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import huggingface_hub
import pytest
import torch
from conftest import random_ids, tiny_model
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

import vanilla_transformer
import vanilla_transformer.training
from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.cards import write_model_card
from vanilla_transformer.cli import main
from vanilla_transformer.evaluation import translate
from vanilla_transformer.loading import load_tokenizer
from vanilla_transformer.tokenization import match_model_max_length, save_tokenizer, train_joint_bpe
from vanilla_transformer.training_config import TrainConfig

#: What transformers writes into a tokenizer's init kwargs when it loads one; not for a saved file.
LOAD_TIME_KEYS = {"is_local", "local_files_only", "_commit_hash"}
#: transformers' remote-code prompt, and its warning when the prompt is declined and it loads anyway.
PROMPT, TYPE_WARNING = "Do you wish to run the custom code", "to instantiate a model of type"

PORTABLE_FILES = (
    "configuration_vanilla_transformer.py",
    "modeling_vanilla_transformer.py",
    "generation_vanilla_transformer.py",
    "kernels_vanilla_transformer.py",
    "pipeline_vanilla_transformer.py",
)


def test_saved_folder_has_auto_map_and_the_portable_files(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "vanilla_transformer"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    for name in (*PORTABLE_FILES, "model.safetensors"):
        assert (tmp_path / name).is_file(), name
        if name.endswith(".py"):  # the files travel unchanged
            assert (tmp_path / name).read_bytes() == (Path(vanilla_transformer.__file__).parent / name).read_bytes()
    assert not (tmp_path / "__init__.py").exists()


@pytest.mark.parametrize(
    "overrides",
    [{}, {"encoder_attention_heads": 3, "decoder_attention_heads": 5, "head_dim": 12}],
    ids=["paper", "head_dim"],
)
def test_folder_loads_and_generates_identically_without_the_package(tmp_path, overrides):
    model = tiny_model(**overrides)  # with the paper's decoding, as the package's checkpoints carry it
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)
    src = random_ids(2, 6)
    torch.save(src, tmp_path / "src.pt")
    expected = model.generate(src, max_new_tokens=10)
    expected_beam = model.generate(src)  # paper defaults: beam 4, alpha 0.6, source length + 50
    expected_logits = model(input_ids=src, decoder_input_ids=expected).logits
    q_rows = model.model.decoder.layers[0].self_attn.q_proj.weight.shape[0]  # h·d_k (d_model without head_dim)

    script = textwrap.dedent(
        f"""
        import sys, torch
        # Make sure the package cannot be imported: only transformers + the folder's own code.
        sys.modules["vanilla_transformer"] = None
        from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
        folder = {str(folder)!r}
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        assert model.lm_head.weight is model.model.shared.weight
        # the folder's own generation file, whose in-place beam search runs here (a tested transformers)
        generation = sys.modules[type(model).__module__.rsplit(".", 1)[0] + ".generation_vanilla_transformer"]
        assert generation.in_place_beam_search_unavailable() is None
        rows = []
        model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(lambda m, i, o: rows.append(o.shape[0]))
        src = torch.load({str(tmp_path / "src.pt")!r}, weights_only=True)
        greedy, beam = model.generate(src, max_new_tokens=10), model.generate(src)
        assert rows == [2, 2], rows  # greedy, then beam search with one encoder row per sentence
        with torch.no_grad():
            logits = model(input_ids=src, decoder_input_ids=greedy).logits
        torch.save({{"greedy": greedy, "beam": beam, "logits": logits}}, {str(tmp_path / "out.pt")!r})
        assert model.config.head_dim == {model.config.head_dim!r}, model.config.head_dim
        assert model.model.decoder.layers[0].self_attn.q_proj.weight.shape[0] == {q_rows}
        base = AutoModel.from_pretrained(folder, trust_remote_code=True)
        assert type(base).__name__ == "VanillaTransformerModel"
        assert AutoConfig.from_pretrained(folder, trust_remote_code=True).model_type == "vanilla_transformer"
        """
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert torch.equal(out["greedy"], expected)
    assert torch.equal(out["beam"], expected_beam)
    torch.testing.assert_close(out["logits"], expected_logits)


def test_package_and_remote_code_classes_give_the_same_logits(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    src, tgt = random_ids(2, 5), random_ids(2, 4, seed=1)
    assert torch.equal(
        model(input_ids=src, decoder_input_ids=tgt).logits, reloaded(input_ids=src, decoder_input_ids=tgt).logits
    )


def test_the_folder_train_pushes_translates_without_the_package_through_auto_classes_and_pipeline(
    corpus, tmp_path, monkeypatch
):
    """`train --push_to_hub` uploads its final folder (upload monkeypatched); that exact folder, in a process
    that cannot import vanilla_transformer, loads through AutoTokenizer + AutoModelForSeq2SeqLM and through
    pipeline("vanilla-translation", trust_remote_code=True), and translates as the package does in-process."""
    calls = []
    snapshot = tmp_path / "uploaded"

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return types.SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        shutil.copytree(folder_path, snapshot)  # what would be sent, as it is at upload time
        calls.append(("upload_folder", repo_id, Path(folder_path), kwargs))
        return types.SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0123")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(
        vanilla_transformer.training, "_check_hub_upload_possible", lambda repo: calls.append(("check", repo))
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
    run = tmp_path / "run"
    main(
        [
            "train",
            "--config",
            str(config),
            "--dataset_name",
            str(corpus),
            "--output-dir",
            str(run),
            "--vocab-size",
            "400",
            "--max-tokens",
            "512",
            "--max-steps",
            "2",
            "--warmup-steps",
            "2",
            "--save_steps",
            "2",
            "--eval-bleu-sentences",
            "0",
            "--disable_tqdm",
            "--use_cpu",
            "--push_to_hub",
            "someone/vanilla-en-de",
        ]
    )

    # (c) one upload: the whole final folder, after the check that ran before training
    assert [c[0] for c in calls] == ["check", "create_repo", "upload_folder"]
    assert calls[1][1] == calls[2][1] == "someone/vanilla-en-de" and calls[2][2] == run / "final"
    uploaded = sorted(p.name for p in snapshot.iterdir())
    assert uploaded == sorted(p.name for p in (run / "final").iterdir())
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        *PORTABLE_FILES,
    } <= set(uploaded)
    assert json.loads((snapshot / "config.json").read_text())["custom_pipelines"]["vanilla-translation"]["impl"] == (
        "pipeline_vanilla_transformer.VanillaTranslationPipeline"
    )
    assert json.loads((run / "results.json").read_text())["hub_commit"].endswith("/commit/0123")
    assert not set(json.loads((snapshot / "tokenizer_config.json").read_text())) & LOAD_TIME_KEYS

    # (b) in-process translations of the uploaded folder, with the package
    texts = (corpus / "valid.en").read_text(encoding="utf-8").splitlines()[:4]
    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    model = AutoModelForSeq2SeqLM.from_pretrained(snapshot).eval()
    expected = translate(model, tokenizer, texts)  # paper defaults: beam 4, alpha 0.6, source length + 50
    in_process = pipeline("vanilla-translation", model=model, tokenizer=tokenizer, device="cpu")
    assert in_process(texts, batch_size=2) == expected

    script = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["vanilla_transformer"] = None  # only transformers + the folder's own code
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        folder, texts = {str(snapshot)!r}, {texts!r}
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        auto = tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)
        pipe = pipeline(task="vanilla-translation", model=folder, trust_remote_code=True, device="cpu")
        for obj in (pipe, pipe.model):
            assert type(obj).__module__.startswith("transformers_modules"), type(obj).__module__
        inferred = pipeline(model=folder, trust_remote_code=True, device="cpu")  # task from custom_pipelines
        out = {{"auto": auto, "pipe": pipe(texts, batch_size=3), "single": pipe(texts[0]), "task": inferred.task,
                "pipe_class": type(inferred).__name__}}
        with open({str(tmp_path / "out.json")!r}, "w") as f:
            json.dump(out, f)
        """
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert PROMPT not in result.stdout + result.stderr and TYPE_WARNING not in result.stdout + result.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["auto"] == expected
    assert out["pipe"] == expected
    assert out["single"] == expected[0]
    assert out["task"] == "vanilla-translation" and out["pipe_class"] == "VanillaTranslationPipeline"


def test_the_cards_how_to_use_snippet_runs_without_the_package_and_without_a_prompt(tmp_path):
    """A folder saved as the training command saves it (a BPE trained, saved, loaded back, saved next to the
    model, then the card): its tokenizer_config.json carries no load-time keys, and the card's "How to use"
    snippet, run verbatim where the package cannot be imported and standard input is closed, neither asks
    "Do you wish to run the custom code?" nor warns about the model type, and tokenizes as in-process."""
    sentences = [
        "A dog runs in the park.",
        "Ein Hund läuft im Park.",
        "Two children play football.",
        "Zwei Kinder spielen Fußball.",
        "The cat sleeps.",
        "Die Katze schläft.",
    ]
    save_tokenizer(train_joint_bpe(sentences * 20, vocab_size=300), tmp_path / "tokenizer")
    tokenizer = load_tokenizer(tmp_path / "tokenizer")  # the run's own tokenizer, loaded back
    model = tiny_model(vocab_size=len(tokenizer))
    folder = tmp_path / "final"
    model.save_pretrained(folder)
    match_model_max_length(tokenizer, model.config)
    save_tokenizer(tokenizer, folder)
    write_model_card(
        folder, config=TrainConfig(dataset_name="data/tatoeba_en_de"), model_config=model.config, summary={"step": 1}
    )
    for saved in (tmp_path / "tokenizer", folder):
        keys = set(json.loads((saved / "tokenizer_config.json").read_text()))
        assert not keys & LOAD_TIME_KEYS, (saved.name, sorted(keys & LOAD_TIME_KEYS))

    card = (folder / "README.md").read_text(encoding="utf-8")
    snippet = re.search(r"## How to use\n\n```python\n(.*?)```", card, re.S).group(1)
    assert "AutoTokenizer.from_pretrained(" in snippet
    check = textwrap.dedent(
        f"""
        import json
        ids = tokenizer({sentences!r})["input_ids"]
        with open({str(tmp_path / "out.json")!r}, "w") as f:
            json.dump({{"class": type(tokenizer).__name__, "ids": ids,
                        "decoded": tokenizer.batch_decode(ids, skip_special_tokens=True)}}, f)
        """
    )
    script = (
        'import sys\nsys.modules["vanilla_transformer"] = None\n'
        + snippet.replace("<this folder or repo>", str(folder))
        + check
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert PROMPT not in output, output[-3000:]
    assert TYPE_WARNING not in output, output[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["class"] == type(tokenizer).__name__
    assert out["ids"] == tokenizer(sentences)["input_ids"]
    assert out["decoded"] == sentences
