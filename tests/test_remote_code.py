"""A saved folder must load with only transformers installed (trust_remote_code=True)."""

import json
import os
import subprocess
import sys
import textwrap

import torch
from conftest import random_ids, tiny_model

from vanilla_transformer import VanillaTransformerForConditionalGeneration


def test_saved_folder_has_auto_map_and_the_two_portable_files(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "vanilla_transformer"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    for name in ("configuration_vanilla_transformer.py", "modeling_vanilla_transformer.py", "model.safetensors"):
        assert (tmp_path / name).is_file(), name
    assert not (tmp_path / "__init__.py").exists()


def test_folder_loads_and_generates_identically_without_the_package(tmp_path):
    model = tiny_model()
    folder = tmp_path / "checkpoint"
    model.save_pretrained(folder)
    src = random_ids(2, 6)
    torch.save(src, tmp_path / "src.pt")
    expected = model.generate(src, max_new_tokens=10)
    expected_beam = model.generate(src)  # paper defaults: beam 4, alpha 0.6, source length + 50

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
        src = torch.load({str(tmp_path / "src.pt")!r}, weights_only=True)
        torch.save({{"greedy": model.generate(src, max_new_tokens=10), "beam": model.generate(src)}},
                   {str(tmp_path / "out.pt")!r})
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


def test_package_and_remote_code_classes_give_the_same_logits(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    src, tgt = random_ids(2, 5), random_ids(2, 4, seed=1)
    assert torch.equal(model(input_ids=src, decoder_input_ids=tgt).logits, reloaded(input_ids=src, decoder_input_ids=tgt).logits)
