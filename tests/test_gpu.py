"""Checks that need a GPU, marked ``gpu``; ``scripts/gpu_check.sh`` runs them on CUDA.

Elsewhere they are skipped, except under ``scripts/gpu_check.sh --dry-run`` (``VANILLA_TRANSFORMER_GPU_CHECK=cpu``),
which runs them on the CPU at tiny sizes so that they cannot rot; ``tests/test_benchmarks.py`` runs that dry run.
"""

import os

import pytest
import torch
from conftest import random_ids, tiny_config
from test_training import CountReadsBack, tiny_run

from vanilla_transformer import VanillaTransformerForConditionalGeneration

DRY_RUN = os.environ.get("VANILLA_TRANSFORMER_GPU_CHECK") == "cpu"
DEVICE = torch.device("cpu" if DRY_RUN else "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not DRY_RUN and not torch.cuda.is_available(), reason="needs a CUDA GPU (or VANILLA_TRANSFORMER_GPU_CHECK=cpu)"
    ),
]


def _model(attention: str, seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    """A tiny model with head size 32 (flex attention's CPU kernel needs at least 32), same weights for a seed."""
    torch.manual_seed(seed)
    config = tiny_config(d_model=128, encoder_ffn_dim=256, decoder_ffn_dim=256, **overrides)
    model = VanillaTransformerForConditionalGeneration(config)
    model.set_attn_implementation(attention)
    return model.to(DEVICE)


def _padded_batch():
    source, labels = random_ids(3, 9).to(DEVICE), random_ids(3, 7, seed=1).to(DEVICE)
    mask = torch.ones_like(source)
    mask[1, 6:], mask[2, 4:] = 0, 0
    labels[2, 5:] = -100
    return {"input_ids": source, "attention_mask": mask, "labels": labels}


def _loss_and_gradients(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    return out.logits.detach().float(), {
        n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None
    }


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("attention", ["sdpa", "flex_attention", "sdpa-flash"])
def test_each_attention_gives_eager_outputs_and_gradients(attention):
    """fp32 sdpa and flex attention on a padded batch; sdpa in bf16 with only the flash kernel allowed on an
    unpadded one (flash takes no mask), against eager in fp32."""
    if attention == "flex_attention" and DRY_RUN:
        pytest.skip("compiling flex attention takes minutes on a CPU; tests/test_modeling.py checks its CPU outputs")
    batch = _padded_batch()
    if attention == "sdpa-flash":
        del batch["attention_mask"]
        batch["labels"][2, 5:] = 7
    expected_logits, expected_grads = _loss_and_gradients(_model("eager").train(), batch)
    model = _model("sdpa" if attention == "sdpa-flash" else attention).train()
    if attention == "sdpa-flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = (
            [SDPBackend.FLASH_ATTENTION] if DEVICE.type == "cuda" else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
        )
        with sdpa_kernel(backend), torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            logits, grads = _loss_and_gradients(model, batch)
        # bf16 against fp32: logits within 5e-2 (0.005 measured). Gradients as one vector, within 0.1 of its norm:
        # bf16 rounding flips some ReLU gates of the FFN, which moves single entries by up to 0.12 of the largest
        # one (AVX2 CPU, seed 0), while the whole vector stays within 0.025-0.058 of its norm (seeds 0-3)
        tolerance, gradient_tolerance = 5e-2, 1e-1
        assert grads.keys() == expected_grads.keys()
        got, expected = (
            torch.cat([g[name].flatten() for name in sorted(expected_grads)]) for g in (grads, expected_grads)
        )
        assert float((got - expected).norm() / expected.norm()) < gradient_tolerance
        assert _relative(logits, expected_logits) < tolerance
        return
    logits, grads = _loss_and_gradients(model, batch)
    assert _relative(logits, expected_logits) < 1e-4
    assert grads.keys() == expected_grads.keys()
    # against the largest gradient: some are zero but for rounding (the keys' biases shift every score equally)
    scale = max(g.abs().max() for g in expected_grads.values())
    worst = max(float((grads[name] - expected_grads[name]).abs().max() / scale) for name in grads)
    assert worst < 1e-4, worst


def test_a_bf16_autocast_step_follows_the_fp32_step():
    batch = _padded_batch()
    fp32, bf16 = _model("sdpa").train(), _model("sdpa").train()
    loss32 = fp32(**batch, smoothing=0.1, skip_logits=True).loss
    loss32.backward()
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        loss16 = bf16(**batch, smoothing=0.1, skip_logits=True).loss
    loss16.backward()
    assert abs(loss16.item() - loss32.item()) / loss32.item() < 1e-2
    a = torch.cat([p.grad.flatten() for p in fp32.parameters()])
    b = torch.cat([p.grad.flatten() for p in bf16.parameters()])
    assert torch.nn.functional.cosine_similarity(a, b, dim=0).item() > 0.99


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_gives_the_tokens_it_gives_on_the_cpu(num_beams):
    batch = _padded_batch()
    model = _model("sdpa").eval()
    on_cpu = model.to("cpu").generate(
        batch["input_ids"].cpu(), attention_mask=batch["attention_mask"].cpu(), num_beams=num_beams, max_new_tokens=12
    )
    here = model.to(DEVICE).generate(
        batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=num_beams, max_new_tokens=12
    )
    assert torch.equal(here.cpu(), on_cpu)


class NoReadsBack:
    """Within ``with``, a value read back from the device fails: on CUDA through ``torch.cuda.set_sync_debug_mode
    ("error")``, on the CPU (dry run) by counting reads. ``active`` turns it on and off."""

    def __init__(self):
        self.counter, self.reads = CountReadsBack(), 0

    def on(self):
        if DEVICE.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        self.start = self.counter.per_step[-1]

    def off(self):
        if DEVICE.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
        self.reads += self.counter.per_step[-1] - self.start


def test_no_decoding_step_waits_for_the_device():
    batch = _padded_batch()
    model, guard = _model("sdpa").eval(), NoReadsBack()
    model.register_forward_pre_hook(lambda module, args: guard.on())
    model.register_forward_hook(lambda module, args, output: guard.off())
    with guard.counter.mode:
        for num_beams in (1, 4):
            model.generate(
                batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=num_beams, max_new_tokens=10
            )
    assert guard.reads == 0


def test_no_training_step_waits_for_the_device_between_logging_steps(corpus, tmp_path, monkeypatch):
    """The steps that neither log, evaluate nor save run with device reads forbidden."""
    from vanilla_transformer import kernels_vanilla_transformer, training

    monkeypatch.setattr(kernels_vanilla_transformer, "COMPACT_ROWS_ON", ())  # the GPU's path, also in the dry run
    guard, real, step = NoReadsBack(), training.test_delay, [0]

    def at(point, rank):
        if point == "step":
            if step[0] and step[0] % 4:  # the previous step's logging/saving is over
                guard.off()
            step[0] += 1
            if step[0] % 4:  # a step that neither logs nor saves (every 4)
                guard.on()
        real(point, rank)

    monkeypatch.setattr(training, "test_delay", at)
    with guard.counter.mode:
        training.train(
            tiny_run(
                corpus,
                tmp_path / "run",
                max_steps=8,
                logging_steps=4,
                eval_steps=4,
                save_steps=4,
                test_split=None,
                use_cpu=DEVICE.type == "cpu",
                mixed_precision="bf16" if DEVICE.type == "cuda" else "no",
            )
        )
    assert step[0] == 8 and guard.reads == 0
