"""The paper's optimizer and learning rate (§5.3).

    Adam(β1 0.9, β2 0.98, ε 1e-9)
    lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)

transformers' ``inverse_sqrt`` schedule multiplies a learning rate ``lr`` by ``step / W`` while
``step < W`` and by ``sqrt(W / step)`` afterwards, i.e. it is ``lr · min(step / W, sqrt(W / step))``:
the paper's formula exactly when ``lr`` is its peak, ``d_model^-0.5 · W^-0.5``
(:func:`peak_learning_rate`). The training loop and the ``Seq2SeqTrainer`` set-up (``finetuning``)
both use it that way. The scheduler counts from 0, so update k uses the paper's lrate(k - 1), and
the first update has learning rate 0.
"""

import torch
from transformers.optimization import get_inverse_sqrt_schedule

__all__ = ["make_optimizer_and_schedule", "noam_learning_rate", "peak_learning_rate"]

FUSED_ADAM_DEVICES = ("cpu", "cuda")  # where torch has a fused Adam kernel (also mps and xpu, untested here)


def noam_learning_rate(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """The paper's learning rate at ``step`` (§5.3, equation 3), times ``factor``; 0 at step 0."""
    if step == 0:
        return 0.0
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def peak_learning_rate(d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """The schedule's peak, at ``step = warmup_steps``: the ``learning_rate`` that makes ``inverse_sqrt`` the paper's.

    It is ``factor · d_model^-0.5 · warmup_steps^-0.5``: 6.99e-4 for the base model with 4000 warm-up steps.

    Raises:
        ValueError: ``warmup_steps`` is below 1.
    """
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be a positive integer, got {warmup_steps!r}.")
    return noam_learning_rate(warmup_steps, d_model, warmup_steps, factor)


def make_optimizer_and_schedule(
    model: torch.nn.Module,
    d_model: int,
    warmup_steps: int = 4000,
    lr_factor: float = 1.0,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam over ``model``'s parameters and transformers' ``inverse_sqrt`` schedule at the paper's peak.

    Args:
        model: the parameters to train.
        d_model: the model's width, which sets the learning rate.
        warmup_steps: W of §5.3 (the paper: 4000).
        lr_factor: multiplies the whole schedule (1 = the paper).
        betas, eps: Adam's settings (the paper's by default).
    """
    parameters = list(model.parameters())
    # torch's fused Adam: one pass over each parameter and its two moments, where the default `foreach`
    # path makes about a dozen; the same update (docs/performance-log.md). transformers' Trainer defaults to it too.
    fused = bool(parameters) and all(p.device.type in FUSED_ADAM_DEVICES for p in parameters)
    peak = peak_learning_rate(d_model, warmup_steps, lr_factor)
    optimizer = torch.optim.Adam(parameters, lr=peak, betas=betas, eps=eps, fused=fused or None)
    return optimizer, get_inverse_sqrt_schedule(optimizer, num_warmup_steps=warmup_steps)
