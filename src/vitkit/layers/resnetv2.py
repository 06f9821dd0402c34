"""The ResNetV2 (BiT) backbone of the hybrid ViTs (Dosovitskiy et al. 2021, Sec. 3.1; Kolesnikov et al. 2020).

What makes it differ from a torchvision ResNet, as in the original JAX code and timm's hybrids:
- weight-standardised convolutions (each filter normalised to zero mean, unit variance before use),
- GroupNorm (32 groups) instead of BatchNorm, so nothing depends on the batch,
- TensorFlow "SAME" padding: for a stride-2 layer the padding goes mostly to the bottom/right and depends on
  the input size, so an even input maps to exactly half the size,
- the ViT hybrids use the *non*-pre-activation bottleneck (norm after each conv, ReLU after the residual sum;
  timm's `preact=False`), not BiT's pre-activation one.
Module and key names are timm's (`stem.conv`, `stem.norm`, `stages.{i}.blocks.{j}.conv1`, ...).
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TF 'SAME' padding of one axis as (before, after): the output has ceil(size / stride) positions and the
    odd pixel of padding goes after."""
    total = max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int] = (1, 1),
             value: float = 0.0) -> torch.Tensor:
    """[B, C, H, W] padded so a `kernel`/`stride` window gives TF 'SAME' output (ceil(H / stride))."""
    top, bottom = same_padding(x.shape[-2], kernel[0], stride[0], dilation[0])
    left, right = same_padding(x.shape[-1], kernel[1], stride[1], dilation[1])
    if top == bottom == left == right == 0:
        return x
    return F.pad(x, (left, right, top, bottom), value=value)


class StdConv2dSame(nn.Conv2d):
    """Conv2d with weight standardisation (per output filter: (w - mean) / sqrt(var + eps), biased variance)
    and TF 'SAME' padding. A stride-1 odd kernel pads symmetrically, so that case uses a fixed padding."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int, stride: int = 1, dilation: int = 1,
                 groups: int = 1, bias: bool = False, eps: float = 1e-8):
        self.dynamic_pad = not (stride == 1 and (dilation * (kernel_size - 1)) % 2 == 0)
        padding = 0 if self.dynamic_pad else dilation * (kernel_size - 1) // 2
        super().__init__(in_chs, out_chs, kernel_size, stride=stride, padding=padding, dilation=dilation,
                         groups=groups, bias=bias)
        self.eps = eps

    def standardized_weight(self) -> torch.Tensor:
        w = self.weight  # [O, I, k, k]
        var, mean = torch.var_mean(w, dim=(1, 2, 3), keepdim=True, unbiased=False)
        return (w - mean) / torch.sqrt(var + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dynamic_pad:
            x = pad_same(x, self.kernel_size, self.stride, self.dilation)
        return F.conv2d(x, self.standardized_weight(), self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class GroupNormAct(nn.GroupNorm):
    """GroupNorm (32 groups, eps 1e-5) followed by ReLU unless `act=False`; keys `weight`, `bias` as timm's."""

    def __init__(self, num_channels: int, num_groups: int = 32, eps: float = 1e-5, act: bool = True):
        super().__init__(num_groups, num_channels, eps=eps)
        self.act = nn.ReLU(inplace=True) if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(super().forward(x))


class MaxPool2dSame(nn.Module):
    """3x3 stride-2 max-pool with TF 'SAME' padding (padded with -inf, so padding never wins)."""

    def __init__(self, kernel_size: int = 3, stride: int = 2):
        super().__init__()
        self.kernel_size, self.stride = (kernel_size, kernel_size), (stride, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.kernel_size, self.stride, value=-math.inf)
        return F.max_pool2d(x, self.kernel_size, self.stride)


def resnetv2_stem(in_chans: int, out_chs: int = 64, eps: float = 1e-8) -> nn.Sequential:
    """7x7/2 standardised conv, GroupNorm + ReLU, 3x3/2 'SAME' max-pool: [B, C, H, W] -> [B, 64, H/4, W/4]."""
    return nn.Sequential(OrderedDict([
        ("conv", StdConv2dSame(in_chans, out_chs, 7, stride=2, eps=eps)),
        ("norm", GroupNormAct(out_chs)),
        ("pool", MaxPool2dSame(3, 2)),
    ]))


class DownsampleConv(nn.Module):
    """The projection shortcut: 1x1 standardised conv (with the block's stride) and GroupNorm, no ReLU."""

    def __init__(self, in_chs: int, out_chs: int, stride: int, eps: float = 1e-8):
        super().__init__()
        self.conv = StdConv2dSame(in_chs, out_chs, 1, stride=stride, eps=eps)
        self.norm = GroupNormAct(out_chs, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride here) -> 1x1 with 4x expansion, a norm after each conv and ReLU after the sum."""

    def __init__(self, in_chs: int, out_chs: int, stride: int = 1, eps: float = 1e-8):
        super().__init__()
        mid = out_chs // 4
        self.downsample = DownsampleConv(in_chs, out_chs, stride, eps) if stride != 1 or in_chs != out_chs else None
        self.conv1 = StdConv2dSame(in_chs, mid, 1, eps=eps)
        self.norm1 = GroupNormAct(mid)
        self.conv2 = StdConv2dSame(mid, mid, 3, stride=stride, eps=eps)
        self.norm2 = GroupNormAct(mid)
        self.conv3 = StdConv2dSame(mid, out_chs, 1, eps=eps)
        self.norm3 = GroupNormAct(out_chs, act=False)
        self.act3 = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.norm1(self.conv1(x))
        x = self.norm2(self.conv2(x))
        x = self.norm3(self.conv3(x))
        return self.act3(x + shortcut)


class ResNetStage(nn.Module):
    def __init__(self, in_chs: int, out_chs: int, stride: int, depth: int, eps: float = 1e-8):
        super().__init__()
        self.blocks = nn.Sequential(*[
            Bottleneck(in_chs if i == 0 else out_chs, out_chs, stride if i == 0 else 1, eps) for i in range(depth)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ResNetV2(nn.Module):
    """Stem (stride 4) and one stage per entry of `layers` (the first keeps the stride, each later one halves
    it): R50x1's first three stages (3, 4, 9) give stride 16 and 1024 channels; R26 (2, 2, 2, 2) and
    R50 (3, 4, 6, 3) give stride 32 and 2048 channels."""

    def __init__(self, layers: tuple[int, ...], in_chans: int = 3, channels=(256, 512, 1024, 2048),
                 stem_chs: int = 64, eps: float = 1e-8):
        super().__init__()
        self.stem = resnetv2_stem(in_chans, stem_chs, eps)
        stages, prev = [], stem_chs
        for i, depth in enumerate(layers):
            stages.append(ResNetStage(prev, channels[i], 1 if i == 0 else 2, depth, eps))
            prev = channels[i]
        self.stages = nn.Sequential(*stages)
        self.num_features = prev

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))  # [B, F, H/s, W/s]


def init_conv_norm(module: nn.Module) -> None:
    """He (fan-out) init for convolutions, identity for norms: the init timm gives its CNN backbones."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
