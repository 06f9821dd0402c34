"""The `resnet` family: torchvision's ResNets as same-pipeline CNN baselines, with the model protocol.

A subclass of torchvision's ResNet, so state-dict keys are torchvision's (`conv1`, `layer1.0.conv1`, `fc`).
`small_stem` replaces the 7x7/2 conv and max-pool with a 3x3/1 conv (the CIFAR stem) for 28-32 px images.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torchvision.models import resnet as tv_resnet

from ..errors import ConfigError
from .config import ModelConfig, Preprocess
from .features import check_output_fmt, feature_take_indices
from .registry import register_family, register_model

# arch -> (block, layers per stage)
ARCHS = {
    "resnet18": (tv_resnet.BasicBlock, (2, 2, 2, 2)),
    "resnet34": (tv_resnet.BasicBlock, (3, 4, 6, 3)),
    "resnet50": (tv_resnet.Bottleneck, (3, 4, 6, 3)),
}


@dataclass
class ResNetConfig(ModelConfig):
    _what = "ResNet config"

    arch: str = "resnet18"
    num_classes: int = 10
    in_chans: int = 3
    img_size: tuple[int, int] = (32, 32)  # the size it is trained and evaluated at (any size runs)
    small_stem: bool = True

    def __post_init__(self):
        if isinstance(self.img_size, int):
            self.img_size = (self.img_size, self.img_size)
        self.img_size = (int(self.img_size[0]), int(self.img_size[1]))
        if self.arch not in ARCHS:
            raise ConfigError(f"unknown ResNet {self.arch!r}; known: {', '.join(ARCHS)}")
        if self.num_classes < 0 or self.in_chans < 1:
            raise ConfigError("num_classes must be >= 0 and in_chans >= 1")


class ResNet(tv_resnet.ResNet):
    head_names = ("fc",)
    capabilities = frozenset({"intermediates"})  # no attention maps, no position table, no closed-form cost
    output_fmts = ("NCHW",)  # what forward_intermediates gives (models/features.py)
    fits_data = True  # a conv net runs at any size: from scratch it is built at the data's size and channels

    def __init__(self, cfg: ResNetConfig | None = None, *, preprocess: Preprocess | None = None,
                 class_names=None, provenance=None, **overrides):
        cfg = (cfg or ResNetConfig()).replace(**overrides) if overrides else (cfg or ResNetConfig())
        block, layers = ARCHS[cfg.arch]
        super().__init__(block, list(layers), num_classes=max(cfg.num_classes, 1))
        self.cfg = cfg
        if cfg.small_stem:  # 28x28 or 32x32 inputs: keep resolution in the stem
            self.conv1 = nn.Conv2d(cfg.in_chans, 64, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        elif cfg.in_chans != 3:
            self.conv1 = nn.Conv2d(cfg.in_chans, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.num_features = self.fc.in_features
        self.num_classes = cfg.num_classes
        if not cfg.num_classes:
            self.fc = nn.Identity()
        pre = preprocess or Preprocess((0.5,), (0.5,), "bilinear", 1.0)
        self.preprocess = dataclasses.replace(pre, input_size=(cfg.in_chans, *cfg.img_size)).for_channels(cfg.in_chans)
        self.class_names = list(class_names) if class_names else None
        self.provenance = dict(provenance or {"arch": cfg.arch})

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> the last stage's feature map [B, F, H/s, W/s]."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    @property
    def feature_info(self) -> list[dict]:
        """timm's five maps: the stem's activation, then layer1..layer4 (timm names the stem `act1`,
        torchvision `relu`). The 7x7/2 stem and max-pool give strides 2, 4, 8, 16, 32; the small stem
        (3x3/1, no pool) 1, 1, 2, 4, 8."""
        block, _ = ARCHS[self.cfg.arch]
        stem, pool = (1, 1) if self.cfg.small_stem else (2, 2)
        info = [dict(num_chs=self.bn1.num_features, reduction=stem, module="relu")]
        for i in range(4):  # layer1 keeps the stride, each later one halves the map
            info.append(dict(num_chs=64 * 2 ** i * block.expansion, reduction=stem * pool * 2 ** i,
                             module=f"layer{i + 1}"))
        return info

    def forward_intermediates(self, x: torch.Tensor, indices=None, *, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False):
        """The maps of `feature_info` that `indices` picks, NCHW (timm's; see models/features.py). A ResNet has
        no final norm, so `norm` changes nothing. Returns (the last stage's map, maps) unless
        `intermediates_only`; after `stop_early` the final map is the deepest one run (timm's)."""
        check_output_fmt(output_fmt, self.output_fmts)
        take, last = feature_take_indices(len(self.feature_info), indices)
        x = self.relu(self.bn1(self.conv1(x)))  # [B, 64, H/s, W/s]
        outs = [x] if 0 in take else []
        x = self.maxpool(x)
        for i, layer in enumerate((self.layer1, self.layer2, self.layer3, self.layer4), start=1):
            if (stop_early or intermediates_only) and i > last:  # nothing later is returned
                break
            x = layer(x)  # [B, F_i, h, w]
            if i in take:
                outs.append(x)
        return outs if intermediates_only else (x, outs)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        feats = torch.flatten(self.avgpool(x), 1)  # [B, F]
        return feats if pre_logits else self.fc(feats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def no_weight_decay(self) -> set[str]:
        return set()  # norms and biases are excluded by the optimiser already

    def group_matcher(self, coarse: bool = False) -> dict:
        """Stem, then one group per residual block (per stage when coarse); `fc` is the last group."""
        return {"stem": r"^conv1|^bn1|^maxpool",
                "blocks": r"^layer(\d+)" if coarse else r"^layer(\d+)\.(\d+)"}

    def get_classifier(self) -> nn.Module:
        return self.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool not in (None, "avg"):
            raise ConfigError("a ResNet pools by average only")
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        self.fc = nn.Linear(self.num_features, num_classes, device=self.conv1.weight.device) if num_classes else nn.Identity()
        if self.class_names is not None and len(self.class_names) != num_classes:
            self.class_names = None


register_family("resnet", ResNetConfig, ResNet)
for _arch in ARCHS:
    register_model(_arch, "resnet", ResNetConfig(arch=_arch), group="cnn-baseline", mean=(0.5,), std=(0.5,),
                   crop_pct=1.0, interpolation="bilinear",
                   notes="torchvision ResNet with a 3x3 stride-1 stem (no max-pool) for small images")
