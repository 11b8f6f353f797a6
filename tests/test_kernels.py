"""The CPU fast paths of kernels_vanilla_transformer.py, each against the plain torch expression it equals."""

import math

import pytest
import torch
import torch.nn.functional as F

import vanilla_transformer.kernels_vanilla_transformer as kernels
from vanilla_transformer.kernels_vanilla_transformer import (
    apply_dropout,
    cpu_keep_mask,
    dropout_add,
    linear_cross_entropy_sums,
)


# ------------------------------------------------------------------ dropout (§5.4)
@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_cpu_keep_mask_has_dropouts_keep_rate_scale_and_independence(p):
    torch.manual_seed(0)
    n = 1 << 20
    mask = cpu_keep_mask(torch.Size([n]), p, torch.float32).double()
    kept = mask > 0
    scale = mask[kept].unique()
    assert len(scale) == 1 and scale.item() == pytest.approx(1 / (1 - p), rel=2e-5)  # one value: 1/(1-p)
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(kept.double().mean().item() - (1 - p)) < 5 * sigma  # keep rate 1-p
    assert abs(mask.mean().item() - 1) < 5 * sigma / (1 - p)  # expectation unchanged
    # neighbours come from the same 64-bit draw (4 per draw): their decisions must be independent
    for lag in (1, 2, 3, 4):
        both = (kept[:-lag] & kept[lag:]).double().mean().item()
        assert abs(both - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / n)
    by_position = kept.view(-1, 4).double().mean(0)  # each of the four 16-bit chunks of a draw
    assert torch.all((by_position - (1 - p)).abs() < 5 * sigma * 2)


def test_dropout_equals_dropouts_rule():
    """F.dropout's contract: zeros, the rest scaled by 1/(1-p), gradients through kept elements; off in eval."""
    x = torch.randn(4, 7, 32, requires_grad=True)
    dropped = apply_dropout(x, 0.3, training=True)
    kept = dropped != 0
    assert 0.5 < kept.float().mean() < 0.9 and torch.allclose(dropped[kept], x[kept] / 0.7, rtol=1e-4)
    (grad,) = torch.autograd.grad(dropped.sum(), x)
    assert torch.allclose(grad, kept / 0.7, rtol=1e-4)
    assert apply_dropout(x.detach().bfloat16(), 0.1, training=True).dtype == torch.bfloat16
    assert apply_dropout(x, 0.3, training=False) is x and apply_dropout(x, 0.0, training=True) is x


def test_dropout_add_equals_adding_the_dropped_output():
    x, residual = torch.randn(4, 7, 32, requires_grad=True), torch.randn(4, 7, 32)
    torch.manual_seed(3)
    summed = dropout_add(residual, x, 0.3, training=True)
    torch.manual_seed(3)
    dropped = apply_dropout(x, 0.3, training=True)  # the same random draws
    assert torch.allclose(summed, residual + dropped, atol=1e-6)
    kept = dropped != 0
    (grad,) = torch.autograd.grad(summed.sum(), x)
    assert torch.allclose(grad, kept / 0.7, rtol=1e-4)  # the gradient goes through the kept elements only
    # dtypes as for `residual + dropout(x)`: a bf16 sub-layer output added to a float32 stream
    assert dropout_add(residual, x.detach().bfloat16(), 0.1, training=True).dtype == torch.float32
    assert dropout_add(residual, x, 0.3, training=False).equal(x + residual)


