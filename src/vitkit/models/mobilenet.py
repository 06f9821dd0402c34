"""The `mobilenet` family: torchvision's MobileNetV3 (small, large), the small-CNN row of the edge table, with the
model protocol and the feature contract.

A subclass of torchvision's MobileNetV3 built from torchvision's own configuration, so the state-dict keys are
torchvision's (`features.0.0.weight`, `classifier.3.weight`) and a torchvision checkpoint loads as it is.
timm's `mobilenetv3_*` names are not aliases: timm's layout (conv_stem, blocks.*, conv_head) and head differ.
The classifier is torchvision's: pooled features -> Linear -> Hardswish -> Dropout -> Linear, so `pre_logits`
is the 1024-d (small) / 1280-d (large) vector before the last Linear.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torchvision.models import mobilenetv3 as tv_mobilenet

from ..errors import ConfigError
from .config import ModelConfig, Preprocess
from .features import check_output_fmt, feature_take_indices
from .registry import register_family, register_model

ARCHS = ("mobilenet_v3_small", "mobilenet_v3_large")


@dataclass
class MobileNetConfig(ModelConfig):
    _what = "MobileNetV3 config"

    arch: str = "mobilenet_v3_small"
    num_classes: int = 1000
    in_chans: int = 3
    img_size: tuple[int, int] = (224, 224)  # the size it is trained and evaluated at (any size runs)
    width_mult: float = 1.0
    drop_rate: float = 0.2  # the classifier's dropout (torchvision's `dropout`)

    def __post_init__(self):
        if isinstance(self.img_size, int):
            self.img_size = (self.img_size, self.img_size)
        self.img_size = (int(self.img_size[0]), int(self.img_size[1]))
        if self.arch not in ARCHS:
            raise ConfigError(f"unknown MobileNetV3 {self.arch!r}; known: {', '.join(ARCHS)}")
        if self.num_classes < 0 or self.in_chans < 1 or self.width_mult <= 0 or not 0 <= self.drop_rate < 1:
            raise ConfigError("num_classes must be >= 0, in_chans >= 1, width_mult > 0 and drop_rate in [0, 1)")


class MobileNetV3(tv_mobilenet.MobileNetV3):
    head_names = ("classifier",)
    capabilities = frozenset({"intermediates"})  # no attention maps, no position table, no closed-form cost
    output_fmts = ("NCHW",)
    fits_data = True  # a conv net runs at any size: from scratch it is built at the data's size and channels

    def __init__(self, cfg: MobileNetConfig | None = None, *, preprocess: Preprocess | None = None,
                 class_names=None, provenance=None, **overrides):
        cfg = (cfg or MobileNetConfig()).replace(**overrides) if overrides else (cfg or MobileNetConfig())
        setting, last_channel = tv_mobilenet._mobilenet_v3_conf(cfg.arch, width_mult=cfg.width_mult)
        super().__init__(setting, last_channel, num_classes=max(cfg.num_classes, 1), dropout=cfg.drop_rate)
        self.cfg = cfg
        stem = self.features[0][0]
        if cfg.in_chans != stem.in_channels:
            self.features[0][0] = nn.Conv2d(cfg.in_chans, stem.out_channels, 3, stride=2, padding=1, bias=False)
        # the stride of each `features` entry: the stem's 2, then each block's, the last 1x1 conv's 1
        self._strides = [2, *(c.stride for c in setting), 1]
        self.num_features = last_channel  # what forward_head(pre_logits=True) gives
        self.num_classes = cfg.num_classes
        if not cfg.num_classes:
            self.classifier[3] = nn.Identity()
        pre = preprocess or Preprocess((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "bilinear", 0.875)
        self.preprocess = dataclasses.replace(pre, input_size=(cfg.in_chans, *cfg.img_size)).for_channels(cfg.in_chans)
        self.class_names = list(class_names) if class_names else None
        self.provenance = dict(provenance or {"arch": cfg.arch})

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> the last feature map [B, 576 | 960, H/32, W/32]."""
        return self.features(x)

    @property
    def feature_info(self) -> list[dict]:
        """One map per stride (2, 4, 8, 16, 32): the last `features` entry at each, as timm's MobileNetV3."""
        info, reduction = [], 1
        for i, (module, stride) in enumerate(zip(self.features, self._strides)):
            reduction *= stride
            out = module.out_channels if hasattr(module, "out_channels") else module[0].out_channels
            entry = dict(num_chs=out, reduction=reduction, module=f"features.{i}")
            if info and info[-1]["reduction"] == reduction:
                info[-1] = entry
            else:
                info.append(entry)
        return info

    def forward_intermediates(self, x: torch.Tensor, indices=None, *, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False):
        """The maps of `feature_info` that `indices` picks, NCHW (timm's; see models/features.py); no final norm,
        so `norm` changes nothing. Returns (the last map, maps) unless `intermediates_only`."""
        check_output_fmt(output_fmt, self.output_fmts)
        info = self.feature_info
        take, last = feature_take_indices(len(info), indices)
        wanted = {int(info[i]["module"].split(".")[1]): i for i in take}
        stop = int(info[last]["module"].split(".")[1])
        outs = []
        for i, module in enumerate(self.features):
            if (stop_early or intermediates_only) and i > stop:
                break
            x = module(x)  # [B, C_i, h, w]
            if i in wanted:
                outs.append(x)
        return outs if intermediates_only else (x, outs)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        feats = torch.flatten(self.avgpool(x), 1)  # [B, C]
        hidden = self.classifier[2](self.classifier[1](self.classifier[0](feats)))  # [B, num_features]
        return hidden if pre_logits else self.classifier[3](hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def no_weight_decay(self) -> set[str]:
        return set()  # norms and biases are excluded by the optimiser already

    def group_matcher(self, coarse: bool = False) -> dict:
        """The stem, then one group per block; the classifier is the last group."""
        return {"stem": r"^features\.0\.", "blocks": r"^features\.(\d+)"}

    def get_classifier(self) -> nn.Module:
        return self.classifier[3]

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool not in (None, "avg"):
            raise ConfigError("a MobileNetV3 pools by average only")
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        device = self.classifier[0].weight.device
        self.classifier[3] = nn.Linear(self.num_features, num_classes, device=device) if num_classes else nn.Identity()
        if self.class_names is not None and len(self.class_names) != num_classes:
            self.class_names = None


register_family("mobilenet", MobileNetConfig, MobileNetV3)
for _arch in ARCHS:
    register_model(_arch, "mobilenet", MobileNetConfig(arch=_arch), group="cnn-edge",
                   crop_pct=0.875, interpolation="bilinear",
                   notes="torchvision's MobileNetV3 (its own module and keys): the small-CNN baseline of the edge row")
