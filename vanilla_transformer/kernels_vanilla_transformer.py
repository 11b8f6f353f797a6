"""CPU fast paths for the model's training step, beside the paper's model file.

Each function here equals a plain torch expression, named in its docstring with the test that proves
it; the model file calls them where the paper applies the plain expression:

* ``apply_dropout`` / ``dropout_add``: ``F.dropout(x)`` and ``residual + F.dropout(x)`` (§5.4). On a CPU the
  mask comes from ``cpu_keep_mask``, cheaper than torch's own random numbers; elsewhere it is ``F.dropout``.
* ``linear_cross_entropy_sums``: ``F.cross_entropy(hidden @ weight.T, labels, label_smoothing=ε)``
  (§5.4) summed, computed a block of vocabulary columns at a time, never holding the full logits.

Like the model file, this file travels to the Hub with every checkpoint (``trust_remote_code=True``):
it imports only torch and the standard library. What each fast path saves, and what was tried and
did not pay, is told in the project's ``docs/performance-log.md``.
"""

import math

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------------------------
# Dropout (§5.4)
# --------------------------------------------------------------------------------------------
def apply_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p, training)``: zero each element with probability p, scale the rest by 1/(1-p).

    On CPUs the mask comes from ``cpu_keep_mask`` and is applied in one product.
    Tested by ``tests/test_kernels.py::test_dropout_equals_dropouts_rule``.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p=p, training=True)
    return x * cpu_keep_mask(x.shape, p, x.dtype)


