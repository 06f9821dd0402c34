"""Semantic segmentation on any family: backbone feature maps -> a pyramid -> a light FPN head -> per-pixel logits.

The maps come from the feature contract alone (`feature_info` + `forward_intermediates`, models/features.py),
so the head never asks which family it holds (`pyramid_indices`, `backbone_maps`):
- a plain backbone (every map at one stride: a ViT, a hybrid, a CLIP image tower): its last map (stride p,
  the patch), made into strides 4, 8, 16, 32 by ViTDet's simple feature pyramid (layers/pyramid.py);
- a hierarchical backbone (Swin's stages, a ResNet's layer1..layer4): the deepest map at each stride, the
  last four of them (FPN's levels), already a pyramid.

The head (`SegmentationHead`, the semantic branch of Panoptic FPN made small): every level is projected to
`dim` channels (hierarchical maps: Conv1x1 + LayerNorm2d; a plain map: the simple pyramid does it), a
top-down pass adds each coarser level, upsampled, to the next finer one; each level then gets
Conv3x3 + GroupNorm + ReLU, is upsampled to the finest level and summed; a 1x1 conv gives class logits,
upsampled bilinearly to the input size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..layers.pyramid import SCALES, LayerNorm2d, SimpleFeaturePyramid, scales_for
from .protocol import require

PYRAMID_LEVELS = 4  # FPN's strides 4, 8, 16, 32 for a stride-4 finest level


def _feature_info(model: nn.Module) -> list[dict]:
    require(model, "intermediates", "a segmentation head")
    return model.feature_info


def is_plain(model: nn.Module) -> bool:
    """True when every map the model gives has one stride (a ViT's blocks), False for a pyramid (Swin, ResNet)."""
    return len({e["reduction"] for e in _feature_info(model)}) == 1


def pyramid_indices(model: nn.Module) -> list[int]:
    """The `feature_info` indices the head reads, finest first: a plain model's last map; otherwise the
    deepest map at each stride, the coarsest `PYRAMID_LEVELS` of them (a ResNet's stem shares layer1's stride
    with the small stem and is finer than stride 4 with the standard one: it is not a level)."""
    info = _feature_info(model)
    deepest = {e["reduction"]: i for i, e in enumerate(info)}  # later entries win: the deepest per stride
    return sorted(deepest.values())[-PYRAMID_LEVELS:]


def backbone_widths(model: nn.Module) -> list[int]:
    """Channels of each map `backbone_maps` returns (one entry for a plain model)."""
    info = _feature_info(model)
    return [info[i]["num_chs"] for i in pyramid_indices(model)]


def backbone_maps(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """NCHW feature maps of `x` [B, C, H, W], finest first (see the module docstring). A plain map is taken
    before the final norm (ViTDet's); a pyramid's last map after it, as the classifier sees it (the final norm
    is sized for the last stage only)."""
    return model.forward_intermediates(x, indices=pyramid_indices(model), norm=not is_plain(model),
                                       intermediates_only=True)


class SegmentationHead(nn.Module):
    """Feature maps (finest first) -> class logits [B, K, H, W] at `size` (the input's)."""

    def __init__(self, widths: list[int], num_classes: int, dim: int = 64, plain: bool = False,
                 scales: tuple[float, ...] = SCALES, dropout: float = 0.1):
        super().__init__()
        if num_classes < 1:
            raise ConfigError("a segmentation head needs num_classes >= 1")
        if plain:
            if len(widths) != 1:
                raise ConfigError(f"a plain backbone gives one map, got widths {widths}")
            self.neck = SimpleFeaturePyramid(widths[0], dim, scales)
            levels = len(scales)
        else:
            self.neck = nn.ModuleList(nn.Sequential(nn.Conv2d(w, dim, 1, bias=False), LayerNorm2d(dim))
                                      for w in widths)
            levels = len(widths)
        self.plain = plain
        groups = next(g for g in (32, 16, 8, 4, 2, 1) if dim % g == 0)
        self.smooth = nn.ModuleList(nn.Sequential(nn.Conv2d(dim, dim, 3, padding=1, bias=False),
                                                  nn.GroupNorm(groups, dim), nn.ReLU(inplace=True))
                                    for _ in range(levels))
        self.drop = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(dim, num_classes, 1)

    @classmethod
    def for_backbone(cls, model: nn.Module, num_classes: int, dim: int = 64, **kw) -> SegmentationHead:
        """A head for `model`'s maps; a plain model's pyramid has strides 4, 8, 16, 32 from its patch stride."""
        widths, plain = backbone_widths(model), is_plain(model)
        if plain and "scales" not in kw:
            kw["scales"] = scales_for(model.feature_info[-1]["reduction"])
        return cls(widths, num_classes, dim, plain=plain, **kw)

    def forward(self, maps: list[torch.Tensor], size: tuple[int, int]) -> torch.Tensor:
        feats = self.neck(maps[-1]) if self.plain else [proj(m) for proj, m in zip(self.neck, maps)]
        for i in range(len(feats) - 2, -1, -1):  # top-down: coarse context into every finer level
            feats[i] = feats[i] + F.interpolate(feats[i + 1], size=feats[i].shape[-2:], mode="bilinear",
                                                align_corners=False)
        fine = feats[0].shape[-2:]
        fused = sum(F.interpolate(s(f), size=fine, mode="bilinear", align_corners=False) if f.shape[-2:] != fine
                    else s(f) for s, f in zip(self.smooth, feats))  # [B, dim, H0, W0]
        logits = self.classifier(self.drop(fused))  # [B, K, H0, W0]
        return F.interpolate(logits, size=tuple(size), mode="bilinear", align_corners=False)  # [B, K, H, W]


class Segmenter(nn.Module):
    """A backbone of any family with a segmentation head: images [B, C, H, W] -> logits [B, K, H, W]."""

    def __init__(self, backbone: nn.Module, num_classes: int, dim: int = 64, **head_kw):
        super().__init__()
        self.backbone = backbone
        self.head = SegmentationHead.for_backbone(backbone, num_classes, dim, **head_kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(backbone_maps(self.backbone, x), x.shape[-2:])