# ------------------------------------------------------------------ label-smoothed cross-entropy (§5.4)
@pytest.mark.parametrize("compact", [True, False], ids=["ignored-rows-dropped", "ignored-rows-zeroed"])
@pytest.mark.parametrize("block_columns", [7, 32, 61, 256])
def test_linear_cross_entropy_in_vocabulary_blocks_equals_cross_entropy(block_columns, compact, monkeypatch):
    """Any block size (uneven last block, one block, a block wider than the vocabulary) gives
    F.cross_entropy's sums and gradients, ignored labels included, gold ids in every block; whether the
    ignored rows are dropped first (on CPUs) or computed and zeroed (on GPUs, where dropping them would wait)."""
    monkeypatch.setattr(kernels, "COMPACT_ROWS_ON", ("cpu",) if compact else ())
    torch.manual_seed(0)
    hidden, weight = torch.randn(12, 16, requires_grad=True), torch.randn(61, 16, requires_grad=True)
    targets = torch.tensor([0, 6, 7, 13, 31, 32, 60, -100, 45, 59, -100, 1])
    smoothed, nll = linear_cross_entropy_sums(hidden * 3, weight, targets, 0.1, block_columns=block_columns)
    smoothed.backward()
    mine = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    logits = (hidden * 3) @ weight.T
    expected = F.cross_entropy(logits, targets, label_smoothing=0.1, reduction="sum")
    expected.backward()
    assert smoothed.item() == pytest.approx(expected.item(), rel=1e-5)
    assert nll.item() == pytest.approx(F.cross_entropy(logits, targets, reduction="sum").item(), rel=1e-5)
    assert torch.allclose(mine[0], hidden.grad, atol=1e-5) and torch.allclose(mine[1], weight.grad, atol=1e-5)
    assert mine[0][targets == -100].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_cross_entropy_with_a_workspace_is_bit_identical_and_reuses_it(monkeypatch, dtype):
    """Logits kept between the two passes (in a workspace) give the very sums and gradients of
    computing them twice, under bf16 autocast too; the workspace is reused, and unused past its limit."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(12, 16, requires_grad=True), torch.randn(61, 16, requires_grad=True)
    targets = torch.tensor([0, 6, 7, 13, 31, 32, 60, -100, 45, 59, -100, 1])

    def run(workspace):
        hidden.grad = weight.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            smoothed, nll = kernels.linear_cross_entropy_sums(
                hidden * 3, weight, targets, 0.1, block_columns=16, workspace=workspace
            )
        smoothed.backward()
        return smoothed.detach(), nll, hidden.grad.clone(), weight.grad.clone()

    workspace = {}
    plain, kept = run(None), run(workspace)
    assert all(torch.equal(a, b) for a, b in zip(plain, kept))
    buffer = workspace["logits"]
    assert buffer.dtype == dtype and buffer.numel() == 10 * 61  # the 10 counted tokens' logits
    assert all(torch.equal(a, b) for a, b in zip(plain, run(workspace))) and workspace["logits"] is buffer  # reused
    monkeypatch.setattr(kernels, "LOSS_WORKSPACE_BYTES", 10 * 61 * buffer.itemsize - 1)
    small = {}
    assert all(torch.equal(a, b) for a, b in zip(plain, run(small))) and not small  # over the limit: not used


def test_linear_cross_entropy_does_its_gradient_work_in_backward_only():
    """The forward pass is one matmul per block of columns whether or not the loss will be backpropagated; the
    gradient matmuls run in backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMatmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm)
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    hidden, weight = torch.randn(12, 16, requires_grad=True), torch.randn(61, 16, requires_grad=True)
    targets = torch.randint(0, 61, (12,))
    blocks = 4  # 61 columns in blocks of 16
    with CountMatmuls() as forward:
        smoothed, _ = kernels.linear_cross_entropy_sums(hidden, weight, targets, 0.1, block_columns=16)
    with torch.no_grad(), CountMatmuls() as untracked:
        kernels.linear_cross_entropy_sums(hidden, weight, targets, 0.1, block_columns=16)
    with CountMatmuls() as backward:
        smoothed.backward()
    assert forward.count == untracked.count == blocks
    assert backward.count == 3 * blocks  # the logits again, then grad_hidden and grad_weight per block


def test_a_workspace_taken_over_by_a_later_forward_pass_is_not_read_by_an_earlier_backward():
    """Two forward passes sharing one workspace, then the first one's backward: it computes its logits again
    instead of reading the second pass's, and its gradients are those of a run without a workspace."""
    torch.manual_seed(0)
    weight = torch.randn(61, 16, requires_grad=True)
    first, second = torch.randn(10, 16, requires_grad=True), torch.randn(10, 16, requires_grad=True)
    targets = torch.randint(0, 61, (10,))
    plain, _ = kernels.linear_cross_entropy_sums(first, weight, targets, 0.1, block_columns=16)
    plain.backward()
    expected = first.grad.clone(), weight.grad.clone()
    first.grad = weight.grad = None
    workspace = {}
    loss_1, _ = kernels.linear_cross_entropy_sums(first, weight, targets, 0.1, block_columns=16, workspace=workspace)
    kernels.linear_cross_entropy_sums(second, weight, targets, 0.1, block_columns=16, workspace=workspace)
    loss_1.backward()
    assert torch.equal(first.grad, expected[0]) and torch.equal(weight.grad, expected[1])