def dropout_add(residual: torch.Tensor, x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``residual + F.dropout(x, p, training)``, the residual connection of §3.1 with §5.4's dropout.

    On CPUs: ``torch.addcmul(residual, x, mask)``, one pass. The result has the dtype of the plain sum
    (a bf16 sub-layer output added to a float32 stream stays float32).
    Tested by ``tests/test_kernels.py::test_dropout_add_equals_adding_the_dropped_output``.
    """
    if not training or p == 0.0:
        return residual + x
    if x.device.type != "cpu":
        return residual + F.dropout(x, p=p, training=True)
    mask = cpu_keep_mask(x.shape, p, torch.promote_types(x.dtype, residual.dtype))
    return torch.addcmul(residual, x, mask)


def cpu_keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """Dropout's multiplier: 0 with probability p, else 1/(1-p), in ``dtype``, on the CPU.

    Each draw of 64 random bits (``random_`` over the whole int64 range) gives four uniform 16-bit
    integers, one per element, where ``torch.rand`` spends one draw per element. An element is dropped
    when its integer is among the lowest ``round(p · 65536)`` of the 65,536 values, so p is used to
    within 2⁻¹⁷, and kept elements are scaled by the exact inverse of the keep rate, so every element's
    expectation is unchanged. Tested (keep rate, scale, expectation, independence of the four chunks
    of a draw) by ``tests/test_kernels.py::test_cpu_keep_mask_has_dropouts_keep_rate_scale_and_independence``.
    """
    dropped = round(p * 65536)
    numel = math.prod(shape)
    bits = torch.empty((numel + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # full 64-bit range
    mask = torch.empty(shape, dtype=dtype)
    torch.ge(bits.view(torch.int16)[:numel].view(shape), dropped - 32768, out=mask)  # 1 or 0; int16: -32768 … 32767
    return mask.mul_(65536 / (65536 - dropped))


# --------------------------------------------------------------------------------------------
# Label-smoothed cross-entropy (§5.4) fused with the pre-softmax linear layer (§3.4)
# --------------------------------------------------------------------------------------------
#: The most logits (in bytes) the loss keeps between its forward and backward passes, in a workspace its caller
#: owns (the training loop keeps one from step to step); above it, the backward pass computes them again.
LOSS_WORKSPACE_BYTES = 256 << 20

#: Devices where the loss drops the rows of ignored labels (-100) before its matmuls. Elsewhere (GPUs) it keeps
#: them and zeroes their share: counting them would read a value back from the device at every step.
COMPACT_ROWS_ON = ("cpu",)


class LinearCrossEntropySums(torch.autograd.Function):
    """Sums of the label-smoothed cross-entropy and of the plain NLL of ``hidden @ weight.T``, computed
    a block of vocabulary columns at a time, so that the [tokens, vocab] logits never exist in full.

    With smoothing ε over a vocabulary of V, per target token with gold id y:
    ``smoothed = lse(z) - (1-ε)·z_y - ε·mean(z)`` and ``nll = lse(z) - z_y``, exactly
    ``F.cross_entropy(z, y, label_smoothing=ε)``; its gradient is ``softmax(z) - (1-ε)·onehot(y) - ε/V``.

    The forward pass goes once over the column blocks and gathers each row's log-sum-exp (online, as flash
    attention does), gold logit and sum of logits. The backward pass, run only when the loss is backpropagated,
    computes each block's logits again, turns them into gradients and applies them at once:
    ``grad_hidden += g @ w[cols]`` and ``grad_weight[cols] = g.T @ hidden``. Blocks are columns, not rows, so
    that no block adds a whole [vocab, d] product into ``grad_weight`` (Liger-Kernel's fused linear
    cross-entropy, Triton and GPU-only, splits by rows). Given a ``workspace`` (a dict its caller keeps) in which
    all the logits fit, the forward pass keeps them there and the backward pass reads them back instead of
    repeating the matmul. Under autocast the matmuls run in the autocast dtype and the softmax in float32, as
    autocast does for ``lm_head`` + ``cross_entropy``. Rows whose label is -100 count for nothing.

    Tested against ``F.cross_entropy`` (sums and gradients, any block size, fp32 and bf16, with and
    without the workspace) in ``tests/test_kernels.py``.
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, epsilon: float, block_columns: int, tracked: bool, workspace: dict | None):
        device_type, device = hidden.device.type, hidden.device
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
        exact = torch.promote_types(dtype, torch.float32)  # softmax and sums: float32 at least
        backpropagated = tracked and any(ctx.needs_input_grad[:2])  # tracked: grad mode was on at the call
        keep = labels != -100
        # Dropping the ignored rows needs their number: free on a CPU, a wait for the device elsewhere; there they
        # are computed and then zeroed.
        compact = device_type in COMPACT_ROWS_ON
        with torch.autocast(device_type, enabled=False):
            w = weight.to(dtype)
            if compact:
                h, y, weights = hidden[keep].to(dtype), labels[keep], None
            else:
                h, y, weights = hidden.to(dtype), labels, keep.to(exact)
            rows, vocab = h.shape[0], weight.shape[0]
            blocks = _column_blocks(vocab, block_columns)
            buffers = _BlockBuffers(rows, blocks[0].stop, dtype, exact, device)

            # The workspace holds all the logits when they fit in LOSS_WORKSPACE_BYTES, for the backward pass; its
            # memory is reused at every step (on a CPU a fresh multi-megabyte tensor is fresh memory from the
            # operating system, whose page faults cost as much as the arithmetic).
            kept = None
            if workspace is not None and backpropagated and rows * vocab * dtype.itemsize <= LOSS_WORKSPACE_BYTES:
                kept = workspace.get("logits")
                if kept is None or kept.numel() < rows * vocab or kept.dtype != dtype or kept.device != device:
                    kept = workspace["logits"] = torch.empty(rows * vocab, dtype=dtype, device=device)
                workspace["owner"] = owner = object()  # a later forward pass that takes the workspace over is seen
                ctx.owner = owner

            running_max = torch.full((rows,), -float("inf"), dtype=exact, device=device)
            running_sum, gold, logit_sum = (torch.zeros(rows, dtype=exact, device=device) for _ in range(3))
            for cols in blocks:
                z = buffers.logits(h, w, cols, kept, again=False)
                block_max = torch.maximum(running_max, z.amax(-1))
                exps = torch.sub(z, block_max[:, None], out=buffers.scratch[: z.numel()].view_as(z)).exp_()
                running_sum = running_sum * (running_max - block_max).exp() + exps.sum(-1)
                running_max = block_max
                inside, index = _gold_index(y, cols)
                gold += torch.where(inside, z.gather(-1, index).squeeze(-1), 0.0)
                logit_sum += z.sum(-1)
            lse = running_max + running_sum.log()
            smoothed_rows, nll_rows = lse - (1 - epsilon) * gold - epsilon * logit_sum / vocab, lse - gold
            if weights is not None:
                smoothed_rows, nll_rows = smoothed_rows * weights, nll_rows * weights
            smoothed, nll = smoothed_rows.sum().float(), nll_rows.sum().float()

        if backpropagated:
            ctx.save_for_backward(h, w, y, lse, keep, *(() if weights is None else (weights,)))
            ctx.settings = (epsilon, block_columns, dtype, exact, compact, hidden.shape, hidden.dtype, weight.dtype)
            ctx.workspace, ctx.kept = workspace, kept
        ctx.mark_non_differentiable(nll)
        return smoothed, nll

    @staticmethod
    def backward(ctx, grad_smoothed, grad_nll):
        h, w, y, lse, keep, *rest = ctx.saved_tensors
        weights = rest[0] if rest else None
        epsilon, block_columns, dtype, exact, compact, hidden_shape, hidden_dtype, weight_dtype = ctx.settings
        kept = ctx.kept if ctx.kept is not None and ctx.workspace.get("owner") is ctx.owner else None
        need_hidden, need_weight = ctx.needs_input_grad[:2]
        (rows, d), vocab = h.shape, w.shape[0]
        blocks = _column_blocks(vocab, block_columns)
        with torch.autocast(h.device.type, enabled=False):
            buffers = _BlockBuffers(rows, blocks[0].stop, dtype, exact, h.device)
            scale = grad_smoothed.to(exact)
            grad_kept = torch.zeros(rows, d, dtype=exact, device=h.device) if need_hidden else None
            grad_weight = torch.empty(w.shape, dtype=exact, device=h.device) if need_weight else None
            product = torch.empty(max(rows, blocks[0].stop) * d, dtype=dtype, device=h.device)  # matmul outputs
            for cols in blocks:
                g = buffers.logits(h, w, cols, kept, again=True).sub_(lse[:, None]).exp_().sub_(epsilon / vocab)
                inside, index = _gold_index(y, cols)
                g.scatter_add_(-1, index, ((epsilon - 1) * inside).to(exact)[:, None])  # softmax - (1-ε)·onehot - ε/V
                g.mul_(scale if weights is None else weights[:, None] * scale)
                n = g.shape[1]
                g = g if buffers.high is buffers.low else buffers.low[: g.numel()].view_as(g).copy_(g)  # matmul dtype
                if need_hidden:
                    grad_kept += torch.mm(g, w[cols], out=product[: rows * d].view(rows, d))
                if need_weight:
                    grad_weight[cols] = torch.mm(g.T, h, out=product[: n * d].view(n, d))
            grad_hidden = None
            if need_hidden and compact:
                grad_hidden = torch.zeros(hidden_shape, dtype=hidden_dtype, device=h.device)
                grad_hidden[keep] = grad_kept.to(hidden_dtype)
            elif need_hidden:
                grad_hidden = grad_kept.to(hidden_dtype)
        if kept is not None:
            del ctx.workspace["owner"]  # the kept logits are spent; the memory stays for the next step
        grad_weight = grad_weight.to(weight_dtype) if grad_weight is not None else None
        return grad_hidden, grad_weight, None, None, None, None, None


