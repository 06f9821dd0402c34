"""The transformer MLP (D -> hidden -> D) and its activations."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from ..errors import ConfigError
from ..onednn import AVAILABLE as _ONEDNN_LINEAR
from ..onednn import OneDnnLinear, mm_t


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict keys) whose fp32 CPU matmuls run in oneDNN.

    torch's fp32 F.linear goes to MKL sgemm, which takes its AVX2 path on AMD CPUs: on the project's
    EPYC it measured ~100 GFLOP/s per core against ~220 for oneDNN's matmul; ViT-Ti/S inference ran
    1.4-1.8x and small-model fp32 training steps 1.6x faster, outputs and gradients equal to 1e-6.
    Autocast, other dtypes, compiled or traced code and dispatch modes (FlopCounterMode, fake tensors)
    keep F.linear: inductor and the exporters have their own kernels, and the counters do not know it.
    `onednn` (inference) and `onednn_training` (under grad) are the switches `vitkit.hardware` sets per machine
    from what it measured there (off: timm's F.linear)."""

    onednn: bool = False  # timm's path until vitkit.hardware.apply_fast_paths decides
    onednn_training: bool = False  # the same under grad (forward and backward), decided apart: hardware.py

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grad = torch.is_grad_enabled()
        if ((self.onednn_training if grad else self.onednn) and _ONEDNN_LINEAR and x.dtype == torch.float32
                and x.device.type == "cpu" and self.weight.dtype == torch.float32
                and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling() and not torch.jit.is_tracing()
                and _current_dispatch_mode() is None):
            if not grad:
                return mm_t(x, self.weight, self.bias)
            return OneDnnLinear.apply(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


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
    """fc1 -> act -> fc2 (the ViT paper's MLP)."""

    def __init__(self, dim: int, hidden: int, act: str = "gelu", drop: float = 0.0, bias: bool = True):
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=bias)
        self.act = make_act(act)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = Linear(hidden, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


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
