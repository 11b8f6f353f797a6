"""The paper's optimizer and learning rate (§5.3): the formula, its peak, and the scheduler that follows it."""

import copy

import pytest
import torch

from vanilla_transformer.schedule import make_optimizer_and_schedule, noam_learning_rate, peak_learning_rate


def test_the_formula_warms_up_linearly_then_decays_with_the_inverse_square_root():
    assert noam_learning_rate(0, 512, 4000) == 0.0
    assert noam_learning_rate(2000, 512, 4000) == pytest.approx(noam_learning_rate(4000, 512, 4000) / 2, rel=1e-12)
    assert noam_learning_rate(16000, 512, 4000) == pytest.approx(noam_learning_rate(4000, 512, 4000) / 2, rel=1e-12)
    assert noam_learning_rate(100, 512, 4000, factor=0.5) == pytest.approx(noam_learning_rate(100, 512, 4000) / 2)


def test_the_peak_is_the_formula_at_the_end_of_the_warm_up():
    assert peak_learning_rate(512, 4000) == pytest.approx(6.987712e-4, rel=1e-6)  # the base model
    assert peak_learning_rate(512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-15)
    assert peak_learning_rate(256, 300, factor=0.3) == noam_learning_rate(300, 256, 300, factor=0.3)
    with pytest.raises(ValueError, match="warmup_steps must be a positive integer"):
        peak_learning_rate(512, 0)


def test_transformers_inverse_sqrt_schedule_equals_the_papers_formula():
    model = torch.nn.Linear(2, 2)
    optimizer, schedule = make_optimizer_and_schedule(model, d_model=512, warmup_steps=4000)
    worst = 0.0
    for step in range(20000):  # the scheduler's counter before update step+1
        expected = noam_learning_rate(step, 512, 4000)
        worst = max(worst, abs(schedule.get_last_lr()[0] - expected))
        optimizer.step()
        schedule.step()
    assert worst < 1e-12


def test_optimizer_is_the_papers_adam_through_torchs_fused_kernel():
    """§5.3's Adam (β1 0.9, β2 0.98, ε 1e-9), through the fused kernel on CPU: three updates equal
    those of torch's default (foreach) Adam with the same settings."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4))
    reference, initial = copy.deepcopy(model), copy.deepcopy(model)
    optimizer, schedule = make_optimizer_and_schedule(model, d_model=512, warmup_steps=2)
    assert (
        optimizer.defaults["fused"] and optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    )
    plain = torch.optim.Adam(
        reference.parameters(), lr=optimizer.param_groups[0]["lr"], betas=(0.9, 0.98), eps=1e-9, foreach=True
    )
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p, q in zip(model.parameters(), reference.parameters()):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        optimizer.step()
        plain.step()
        schedule.step()
        plain.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"]
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert not torch.equal(model[0].weight, initial[0].weight)  # the updates did move the weights


def test_the_optimizer_takes_other_settings():
    optimizer, schedule = make_optimizer_and_schedule(
        torch.nn.Linear(2, 2), 256, warmup_steps=10, lr_factor=0.5, betas=(0.8, 0.9), eps=1e-6
    )
    assert (optimizer.defaults["betas"], optimizer.defaults["eps"]) == ((0.8, 0.9), 1e-6)
    for _ in range(10):
        optimizer.step()
        schedule.step()
    assert schedule.get_last_lr()[0] == pytest.approx(peak_learning_rate(256, 10, 0.5), rel=1e-12)
