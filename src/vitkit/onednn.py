"""The CPU linear kernels behind `layers.mlp.Linear` and `layers.mlp.Mlp`'s fast paths: oneDNN's fp32 matmul,
forward and backward; weights packed once for the kernel that multiplies by them (inference); fc1 with its GELU in
one matmul (inference). Each is switched per machine by vitkit.hardware, which also times it. Kept below both, so
the measurement times the very functions the layers run."""
from __future__ import annotations

import threading

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# oneDNN's bf16 matmuls, which need AVX512BW/VL/DQ or AVX-NE-CONVERT (false under ONEDNN_MAX_CPU_ISA=AVX2)
BF16 = AVAILABLE and torch.ops.mkldnn._is_mkldnn_bf16_supported()
# MKL's packed sgemm (what inductor's freezing runs for fp32 linears): the weight laid out once for MKL
MKL_PACKED = torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def mm_t(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b.T (+ bias) by oneDNN; a [..., K], b [N, K]."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


def linear_gelu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
                approximate: str = "none") -> torch.Tensor:
    """GELU(a @ b.T + bias) in one oneDNN matmul, the GELU applied in its epilogue (no separate pass over the
    [..., N] output); a [..., K], b [N, K] (or `pack`ed for "onednn"); approximate: "none" (erf) or "tanh", as
    F.gelu. Inference only: the op has no backward."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "gelu", [], approximate)


def pack(weight: torch.Tensor, rows: int, kernel: str) -> torch.Tensor:
    """weight [N, K] laid out for `kernel` multiplying inputs of `rows` rows: "mkl" (MKL's packed sgemm, fp32) or
    "onednn" (oneDNN's blocked layout, any dtype it runs)."""
    if kernel == "mkl":
        return torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  kernel: str) -> torch.Tensor:
    """x @ weight.T + bias, x [..., K], with `packed` = pack(weight, rows of x, kernel) (in x's dtype); bias in x's
    dtype. MKL runs its packed form only for the row count it was packed for (else the plain sgemm)."""
    if kernel == "mkl":
        rows = x.numel() // x.shape[-1]
        out = torch.ops.mkl._mkl_linear(x.reshape(rows, x.shape[-1]), packed, weight, bias, rows)  # [rows, N]
        return out.reshape(*x.shape[:-1], out.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class WidenedLinear(torch.autograd.Function):
    """F.linear as bf16 autocast asks for it (bf16 operands, fp32 accumulation, a bf16 output) where oneDNN has no
    bf16 matmul and bf16 is emulated: x and the weight rounded to bf16, widened to fp32 (exact) and multiplied
    there, forward and both gradients. The gradients come back in the inputs' dtypes; the weight's is accumulated in
    fp32 and not rounded to bf16 first, as autocast's would be."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x16, w16 = x.to(torch.bfloat16), weight.to(torch.bfloat16)
        ctx.save_for_backward(x16, w16)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        b = None if bias is None else bias.to(torch.bfloat16).float()
        with torch.autocast("cpu", enabled=False):
            return torch.nn.functional.linear(x16.float(), w16.float(), b).to(torch.bfloat16)  # [..., out]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x16, w16 = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        with torch.autocast("cpu", enabled=False):
            g = grad.to(torch.bfloat16).float()  # [..., out]: the bf16 gradient a bf16 matmul's backward reads
            g2d = g.reshape(-1, g.shape[-1])  # [M, out]
            grad_x = (g @ w16.float()).to(x_dtype) if need_x else None  # [..., in]
            grad_w = (g2d.t() @ x16.reshape(-1, x16.shape[-1]).float()).to(w_dtype) if need_w else None  # [out, in]
            grad_b = g2d.sum(0).to(b_dtype) if need_b else None
        return grad_x, grad_w, grad_b


# Packs follow each weight's version counter, but torch's fused optimizers (AdamW(fused=True), as vitkit trains)
# change weights without bumping it: the evaluation after such a step read the packs of the epoch before (a resumed
# detection run scored differently from an uninterrupted one). So every optimizer step in this process also starts
# a new generation of packs.
_STEPS = [0]


def _count_step(optimizer, args, kwargs) -> None:
    _STEPS[0] += 1


register_optimizer_step_post_hook(_count_step)


class PackCache:
    """One linear weight's packs (`pack`), per (kernel, rows, dtype, compute dtype), for the weight's current values,
    each with the weight as the kernel reads it (MKL's fallback for other row counts needs it): a new tensor, an
    in-place change (its version counter) or any optimizer step in the process empties it. Keeps the `keep` most
    recently used, so a model run at one batch size (and its last, smaller batch) packs once and holds at most
    `keep` extra copies of its weights.
    A copy or pickle of the module holding it starts empty: packs are derived from the weight. A lock keeps it
    whole where threads share a model (a server's workers)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self.stamp: tuple[int, int, int] | None = None
        self.packs: dict[tuple, torch.Tensor] = {}
        self.lock = threading.Lock()

    def get(self, weight: torch.Tensor, rows: int, dtype: torch.dtype, compute: torch.dtype,
            kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed, plain): the weight rounded to `dtype`, then held in `compute` (wider where `dtype`'s kernel is
        missing: exact), packed for `kernel` and `rows`; and that weight unpacked."""
        stamp, key = (weight.data_ptr(), weight._version, _STEPS[0]), (kernel, rows, dtype, compute)
        with self.lock:
            if stamp != self.stamp:
                self.packs.clear()
                self.stamp = stamp
            packed = self.packs.pop(key, None)
            if packed is None:
                plain = weight.detach().to(dtype).to(compute)  # [N, K]
                packed = pack(plain, rows, kernel), plain
            self.packs[key] = packed  # the most recently used last
            while len(self.packs) > self.keep:
                del self.packs[next(iter(self.packs))]
            return packed

    def __deepcopy__(self, memo) -> PackCache:
        return PackCache(self.keep)

    def __reduce__(self):
        return PackCache, (self.keep,)


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
