"""Checkpoints: averaging (§6.1: exactness, tied weights, both layouts, error messages) and atomic saves.

How saving behaves inside a training run (rotation, resume, a full disk, SIGKILL) is tested in
test_training.py and test_kill_resume.py.
"""

import json
import logging

import pytest
import torch
from conftest import random_ids, tiny_model
from safetensors.torch import load_file, save_file

from vanilla_transformer.checkpoints import (
    TIED_WEIGHTS_WARNING,
    average_checkpoints,
    average_into_model,
    incomplete_checkpoints,
    list_checkpoints,
    save_checkpoint,
    save_folder_atomically,
    tied_weights_warning_silenced,
    write_json_atomically,
)

TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


def _save(model, folder):
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """Two different checkpoints of the same tiny architecture, as save_pretrained folders."""
    root = tmp_path_factory.mktemp("ckpts")
    a, b = tiny_model(seed=0), tiny_model(seed=1)
    return _save(a, root / "a"), _save(b, root / "b")


def test_identical_checkpoints_average_to_themselves_bit_exact(two_checkpoints, tmp_path):
    a, _ = two_checkpoints
    original = load_file(a / "model.safetensors")
    # The same checkpoint as a folder and as a file, three times in all.
    averaged = average_checkpoints([a, a / "model.safetensors", str(a)])
    assert list(averaged) == list(original)
    for key, tensor in original.items():
        assert averaged[key].dtype == tensor.dtype
        assert torch.equal(averaged[key], tensor), key


def test_two_checkpoints_average_to_their_mean(two_checkpoints):
    a, b = two_checkpoints
    sa, sb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    averaged = average_checkpoints([a, b])
    assert averaged.keys() == sa.keys()
    differing = 0
    for key in sa:
        mean = (sa[key].double() + sb[key].double()) / 2
        torch.testing.assert_close(averaged[key].double(), mean, atol=1e-6, rtol=0)
        if not torch.equal(sa[key], sb[key]):
            differing += 1
            assert not torch.equal(averaged[key], sa[key]) and not torch.equal(averaged[key], sb[key]), key
    assert differing > 0