def _column_blocks(vocab: int, block_columns: int) -> list[slice]:
    return [slice(start, min(start + block_columns, vocab)) for start in range(0, vocab, block_columns)]


def _gold_index(y: torch.Tensor, cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows have their gold id in this block of columns, and where (clamped for the others)."""
    return (y >= cols.start) & (y < cols.stop), (y - cols.start).clamp(0, cols.stop - cols.start - 1)[:, None]


class _BlockBuffers:
    """The buffers every block of one pass reuses: on a CPU a fresh multi-megabyte tensor is fresh memory from the
    operating system, whose page faults cost as much as the arithmetic."""

    def __init__(self, rows: int, width: int, dtype: torch.dtype, exact: torch.dtype, device: torch.device):
        self.rows = rows
        self.low = torch.empty(rows * width, dtype=dtype, device=device)  # logits as the matmul gives them
        self.high = self.low if exact == dtype else torch.empty(rows * width, dtype=exact, device=device)
        self.scratch = torch.empty(rows * width, dtype=exact, device=device)

    def logits(
        self, h: torch.Tensor, w: torch.Tensor, cols: slice, kept: torch.Tensor | None, again: bool
    ) -> torch.Tensor:
        """This block's [rows, columns] logits in the `exact` precision: computed, or read from (and on the
        first pass written to) ``kept``, the whole logits."""
        rows, n = self.rows, cols.stop - cols.start
        if kept is None:
            z = torch.mm(h, w[cols].T, out=self.low[: rows * n].view(rows, n))
        else:
            z = kept[rows * cols.start : rows * cols.stop].view(rows, n)
            if not again:
                torch.mm(h, w[cols].T, out=z)
        return z if self.high is self.low else self.high[: rows * n].view(rows, n).copy_(z)


def linear_cross_entropy_sums(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    block_columns: int | None = None,
    workspace: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(F.cross_entropy(z, labels, label_smoothing=ε, reduction="sum"), F.cross_entropy(z, labels, reduction="sum"))``
    for the logits ``z = hidden @ weight.T``, over the tokens whose label is not -100, without ``z``.

    Args:
        hidden: [..., d] last hidden states of the decoder.
        weight: [vocab, d] the pre-softmax layer's weight.
        labels: [...] gold ids, -100 where ignored.
        label_smoothing: ε of §5.4.
        block_columns: vocabulary entries per block; default about 1M logits per block, at least 256.
        workspace: a dict the caller keeps between calls, where the logits are kept from the forward to the
            backward pass when they fit in ``LOSS_WORKSPACE_BYTES`` (the training loop keeps one).

    Returns:
        The two sums; only the first carries gradients. See ``LinearCrossEntropySums``.
    """
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1).to(hidden.device)
    block_columns = block_columns or max(256, (1 << 20) // max(1, hidden.shape[0]))
    tracked = torch.is_grad_enabled()
    return LinearCrossEntropySums.apply(
        hidden, weight, labels, float(label_smoothing), block_columns, tracked, workspace
    )


__all__ = [
    "COMPACT_ROWS_ON",
    "LOSS_WORKSPACE_BYTES",
    "cpu_keep_mask",
    "apply_dropout",
    "dropout_add",
    "linear_cross_entropy_sums",
]
