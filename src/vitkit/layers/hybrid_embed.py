"""Hybrid patch embeddings: a CNN turns the image into a feature map, and the ViT's patches are cut from that map.

The ViT paper's hybrid (Sec. 3.1): "the patch embedding projection E is applied to patches extracted from a CNN
feature map"; with 1x1 patches each feature-map position is one token. Here, as in the config, `patch_size` is
the patch in *image* pixels: the backbone's stride times the patch on its map (R50 at stride 16 with 1x1
patches: 16; timm's `vit_tiny_r_s16_p8`, a stride-4 stem with 8x8 patches: 32). So `ViTConfig.grid_size`, the
position table and every image-size check mean the same thing as for a plain ViT.

Each stem is its own class under its own registered name (models/hybrid.py registers them), so a config needs
only `embed_layer`. Keys are timm's: `backbone.*` for the CNN, `proj` for the projection.
"""
from __future__ import annotations

import logging

import torch
from torch import nn
from torchvision.models.resnet import Bottleneck as TvBottleneck

from ..errors import ConfigError
from .patch_embed import PatchGrid, adapt_in_chans, to_2tuple
from .resnetv2 import ResNetV2, init_conv_norm, resnetv2_stem

log = logging.getLogger("vitkit")


class HybridEmbed(PatchGrid, nn.Module):
    """[B, C, H, W] -> backbone [B, F, H/s, W/s] -> (p/s)x(p/s) patches projected to D: [B, H/p, W/p, D]."""

    reduction: int = 1  # the backbone's stride
    first_conv: str = ""  # the conv that sees the image (relative to this layer): in_chans adaptation
    has_proj: bool = True  # False: the backbone's last conv already outputs D channels (timm's proj=False)

    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True):
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.in_chans = in_chans
        s = self.reduction
        if any(p % s for p in self.patch_size) or (not self.has_proj and self.patch_size != (s, s)):
            need = f"a multiple of {s}" if self.has_proj else f"exactly {s}"
            raise ConfigError(f"{type(self).__name__}: patch_size {self.patch_size[0]} must be {need} (the "
                              f"backbone's stride; patch_size is in image pixels)")
        self.backbone, self.feature_dim = self.build_backbone(in_chans, embed_dim, bias)
        if self.has_proj:
            k = (self.patch_size[0] // s, self.patch_size[1] // s)  # the patch on the feature map
            self.proj = nn.Conv2d(self.feature_dim, embed_dim, kernel_size=k, stride=k, bias=bias)
        self.set_img_size(img_size)

    def build_backbone(self, in_chans: int, embed_dim: int, bias: bool) -> tuple[nn.Module, int]:
        """-> (the CNN, its output channels)."""
        raise NotImplementedError

    @property
    def patch_note(self) -> str:
        return f" (backbone stride {self.reduction} x patches on its map)"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ConfigError(f"expected input of shape [batch, {self.in_chans}, H, W], got {list(x.shape)}")
        if not torch.jit.is_tracing() and not torch.compiler.is_compiling():
            self.grid_for(x.shape[-2], x.shape[-1])  # clear error for non-divisible sizes
        x = self.backbone(x)  # [B, F, H/s, W/s]
        if self.has_proj:
            x = self.proj(x)  # [B, D, H/p, W/p]
        return x.permute(0, 2, 3, 1)  # [B, Gh, Gw, D]

    def adapt_state_dict(self, sd: dict[str, torch.Tensor], prefix: str = "patch_embed.") -> dict[str, torch.Tensor]:
        """A checkpoint's first-conv filters for another channel count (3-channel weights, a gray model) adapted
        as a plain ViT's patch filters are (`adapt_in_chans`). A weight-standardised conv re-normalises the
        adapted filter, so there the gray response is a close start rather than the same."""
        key = f"{prefix}{self.first_conv}.weight"
        w, own = sd.get(key), self.get_parameter(f"{self.first_conv}.weight")
        if w is not None and w.ndim == 4 and w.shape[1] != own.shape[1] and w.shape[0] == own.shape[0]:
            sd = dict(sd) | {key: adapt_in_chans(w, own.shape[1])}
            log.info("adapted the %d-channel first convolution of the hybrid stem to %d channels", w.shape[1],
                     own.shape[1])
        return sd


# ---------------------------------------------------------------------------- ResNetV2 (BiT) stems, GroupNorm
class ResNetV2StemEmbed(HybridEmbed):
    """Only the R stem (7x7/2 conv, GroupNorm, 3x3/2 max-pool; stride 4, 64 channels): timm's `vit_tiny_r_s16_p8`
    cuts 8x8 patches from it (32 image pixels)."""

    reduction = 4
    first_conv = "backbone.conv"

    def build_backbone(self, in_chans, embed_dim, bias):
        stem = resnetv2_stem(in_chans)
        init_conv_norm(stem)
        return stem, 64


class _ResNetV2Embed(HybridEmbed):
    layers: tuple[int, ...] = ()
    first_conv = "backbone.stem.conv"

    def build_backbone(self, in_chans, embed_dim, bias):
        net = ResNetV2(self.layers, in_chans)
        init_conv_norm(net)
        return net, net.num_features


class ResNetV2R50S16Embed(_ResNetV2Embed):
    """R50x1's first three stages (3, 4, 9 blocks): stride 16, 1024 channels (ViT-B/16 hybrid, `R50+ViT-B/16`)."""

    layers, reduction = (3, 4, 9), 16


class ResNetV2R26Embed(_ResNetV2Embed):
    """R26 (2, 2, 2, 2 blocks): stride 32, 2048 channels (AugReg's `R26+S/32`)."""

    layers, reduction = (2, 2, 2, 2), 32


class ResNetV2R50Embed(_ResNetV2Embed):
    """R50 with all four stages (3, 4, 6, 3): stride 32, 2048 channels (AugReg's `R50+L/32`)."""

    layers, reduction = (3, 4, 6, 3), 32


# ---------------------------------------------------------------------------- ResNet-D stems, BatchNorm
class ResNetD(nn.Module):
    """timm's ResNet-D feature extractor (He et al. 2019, "Bag of Tricks"): a deep stem of three 3x3 convs
    (32, 32, 64 channels) and average-pool shortcuts, torchvision's bottleneck (stride on the 3x3) otherwise.
    Keys as timm's `resnet26d(features_only=True)`: conv1.{0,1,3,4,6}, bn1, layer{i}.{j}, downsample.{1,2}."""

    def __init__(self, layers: tuple[int, ...], in_chans: int = 3, stem_width: int = 32):
        super().__init__()
        w = stem_width
        self.conv1 = nn.Sequential(
            nn.Conv2d(in_chans, w, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
            nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
            nn.Conv2d(w, 2 * w, 3, padding=1, bias=False))
        self.bn1 = nn.BatchNorm2d(2 * w)
        self.act1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = 2 * w
        for i, (depth, planes) in enumerate(zip(layers, (64, 128, 256, 512))):
            stride = 1 if i == 0 else 2
            out = planes * TvBottleneck.expansion
            # ResNet-D shortcut: average-pool first, then a stride-1 1x1 conv (index 0 stays a no-op at stride 1)
            pool = nn.AvgPool2d(2, stride, ceil_mode=True, count_include_pad=False) if stride > 1 else nn.Identity()
            down = nn.Sequential(pool, nn.Conv2d(inplanes, out, 1, bias=False), nn.BatchNorm2d(out))
            blocks = [TvBottleneck(inplanes, planes, stride, down)]
            blocks += [TvBottleneck(out, planes) for _ in range(depth - 1)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
            inplanes = out
        self.num_layers = len(layers)
        self.num_features = inplanes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))  # [B, 64, H/4, W/4]
        for i in range(self.num_layers):
            x = getattr(self, f"layer{i + 1}")(x)
        return x


class _ResNetDEmbed(HybridEmbed):
    layers: tuple[int, ...] = ()
    first_conv = "backbone.conv1.0"

    def build_backbone(self, in_chans, embed_dim, bias):
        net = ResNetD(self.layers, in_chans)
        init_conv_norm(net)
        return net, net.num_features


class ResNet26DEmbed(_ResNetDEmbed):
    """ResNet-26-D, four stages (2, 2, 2, 2): stride 32, 2048 channels."""

    layers, reduction = (2, 2, 2, 2), 32


class ResNet50DEmbed(_ResNetDEmbed):
    """ResNet-50-D, four stages (3, 4, 6, 3): stride 32, 2048 channels."""

    layers, reduction = (3, 4, 6, 3), 32


class ResNet50DS16Embed(_ResNetDEmbed):
    """ResNet-50-D's first three stages (3, 4, 6): stride 16, 1024 channels."""

    layers, reduction = (3, 4, 6), 16


# ---------------------------------------------------------------------------- small convolutional stems
class ConvNormAct(nn.Module):
    """conv -> BatchNorm -> activation; keys `conv`, `bn` as timm's ConvNormAct. `norm=False`: the conv only."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int, stride: int, padding: int, act: type[nn.Module],
                 norm: bool = True, bias: bool = False, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride=stride, padding=padding, bias=bias, groups=groups)
        self.bn = nn.BatchNorm2d(out_chs) if norm else nn.Identity()
        self.act = act() if norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class MobileClipStemEmbed(HybridEmbed):
    """MobileCLIP's ViT-B image encoder stem (timm's `vit_base_mci_224`): 4x4/4, 2x2/2, 2x2/2 convs with
    BatchNorm + GELU between them (D/4, D/4, D channels), so it ends at D channels, stride 16, with no separate
    projection (the last conv is the projection; `bias` is its bias)."""

    reduction = 16
    first_conv = "backbone.0.conv"
    has_proj = False

    def build_backbone(self, in_chans, embed_dim, bias):
        c = embed_dim // 4
        stem = nn.Sequential(
            ConvNormAct(in_chans, c, 4, 4, 0, nn.GELU),
            ConvNormAct(c, c, 2, 2, 0, nn.GELU),
            ConvNormAct(c, embed_dim, 2, 2, 0, nn.GELU, norm=False, bias=bias))
        return stem, embed_dim

    @property
    def proj(self) -> nn.Conv2d:
        """The conv that makes the tokens (what a plain ViT calls `patch_embed.proj`)."""
        return self.backbone[-1].conv


class SmallConvStemEmbed(HybridEmbed):
    """For 28-32 px images: two 3x3 conv + BatchNorm + ReLU layers (stride 2, then 1; D/4 and D/2 channels)
    before patching, as the "early convolutions" designs do (Xiao et al. 2021; CCT, Hassani et al. 2021): the
    convolutions see every pixel with overlapping windows, where a plain patch embedding cuts the image into
    disjoint squares. patch_size 4 = stride 2 x 2x2 patches on the map (7x7 tokens at 28 px)."""

    reduction = 2
    first_conv = "backbone.0.conv"
    convs = 2  # 3x3 conv layers: the first at stride 2, the rest at stride 1 with D/2 channels

    def build_backbone(self, in_chans, embed_dim, bias):
        c1, c2 = max(embed_dim // 4, 8), max(embed_dim // 2, 8)
        layers = [ConvNormAct(in_chans, c1, 3, 2, 1, nn.ReLU), ConvNormAct(c1, c2, 3, 1, 1, nn.ReLU)]
        layers += [ConvNormAct(c2, c2, 3, 1, 1, nn.ReLU) for _ in range(self.convs - 2)]  # [B, D/2, H/2, W/2]
        stem = nn.Sequential(*layers)
        init_conv_norm(stem)
        return stem, c2


class SmallConvStem3Embed(SmallConvStemEmbed):
    """The small conv stem with a third 3x3 conv (D/2 -> D/2, stride 1). In the fashion-mnist-conv recipe's 900 s
    (an idle 2-core Xeon with AMX, seeds 0/1/2) it scored 92.21/91.95/91.80% test top-1 against 91.72/91.88/91.95%
    with two convs: +0.14 points on the mean, within the seeds' spread, for a few percent fewer images a second,
    so the recipe keeps two (BENCHMARKS.md, "A third stem conv")."""

    convs = 3
