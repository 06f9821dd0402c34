"""oneDNN's fp32 matmul as a linear layer's kernel, forward and backward: the fast path behind `layers.mlp.Linear`
(switched per machine by vitkit.hardware, which also times it). Kept below both, so the measurement times the
very function the layer runs."""
from __future__ import annotations

import torch

AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def mm_t(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b.T (+ bias) by oneDNN; a [..., K], b [N, K]."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


class OneDnnLinear(torch.autograd.Function):
    """F.linear(x, weight, bias) with oneDNN's matmul in the forward and in both gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return mm_t(x, weight, bias)  # [..., out]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        grad2d = grad.reshape(-1, grad.shape[-1])  # [M, out]
        grad_x = mm_t(grad, weight.t().contiguous()) if need_x else None  # [..., in]
        grad_w = mm_t(grad2d.t().contiguous(), x.reshape(-1, x.shape[-1]).t().contiguous()) if need_w else None
        return grad_x, grad_w, grad2d.sum(0) if need_b else None  # [out, in], [out]
