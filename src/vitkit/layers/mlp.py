"""The transformer MLP (D -> hidden -> D) and its activations."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from ..errors import ConfigError
from ..onednn import AVAILABLE as _ONEDNN_LINEAR
from ..onednn import BF16 as _ONEDNN_BF16
from ..onednn import MKL_PACKED, OneDnnLinear, PackCache, WidenedLinear, linear_gelu, mm_t, packed_linear


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict keys) whose fp32 CPU matmuls run in oneDNN.

    torch's fp32 F.linear goes to MKL sgemm, which takes its AVX2 path on AMD CPUs: on the project's
    EPYC it measured ~100 GFLOP/s per core against ~220 for oneDNN's matmul; ViT-Ti/S inference ran
    1.4-1.8x and small-model fp32 training steps 1.6x faster, outputs and gradients equal to 1e-6.
    Autocast, other dtypes, compiled or traced code and dispatch modes (FlopCounterMode, fake tensors)
    keep F.linear: inductor and the exporters have their own kernels, and the counters do not know it.
    `onednn` (inference) and `onednn_training` (under grad) are the switches `vitkit.hardware` sets per machine
    from what it measured there (off: timm's F.linear). `packed` (inference, no grad; `packed_linear`) runs the
    matmul on the weight packed once per input row count (`packed_weight`), fp32 by MKL's packed sgemm, bf16 and
    bf16 autocast by oneDNN: the same numbers in fp32, without laying the weight out again on every call. Where
    oneDNN has no bf16 matmul, bf16 is widened to fp32 on packed weights (`packed_plan`) under its own switch,
    `widened` (`widened_bf16`): it wins by emulated bf16's loss where the fp32 packing may not win at all."""

    onednn: bool = False  # timm's path until vitkit.hardware.apply_fast_paths decides
    onednn_training: bool = False  # the same under grad (forward and backward), decided apart: hardware.py
    # inference (no grad): the weight packed once per input row count for its kernel (`packed_plan`)
    packed: bool = False
    # inference (no grad) in bf16 where oneDNN has no bf16 matmul: widened to fp32 on packed weights (`widened_bf16`)
    widened: bool = False
    # under grad with bf16 autocast where oneDNN has no bf16 matmul: onednn.WidenedLinear (`widened_bf16_training`)
    widened_training: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grad = torch.is_grad_enabled()
        if not grad and (self.packed or self.widened) and _ONEDNN_LINEAR and _eager_cpu(x):
            dtype = _packed_dtype(x, self.weight)
            if dtype is not None and self.packs(dtype):
                return self._packed_forward(x, dtype)
        if (grad and self.widened_training and not _ONEDNN_BF16 and torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") == torch.bfloat16 and _eager_cpu(x)):
            return WidenedLinear.apply(x, self.weight, self.bias)
        if ((self.onednn_training if grad else self.onednn) and _ONEDNN_LINEAR and x.dtype == torch.float32
                and self.weight.dtype == torch.float32 and not torch.is_autocast_enabled("cpu") and _eager_cpu(x)):
            if not grad:
                return mm_t(x, self.weight, self.bias)
            return OneDnnLinear.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def _packed_forward(self, x: torch.Tensor, dtype: torch.dtype, gelu: str | None = None) -> torch.Tensor:
        """The packed inference matmul in `dtype` (`packed_plan`): x and bias rounded to `dtype` as F.linear's
        inputs are, then widened where the plan computes wider, the output rounded back to `dtype`. `gelu` (F.gelu's
        `approximate`): a GELU in oneDNN's epilogue, for a caller that checked packed_plan(dtype) is (dtype,
        "onednn")."""
        compute, kernel = self.packed_plan(dtype)
        packed, weight = self.packed_weight(x, dtype, compute, kernel)
        bias = None if self.bias is None else self.bias.to(dtype).to(compute)
        x = x.to(dtype).to(compute)
        if gelu is not None:
            return linear_gelu(x, packed, bias, gelu)
        return packed_linear(x, packed, weight, bias, kernel).to(dtype)

    def packs(self, dtype: torch.dtype) -> bool:
        """Whether an inference matmul asked for in `dtype` runs packed: `widened` decides bf16 where oneDNN has no
        bf16 matmul (the plan widens it to fp32), `packed` every other case."""
        return self.widened if dtype == torch.bfloat16 and not _ONEDNN_BF16 else self.packed

    def packed_plan(self, dtype: torch.dtype) -> tuple[torch.dtype, str]:
        """(compute dtype, kernel) of a packed inference matmul asked for in `dtype`. fp32: MKL's packed sgemm,
        unless this machine runs fp32 linears in oneDNN (`onednn`). bf16: oneDNN's bf16 matmul; where oneDNN has
        none (no AVX512BW/VL/DQ, no AVX-NE-CONVERT: bf16 emulated), the bf16-rounded operands widened to fp32 (exact)
        and multiplied there, the fp32 accumulation a bf16 matmul does, at fp32 speed (OpenVINO runs its bf16 hint
        in f32 on such CPUs too)."""
        if dtype == torch.bfloat16 and _ONEDNN_BF16:
            return dtype, "onednn"
        return torch.float32, ("mkl" if MKL_PACKED and not self.onednn else "onednn")

    def packed_weight(self, x: torch.Tensor, dtype: torch.dtype, compute: torch.dtype,
                      kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight rounded to `dtype`, held in `compute`, packed for `kernel` and x's row count, with its unpacked
        form; cached on the module (onednn.PackCache): on a 2-core Xeon with AMX, MKL's packed sgemm ran ViT-S/16's
        fp32 linears 1.04-1.22x F.linear (batch 8 and 1) with the same numbers, since MKL's plain sgemm packs the
        weight's panels inside every call."""
        cache = self.__dict__.get("_packs")
        if cache is None:
            cache = self._packs = PackCache()
        return cache.get(self.weight, x.numel() // x.shape[-1], dtype, compute, kernel)


def _eager_cpu(x: torch.Tensor) -> bool:
    """x on the CPU in plain eager code: not compiled, traced or under a dispatch mode (FlopCounterMode, fake
    tensors), where inductor and the exporters have their own kernels and the counters know only standard ops."""
    return (x.device.type == "cpu" and not torch.compiler.is_compiling() and not torch.jit.is_tracing()
            and _current_dispatch_mode() is None)


def hooked(*modules: nn.Module) -> bool:
    """True where a forward hook (on one of these modules, or global) would miss a call a fused kernel skips."""
    from torch.nn.modules import module as m

    return bool(m._global_forward_hooks or m._global_forward_pre_hooks
                or any(x._forward_hooks or x._forward_pre_hooks for x in modules))


def _packed_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype a packed inference matmul runs in, as F.linear would: bf16 under CPU bf16 autocast, else x's own
    where weight and x share fp32 or bf16; None where no packed kernel covers it (fp16, mixed dtypes)."""
    if torch.is_autocast_enabled("cpu"):
        return torch.bfloat16 if torch.get_autocast_dtype("cpu") == torch.bfloat16 else None
    return x.dtype if x.dtype == weight.dtype and x.dtype in (torch.float32, torch.bfloat16) else None


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the activation OpenAI's CLIP weights were trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_act(name: str) -> nn.Module:
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "quick_gelu":
        return QuickGELU()
    if name == "silu":  # MobileViT's transformer MLPs
        return nn.SiLU()
    raise ConfigError(f"unknown activation {name!r}; choose gelu, gelu_tanh, quick_gelu or silu")


class Mlp(nn.Module):
    """fc1 -> act -> fc2 (the ViT paper's MLP).

    Inference (no grad) on the CPU keeps the [B, N, hidden] activation to one buffer, written once, the numbers of
    the module path bit for bit: the GELU runs in place on fc1's output, a tensor only this call holds; where fc1
    runs on packed weights in oneDNN (`Linear.packs` with `packed_plan` (dtype, "onednn"): bf16, bf16 autocast, fp32
    where `onednn` is on) fc1 and its GELU run as one matmul with the GELU in its epilogue. ViT-S/16 fp32 inference
    at batch 8 on a 2-core Zen 4 under the AVX2 cap (timm's kernels otherwise): 1.13x the out-of-place GELU with three
    models in one process, +6% with one model per process, level at batch 1 (BENCHMARKS.md, "The widened bf16 path
    decided apart"). Not under grad (autograd keeps GELU's input), with hooks on fc1 or act, for other activations, or
    off the CPU's eager code (compiled, traced, dispatch modes: their own kernels)."""

    def __init__(self, dim: int, hidden: int, act: str = "gelu", drop: float = 0.0, bias: bool = True):
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=bias)
        self.act = make_act(act)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = Linear(hidden, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            h = self._inference_fc1_gelu(x)
            if h is not None:
                return self.drop2(self.fc2(h))  # [..., D]; drop1 is inactive where this path runs
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

    def _inference_fc1_gelu(self, x: torch.Tensor) -> torch.Tensor | None:
        """GELU(fc1(x)) [..., hidden] in one buffer (see the class), or None where that path does not apply."""
        fc1, act = self.fc1, self.act
        if not (type(act) is nn.GELU and type(fc1) is Linear and _eager_cpu(x)
                and (self.drop1.p == 0.0 or not self.training) and not hooked(fc1, act, self.drop1)):
            return None
        dtype = _packed_dtype(x, fc1.weight)
        if (_ONEDNN_LINEAR and dtype is not None and fc1.packs(dtype)
                and fc1.packed_plan(dtype) == (dtype, "onednn")):
            return fc1._packed_forward(x, dtype, gelu=act.approximate)
        # every other kernel (F.linear, MKL's packed sgemm, bf16 widened) has no epilogue: in place on fc1's fresh
        # output, this call's own
        return torch.ops.aten.gelu_(fc1(x), approximate=act.approximate)


class SwiGLU(nn.Module):
    """SiLU(x W_g) * (x W_x), then fc2 (Shazeer 2020); timm's `SwiGLU` key names (fc1_g, fc1_x, fc2).
    `hidden` is the width of each of the two branches. `act` is ignored: the gate is SiLU by definition."""

    def __init__(self, dim: int, hidden: int, act: str = "gelu", drop: float = 0.0, bias: bool = True):
        super().__init__()
        self.fc1_g = Linear(dim, hidden, bias=bias)
        self.fc1_x = Linear(dim, hidden, bias=bias)
        self.act = nn.SiLU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = Linear(hidden, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.fc1_g(x)) * self.fc1_x(x)  # [..., hidden]
        return self.drop2(self.fc2(self.drop1(x)))


class SwiGLUPacked(nn.Module):
    """SwiGLU with both branches in one fc1 of width `hidden` (gate = first half), fc2 from hidden/2:
    the layout of timm's `SwiGLUPacked` (DINOv2 giant)."""

    def __init__(self, dim: int, hidden: int, act: str = "gelu", drop: float = 0.0, bias: bool = True):
        super().__init__()
        if hidden % 2:
            raise ConfigError(f"a packed SwiGLU needs an even hidden width, got {hidden}")
        self.fc1 = Linear(dim, hidden, bias=bias)
        self.act = nn.SiLU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = Linear(hidden // 2, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, x = self.fc1(x).chunk(2, dim=-1)  # 2 x [..., hidden/2]
        return self.drop2(self.fc2(self.drop1(self.act(gate) * x)))


class DepthwiseConvMlp(nn.Module):
    """fc1 -> 3x3 depthwise conv over the patch grid -> act -> fc2: PVTv2's MLP (Wang et al. 2022; LocalViT and
    CeiT's LeFF put the same conv there), under timm's key names (`MlpWithDepthwiseConv`: fc1, dwconv, fc2). Every
    block then mixes each token with its 8 grid neighbours, the locality a plain ViT lacks on small data. Prefix
    tokens (class, registers) skip the conv. It needs the grid of the tokens it gets (`needs_grid`): every patch
    token, in the row-major order of the patch embedding."""

    needs_grid = True  # Block passes the patch grid (gh, gw)

    def __init__(self, dim: int, hidden: int, act: str = "gelu", drop: float = 0.0, bias: bool = True):
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=bias)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)  # one 3x3 filter per channel
        self.act = make_act(act)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = Linear(hidden, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        h = self.fc1(x)  # [B, P + N, C]
        B, T, C = h.shape
        if grid is None or T < grid[0] * grid[1]:
            raise ConfigError(
                f"mlp_layer='mlp_dwconv' convolves the whole patch grid, but got {T} tokens and grid {grid}: it "
                "cannot run on a subset of the patches (MAE's keep, token merging) or on a PatchBatch")
        gh, gw = grid
        prefix = T - gh * gw
        patches = h[:, prefix:].transpose(1, 2).reshape(B, C, gh, gw)  # [B, C, Gh, Gw], a channels-last view
        patches = self.dwconv(patches).flatten(2).transpose(1, 2)  # [B, N, C]
        h = torch.cat([h[:, :prefix], patches], dim=1) if prefix else patches  # [B, P + N, C]
        return self.drop2(self.fc2(self.drop1(self.act(h))))


def mlp_needs_grid(mlp_layer: type[nn.Module]) -> bool:
    """Whether an MLP layer class convolves over the patch grid (`needs_grid`: Block then passes it (gh, gw))."""
    return getattr(mlp_layer, "needs_grid", False)


# MLP layers by the name a config stores (ViTConfig.mlp_layer); each takes (dim, hidden, act, drop, bias)
MLP_LAYERS: dict[str, type[nn.Module]] = {"mlp": Mlp, "swiglu": SwiGLU, "swiglu_packed": SwiGLUPacked,
                                          "mlp_dwconv": DepthwiseConvMlp}
