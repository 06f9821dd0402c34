"""ViTDet's simple feature pyramid (Li et al. 2022, "Exploring Plain Vision Transformer Backbones for Object
Detection"): a plain ViT's last map (stride 16 for patch 16) becomes maps at strides 4, 8, 16, 32 with
deconvolutions and pooling alone, no top-down path.

As detectron2's `SimpleFeaturePyramid`, per scale: 4x: ConvTranspose(2, 2) -> LayerNorm2d -> GELU ->
ConvTranspose(2, 2); 2x: one ConvTranspose(2, 2); 1x: the map itself; 0.5x: MaxPool(2, 2). Then each level
gets Conv1x1 -> LayerNorm2d and Conv3x3 -> LayerNorm2d (convolutions without bias) to `out_dim` channels.
A ViT with smaller patches needs other scales for the same strides (`scales_for`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

SCALES = (4.0, 2.0, 1.0, 0.5)  # relative to the input map: strides 4, 8, 16, 32 from a stride-16 map


def scales_for(stride: int, strides: tuple[int, ...] = (4, 8, 16, 32)) -> tuple[float, ...]:
    """The scales that take a map of `stride` to `strides`: (4, 2, 1, 0.5) for patch 16, (1, 0.5, 0.25, 0.125)
    for patch 4 (the same strides 4..32, so a small-patch ViT is not decoded at full resolution)."""
    return tuple(stride / s for s in strides)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map (detectron2's / timm's LayerNorm2d)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)  # [B, H, W, C]
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps).permute(0, 3, 1, 2)


def _resample(dim: int, scale: float) -> tuple[nn.Module, int]:
    """The module that takes a [B, dim, H, W] map to scale * (H, W), and its output channels: ViTDet's for
    4, 2, 1 and 0.5; other powers of two continue the pattern (8x: a third deconvolution; 1/4: a 4x4 max-pool)."""
    if scale <= 0 or math.log2(scale) != int(math.log2(scale)):
        raise ValueError(f"scale {scale} is not a power of two")
    steps = int(math.log2(scale))
    if steps <= 0:
        return (nn.Identity() if steps == 0 else nn.MaxPool2d(2 ** -steps, stride=2 ** -steps)), dim
    layers: list[nn.Module] = []
    width = dim
    for i in range(steps):
        if width % 2:
            raise ValueError(f"width {dim} cannot be halved {steps} times for scale {scale}")
        if i:
            layers += [LayerNorm2d(width), nn.GELU()]
        layers.append(nn.ConvTranspose2d(width, width // 2, 2, stride=2))
        width //= 2
    return (layers[0] if steps == 1 else nn.Sequential(*layers)), width


class SimpleFeaturePyramid(nn.Module):
    """One [B, dim, H, W] map -> a list of [B, out_dim, s*H, s*W] maps, one per scale s (finest first)."""

    def __init__(self, dim: int, out_dim: int = 256, scales: tuple[float, ...] = SCALES):
        super().__init__()
        self.scales = tuple(scales)
        self.resample = nn.ModuleList()
        self.project = nn.ModuleList()
        for s in self.scales:
            module, width = _resample(dim, s)
            self.resample.append(module)
            self.project.append(nn.Sequential(
                nn.Conv2d(width, out_dim, 1, bias=False), LayerNorm2d(out_dim),
                nn.Conv2d(out_dim, out_dim, 3, padding=1, bias=False), LayerNorm2d(out_dim)))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [proj(res(x)) for res, proj in zip(self.resample, self.project)]