def test_non_float_tensors_are_copied_and_must_agree(tmp_path):
    w = torch.randn(3, 2)
    save_file({"w": w, "step": torch.tensor([7])}, tmp_path / "a.safetensors")
    save_file({"w": -w, "step": torch.tensor([7])}, tmp_path / "b.safetensors")
    save_file({"w": w, "step": torch.tensor([8])}, tmp_path / "c.safetensors")
    averaged = average_checkpoints([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    assert torch.equal(averaged["step"], torch.tensor([7])) and averaged["step"].dtype == torch.int64
    assert torch.equal(averaged["w"], torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"Non-float tensor 'step'.*differs"):
        average_checkpoints([tmp_path / "a.safetensors", tmp_path / "c.safetensors"])


def test_average_into_model_keeps_tying_and_matches_mean_weights(two_checkpoints):
    a, b = two_checkpoints
    saved = load_file(a / "model.safetensors")
    # What save_pretrained writes: the shared matrix once, none of its tied names.
    assert "model.shared.weight" in saved and not any(name in saved for name in TIED)

    model = average_into_model(tiny_model(seed=5), [a, b])
    assert model.lm_head.weight is model.model.shared.weight
    assert model.model.encoder.embed_tokens.weight is model.model.shared.weight
    assert model.model.decoder.embed_tokens.weight is model.model.shared.weight

    # A model built by hand from the mean weights gives the same logits.
    ma, mb, reference = tiny_model(seed=0), tiny_model(seed=1), tiny_model(seed=9)
    with torch.no_grad():
        for (name, p), pa, pb in zip(reference.named_parameters(), ma.parameters(), mb.parameters()):
            p.copy_((pa.double() + pb.double()).div(2).to(p.dtype))
    src, tgt = random_ids(2, 7, seed=1), random_ids(2, 5, seed=2)
    with torch.no_grad():
        got = model(input_ids=src, decoder_input_ids=tgt).logits
        want = reference(input_ids=src, decoder_input_ids=tgt).logits
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_average_into_model_from_accelerate_save_state(tmp_path):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = tiny_model(seed=3, position_embedding_type="learned")
    prepared = accelerator.prepare(model)
    accelerator.save_state(tmp_path / "state")
    accelerator.free_memory()
    saved = load_file(tmp_path / "state" / "model.safetensors")
    assert "model.shared.weight" in saved and not any(name in saved for name in TIED)

    fresh = average_into_model(tiny_model(seed=4, position_embedding_type="learned"), [tmp_path / "state"])
    assert fresh.lm_head.weight is fresh.model.shared.weight
    for (name, p), q in zip(fresh.state_dict().items(), prepared.state_dict().values()):
        assert torch.equal(p, q), name


def test_wrapper_prefixes_and_all_tied_names_are_accepted(tmp_path):
    """A DDP/compiled save_state (keys under 'module.'), holding every tied name, still loads."""
    source = tiny_model(seed=2)
    state = {f"module.{k}": v.clone() for k, v in source.state_dict().items()}
    save_file(state, tmp_path / "wrapped.safetensors")
    model = average_into_model(tiny_model(seed=3), [tmp_path / "wrapped.safetensors"])
    assert model.lm_head.weight is model.model.shared.weight
    assert torch.equal(model.lm_head.weight, source.lm_head.weight)

    state["module.lm_head.weight"] = state["module.lm_head.weight"] + 1
    save_file(state, tmp_path / "untied.safetensors")
    with pytest.raises(ValueError, match=r"tied weights .* different values"):
        average_into_model(tiny_model(seed=3), [tmp_path / "untied.safetensors"])


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------
def test_empty_list():
    with pytest.raises(ValueError, match="at least one checkpoint"):
        average_checkpoints([])


def test_missing_folder_and_file(tmp_path):
    with pytest.raises(ValueError, match=r"nope.*does not exist.*model\.safetensors"):
        average_checkpoints([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "optimizer.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"empty has no model\.safetensors.*optimizer\.bin"):
        average_checkpoints([tmp_path / "empty"])


def test_truncated_and_foreign_files(two_checkpoints, tmp_path):
    a, _ = two_checkpoints
    data = (a / "model.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.safetensors is not a valid safetensors file"):
        average_checkpoints([a, tmp_path / "cut.safetensors"])
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights.pt")
    with pytest.raises(ValueError, match=r"weights\.pt is not a valid safetensors file"):
        average_checkpoints([tmp_path / "weights.pt"])


def test_different_keys_and_shapes(two_checkpoints, tmp_path):
    a, _ = two_checkpoints
    other = _save(tiny_model(seed=0, decoder_layers=1), tmp_path / "one_layer")
    with pytest.raises(ValueError, match=r"different key sets.*only in .*a: .*decoder\.layers\.1\."):
        average_checkpoints([a, other])
    wide = _save(tiny_model(seed=0, encoder_ffn_dim=48), tmp_path / "wide")
    shapes = r"different shapes for 'model\.encoder\.layers\.0\.ffn\.fc1\.[a-z]+': \(64,?.*\) vs \(48"
    with pytest.raises(ValueError, match=shapes):
        average_checkpoints([a, wide])


def test_average_into_model_rejects_other_architecture(two_checkpoints):
    a, _ = two_checkpoints
    with pytest.raises(ValueError, match=r"missing from the checkpoint: 'model\.decoder\.layers\.2\."):
        average_into_model(tiny_model(decoder_layers=3), [a])


# ------------------------------------------------------------------------------------------------
# Saving
# ------------------------------------------------------------------------------------------------
def test_a_save_does_not_warn_about_the_tied_weights_but_other_warnings_pass(tmp_path, caplog):
    """Our model ties its embeddings and output layer on purpose (§3.4); accelerate warns about it at every
    save. Only that warning is dropped, and only during our save."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    accelerator.prepare(tiny_model())
    logger = logging.getLogger("accelerate.utils.other")
    with caplog.at_level(logging.WARNING):
        accelerator.save_state(str(tmp_path / "plain"))
    assert TIED_WEIGHTS_WARNING in caplog.text  # what accelerate says without the filter: the test can fail
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for step in (1, 2, 3):
            save_checkpoint(accelerator, tmp_path / "checkpoints", {"step": step}, keep=2)
        with tied_weights_warning_silenced():
            logger.warning("another warning from accelerate")
        logger.warning(f"{TIED_WEIGHTS_WARNING} {{'lm_head.weight'}} while saving, outside our saves")
    outside = f"{TIED_WEIGHTS_WARNING} {{'lm_head.weight'}} while saving, outside our saves"
    assert caplog.messages == ["another warning from accelerate", outside]
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["checkpoint-2", "checkpoint-3"]
    assert json.loads((tmp_path / "checkpoints" / "checkpoint-3" / "trainer_state.json").read_text()) == {"step": 3}


def test_only_complete_checkpoints_are_listed_in_step_order(tmp_path):
    for name in ("checkpoint-10", "checkpoint-9", "checkpoint-11", ".tmp-checkpoint-12", ".tmp-deleting-checkpoint-8"):
        (tmp_path / name).mkdir()
    for name in ("checkpoint-10", "checkpoint-9", ".tmp-checkpoint-12"):
        write_json_atomically(tmp_path / name / "trainer_state.json", {"step": 0})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-9", "checkpoint-10"]  # 11 has no state
    assert [p.name for p in incomplete_checkpoints(tmp_path)] == [".tmp-checkpoint-12", ".tmp-deleting-checkpoint-8"]
    assert list_checkpoints(tmp_path / "nowhere") == [] == incomplete_checkpoints(tmp_path / "nowhere")


def test_a_folder_is_replaced_whole_or_not_at_all(tmp_path):
    def writer(name: str, fail: bool = False):
        def write(tmp):
            tmp.mkdir()
            (tmp / name).write_text("written")
            if fail:
                raise RuntimeError("stopped half-way")

        return write

    folder = tmp_path / "final"
    save_folder_atomically(folder, writer("old.txt"))
    with pytest.raises(RuntimeError):
        save_folder_atomically(folder, writer("new.txt", fail=True))
    assert [p.name for p in folder.iterdir()] == ["old.txt"]  # the old folder is intact
    save_folder_atomically(folder, writer("new.txt"))
    assert [p.name for p in folder.iterdir()] == ["new.txt"]
