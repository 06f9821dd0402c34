"""The `mobilevit` family: MobileViT v1 (Mehta & Rastegari 2021; `mobilevit_xxs/xs/s`) and v2 (separable linear
attention, Mehta & Rastegari 2022; `mobilevitv2_050` ... `200`), the mobile hybrid of the edge row, with the model
protocol and the feature contract.

The module tree and state-dict keys are timm's (its ByobNet build of these models: `stem.conv`,
`stages.{i}.{j}.conv1_1x1.conv`, `stages.{i}.1.transformer.{k}.attn.qkv`, `final_conv.conv`, `head.fc`), so a
timm checkpoint loads as it is; Hugging Face transformers' MobileViT / MobileViTV2 files are renamed onto these keys
(weights/importers/hf_mobilevit.py).

Layout (both versions): a 3x3/2 conv stem; stages 0 and 1 are MobileNetV2 inverted residuals (1x1 expand, 3x3
depthwise, linear 1x1; a residual where shape allows), stage 1 at stride 2; stages 2, 3, 4 each downsample with
one inverted residual and then run one MobileViT block. A v1 block ("mobilevit"): 3x3 conv, 1x1 to the transformer
width, the map unfolded into 2x2 patches so each of the P = 4 pixel positions attends over the N patches (timm's
ViT blocks, SiLU MLP), folded back, 1x1 back to the stage width and fused with the block's input by a 3x3 conv. A v2
block ("mobilevit2"): depthwise 3x3, 1x1, the same unfolding into [B, C, P, N] but separable linear attention
(one context vector per pixel position, cost linear in N) with 1x1-conv MLPs and GroupNorm(1), then a linear 1x1.
v1 ends in a 1x1 conv to `num_features`; v2 has none (`num_features` = 0 in the config, timm's convention).
Outputs are timm's with the same weights; v2 differs only where 2x2 patches do not tile a map (sizes not a multiple
of 64), where it resizes the map back so every map keeps its stride (MobileViTV2Block).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..layers.block import Block, DropPath
from ..layers.hybrid_embed import ConvNormAct
from ..layers.pooling import AvgPoolClassifier
from .config import ModelConfig, Preprocess
from .features import check_output_fmt, feature_take_indices
from .registry import Pretrained, register_family, register_model

BLOCKS = ("mobilevit", "mobilevit2")  # timm's block type names: v1's multi-head attention, v2's linear attention
TRANSFORMER_STAGES = 3  # stages 2, 3, 4 carry a MobileViT block


def make_divisible(value: float, divisor: int = 8, round_limit: float = 0.9) -> int:
    """The nearest multiple of `divisor` (at least `divisor`), one more when rounding lost over 10% (timm's rule)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < round_limit * value else new


@dataclass
class MobileViTConfig(ModelConfig):
    _what = "MobileViT config"

    block: str = "mobilevit"  # mobilevit (v1) | mobilevit2 (v2)
    num_classes: int = 1000
    in_chans: int = 3
    img_size: tuple[int, int] = (256, 256)  # the size it is trained and evaluated at (any size runs)
    stem_chs: int = 16
    stage_chs: tuple[int, ...] = (16, 24, 48, 64, 80)  # output width of stages 0-4
    conv_depths: tuple[int, int] = (1, 3)  # inverted residuals in stages 0 and 1
    transformer_dims: tuple[int, int, int] = (64, 80, 96)  # the MobileViT blocks' widths (stages 2-4)
    transformer_depths: tuple[int, int, int] = (2, 4, 3)  # transformer layers in each MobileViT block
    expand_ratio: float = 2.0  # inverted residuals' hidden width / input width
    mlp_ratio: float = 2.0
    num_heads: int = 4  # v1's attention heads (v2's linear attention has none)
    patch_size: int = 2  # the unfolding's patch side, in map pixels
    num_features: int = 320  # the final 1x1 conv's width; 0: no final conv (v2)
    drop_rate: float = 0.0  # before the classifier
    drop_path_rate: float = 0.0

    def __post_init__(self):
        if isinstance(self.img_size, int):
            self.img_size = (self.img_size, self.img_size)
        self.img_size = (int(self.img_size[0]), int(self.img_size[1]))
        for name, count in (("stage_chs", 2 + TRANSFORMER_STAGES), ("conv_depths", 2),
                            ("transformer_dims", TRANSFORMER_STAGES), ("transformer_depths", TRANSFORMER_STAGES)):
            value = tuple(int(v) for v in getattr(self, name))
            if len(value) != count or min(value) < 1:
                raise ConfigError(f"MobileViT {name} needs {count} positive entries, got {value}")
            setattr(self, name, value)
        if self.block not in BLOCKS:
            raise ConfigError(f"unknown MobileViT block {self.block!r}; known: {', '.join(BLOCKS)}")
        if self.block == "mobilevit":
            bad = [d for d in self.transformer_dims if d % self.num_heads]
            if self.num_heads < 1 or bad:
                raise ConfigError(f"MobileViT transformer widths {bad} are not divisible by {self.num_heads} heads")
        if self.stem_chs < 1 or self.patch_size < 1 or self.expand_ratio <= 0 or self.mlp_ratio <= 0:
            raise ConfigError("stem_chs and patch_size must be >= 1, expand_ratio and mlp_ratio > 0")
        if self.num_classes < 0 or self.in_chans < 1 or self.num_features < 0:
            raise ConfigError("num_classes and num_features must be >= 0 and in_chans >= 1")
        if not (0 <= self.drop_rate < 1 and 0 <= self.drop_path_rate < 1):
            raise ConfigError("drop_rate and drop_path_rate must be in [0, 1)")


def _conv(in_chs: int, out_chs: int, kernel: int = 1, stride: int = 1, groups: int = 1, act: bool = True):
    """conv (no bias, 'same' padding) -> BatchNorm -> SiLU (or none): timm's ConvNormAct keys (`conv`, `bn`)."""
    return ConvNormAct(in_chs, out_chs, kernel, stride, kernel // 2, nn.SiLU if act else nn.Identity, groups=groups)


class InvertedResidual(nn.Module):
    """1x1 expand -> 3x3 depthwise (the stride) -> linear 1x1, plus the input when the shape is kept (MobileNetV2;
    timm's BottleneckBlock with bottle_in, linear_out and depthwise groups, its key names)."""

    def __init__(self, in_chs: int, out_chs: int, stride: int, expand_ratio: float, drop_path: float = 0.0):
        super().__init__()
        mid = make_divisible(in_chs * expand_ratio)
        self.residual = stride == 1 and in_chs == out_chs
        self.conv1_1x1 = _conv(in_chs, mid)
        self.conv2_kxk = _conv(mid, mid, 3, stride, groups=mid)
        self.conv3_1x1 = _conv(mid, out_chs, act=False)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv3_1x1(self.conv2_kxk(self.conv1_1x1(x)))  # [B, out, H/s, W/s]
        return x + self.drop_path(y) if self.residual else y


def _whole_patches(size: tuple[int, int], patch: int) -> tuple[int, int]:
    """The map size rounded up to whole patches (the blocks resize a map that patches do not tile)."""
    return math.ceil(size[0] / patch) * patch, math.ceil(size[1] / patch) * patch


class MobileViTBlock(nn.Module):
    """v1: local 3x3 conv, 1x1 to width D, global attention among patches at each of the P pixel positions,
    1x1 back, fused with the input by a 3x3 conv over both."""

    def __init__(self, chs: int, dim: int, depth: int, cfg: MobileViTConfig, drop_path: float = 0.0):
        super().__init__()
        self.patch_size = cfg.patch_size
        self.conv_kxk = _conv(chs, chs, 3)
        self.conv_1x1 = nn.Conv2d(chs, dim, 1, bias=False)
        self.transformer = nn.Sequential(*[
            Block(dim, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, act="silu", eps=1e-5, drop_path=drop_path)
            for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.conv_proj = _conv(dim, chs)
        self.conv_fusion = _conv(2 * chs, chs, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.conv_1x1(self.conv_kxk(x))  # [B, D, H, W]
        B, D, H, W = x.shape
        p = self.patch_size
        Hp, Wp = _whole_patches((H, W), p)
        if (Hp, Wp) != (H, W):  # the original resizes rather than pads, so attention needs no mask
            x = F.interpolate(x, size=(Hp, Wp), mode="bilinear", align_corners=False)
        nh, nw = Hp // p, Wp // p
        # [B, D, nh, p, nw, p] -> [B, p, p, nh, nw, D] -> [B * P, N, D]: one sequence per pixel position
        x = x.reshape(B, D, nh, p, nw, p).permute(0, 3, 5, 2, 4, 1).reshape(B * p * p, nh * nw, D)
        x = self.norm(self.transformer(x))  # [B * P, N, D]
        x = x.reshape(B, p, p, nh, nw, D).permute(0, 5, 3, 1, 4, 2).reshape(B, D, Hp, Wp)  # fold back
        if (Hp, Wp) != (H, W):
            x = F.interpolate(x, size=(H, W), mode="bilinear", align_corners=False)
        return self.conv_fusion(torch.cat((shortcut, self.conv_proj(x)), dim=1))  # [B, C, H, W]


class GroupNorm1(nn.GroupNorm):
    """GroupNorm with one group: LayerNorm over (C, P, N) of each sample (timm's GroupNorm1, keys weight, bias)."""

    def __init__(self, channels: int):
        super().__init__(1, channels)


class LinearSelfAttention(nn.Module):
    """Separable self-attention (MobileViTv2): one score per token from a 1-channel query, softmax over the N
    patches, a context vector that is the score-weighted sum of keys, times ReLU(values). Cost linear in N."""

    def __init__(self, dim: int, attn_drop: float = 0.0):
        super().__init__()
        self.dim = dim
        self.qkv_proj = nn.Conv2d(dim, 1 + 2 * dim, 1)  # rows: query (1) | keys (D) | values (D)
        self.attn_drop = nn.Dropout(attn_drop)
        self.out_proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([1, self.dim, self.dim], dim=1)  # [B, 1, P, N], [B, D, P, N] x 2
        scores = self.attn_drop(q.softmax(dim=-1))  # [B, 1, P, N]
        context = (k * scores).sum(dim=-1, keepdim=True)  # [B, D, P, 1]
        return self.out_proj(F.relu(v) * context)  # [B, D, P, N]


class ConvMlp(nn.Module):
    """1x1 conv -> SiLU -> 1x1 conv on [B, C, P, N] (timm's ConvMlp keys fc1, fc2)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.SiLU()
        self.fc2 = nn.Conv2d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class LinearTransformerBlock(nn.Module):
    """Pre-norm x + attn(norm1(x)), then x + mlp(norm2(x)), on [B, C, P, N] with GroupNorm(1) norms."""

    def __init__(self, dim: int, mlp_ratio: float, drop_path: float = 0.0):
        super().__init__()
        self.norm1 = GroupNorm1(dim)
        self.attn = LinearSelfAttention(dim)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = GroupNorm1(dim)
        self.mlp = ConvMlp(dim, int(dim * mlp_ratio))
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class MobileViTV2Block(nn.Module):
    """v2: depthwise 3x3, 1x1 to width D, linear attention over [B, D, P, N], fold back, linear 1x1 to C; no fusion.
    A map that patches do not tile is resized to whole patches first (timm's, align_corners=True) and, unlike timm's,
    back to its own size after the fold: timm's v2 keeps the enlarged map, so a later map is larger than its stride
    says (the feature contract's ceil(size / reduction), which the necks and the detector's anchors rely on).
    Where patches tile every map (sizes that are multiples of 64, the registered 256 included) nothing is resized
    and the outputs are timm's."""

    def __init__(self, chs: int, dim: int, depth: int, cfg: MobileViTConfig, drop_path: float = 0.0):
        super().__init__()
        self.patch_size = cfg.patch_size
        self.conv_kxk = _conv(chs, chs, 3, groups=chs)
        self.conv_1x1 = nn.Conv2d(chs, dim, 1, bias=False)
        self.transformer = nn.Sequential(*[LinearTransformerBlock(dim, cfg.mlp_ratio, drop_path)
                                           for _ in range(depth)])
        self.norm = GroupNorm1(dim)
        self.conv_proj = _conv(dim, chs, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        p = self.patch_size
        Hp, Wp = _whole_patches((H, W), p)
        if (Hp, Wp) != (H, W):
            x = F.interpolate(x, size=(Hp, Wp), mode="bilinear", align_corners=True)
        x = self.conv_1x1(self.conv_kxk(x))  # [B, D, Hp, Wp]
        D, nh, nw = x.shape[1], Hp // p, Wp // p
        # [B, D, nh, p, nw, p] -> [B, D, p, p, nh, nw] -> [B, D, P, N]
        x = x.reshape(B, D, nh, p, nw, p).permute(0, 1, 3, 5, 2, 4).reshape(B, D, p * p, nh * nw)
        x = self.norm(self.transformer(x))  # [B, D, P, N]
        x = x.reshape(B, D, p, p, nh, nw).permute(0, 1, 4, 2, 5, 3).reshape(B, D, Hp, Wp)  # fold back
        if (Hp, Wp) != (H, W):
            x = F.interpolate(x, size=(H, W), mode="bilinear", align_corners=True)
        return self.conv_proj(x)  # [B, C, H, W]




class MobileViT(nn.Module):
    head_names = ("head",)
    capabilities = frozenset({"intermediates"})  # no attention maps, no position table, no closed-form cost
    output_fmts = ("NCHW",)
    fits_data = True  # convolutions and resizable patch grids run at any size: built at the data's size and channels

    def __init__(self, cfg: MobileViTConfig | None = None, *, preprocess: Preprocess | None = None,
                 class_names=None, provenance=None, **overrides):
        super().__init__()
        cfg = (cfg or MobileViTConfig()).replace(**overrides) if overrides else (cfg or MobileViTConfig())
        self.cfg = cfg
        self.stem = _conv(cfg.in_chans, cfg.stem_chs, 3, 2)
        mobilevit_block = MobileViTBlock if cfg.block == "mobilevit" else MobileViTV2Block
        # timm's stage-wise drop-path rates: one rate per stage, rising linearly to drop_path_rate
        rates = torch.linspace(0, cfg.drop_path_rate, len(cfg.stage_chs), device="cpu").tolist()
        stages, prev = [], cfg.stem_chs
        for i, chs in enumerate(cfg.stage_chs):
            stride = 1 if i == 0 else 2
            if i < 2:
                blocks = [InvertedResidual(prev if j == 0 else chs, chs, stride if j == 0 else 1, cfg.expand_ratio,
                                           rates[i]) for j in range(cfg.conv_depths[i])]
            else:
                t = i - 2
                blocks = [InvertedResidual(prev, chs, stride, cfg.expand_ratio, rates[i]),
                          mobilevit_block(chs, cfg.transformer_dims[t], cfg.transformer_depths[t], cfg, rates[i])]
            stages.append(nn.Sequential(*blocks))
            prev = chs
        self.stages = nn.Sequential(*stages)
        self.final_conv = _conv(prev, cfg.num_features) if cfg.num_features else nn.Identity()
        self.num_features = cfg.num_features or prev  # what forward_head(pre_logits=True) gives
        self.num_classes = cfg.num_classes
        self.head = AvgPoolClassifier(self.num_features, cfg.num_classes, cfg.drop_rate)
        self._init_weights()
        pre = preprocess or Preprocess((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), "bicubic", 0.9)
        self.preprocess = dataclasses.replace(pre, input_size=(cfg.in_chans, *cfg.img_size)).for_channels(cfg.in_chans)
        self.class_names = list(class_names) if class_names else None
        self.provenance = dict(provenance or {"arch": cfg.block})

    def _init_weights(self) -> None:
        """timm's ByobNet init: convs normal(0, sqrt(2 / fan_out)), Linear normal(0, 0.01), BatchNorm 1 / 0, and the
        last BatchNorm of each residual inverted block zero, so every residual branch starts as the identity."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                nn.init.normal_(m.weight, 0, math.sqrt(2.0 / fan_out))
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, InvertedResidual) and m.residual:
                nn.init.zeros_(m.conv3_1x1.bn.weight)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> the last map [B, num_features, H/32, W/32]."""
        return self.final_conv(self.stages(self.stem(x)))

    @property
    def feature_info(self) -> list[dict]:
        """timm's five maps: stages 0-3 (strides 2, 4, 8, 16), then the final conv's output (stride 32; after stage 4,
        which it follows, and the map v2's Identity passes on)."""
        info = [dict(num_chs=c, reduction=2 ** (i + 1), module=f"stages.{i}") for i, c in enumerate(self.cfg.stage_chs)]
        return info[:-1] + [dict(num_chs=self.num_features, reduction=info[-1]["reduction"], module="final_conv")]

    def forward_intermediates(self, x: torch.Tensor, indices=None, *, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False):
        """The maps of `feature_info` that `indices` picks, NCHW (timm's; see models/features.py); no final norm,
        so `norm` changes nothing. Returns (forward_features' map, maps) unless `intermediates_only`; after
        `stop_early` the final map is the deepest one run (timm's)."""
        check_output_fmt(output_fmt, self.output_fmts)
        take, last = feature_take_indices(len(self.feature_info), indices)
        x = self.stem(x)  # [B, stem, H/2, W/2]
        outs = []
        for i, stage in enumerate(self.stages):  # map i is stage i's output; the last is the final conv's
            if (stop_early or intermediates_only) and i > last:
                break
            x = stage(x)  # [B, C_i, h, w]
            if i == len(self.stages) - 1:
                x = self.final_conv(x)
            if i in take:
                outs.append(x)
        return outs if intermediates_only else (x, outs)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def no_weight_decay(self) -> set[str]:
        return set()  # norms and biases are excluded by the optimiser already

    def group_matcher(self, coarse: bool = False) -> dict:
        """The stem, then one group per block (per stage when coarse), the final conv with the last; the head last."""
        return {"stem": r"^stem\.",
                "blocks": r"^stages\.(\d+)" if coarse else [(r"^stages\.(\d+)\.(\d+)", None),
                                                           (r"^final_conv", (99999,))]}

    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool not in (None, "avg"):
            raise ConfigError("a MobileViT pools by average only")
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        device = self.stem.conv.weight.device
        self.head.fc = nn.Linear(self.num_features, num_classes, device=device) if num_classes else nn.Identity()
        if self.class_names is not None and len(self.class_names) != num_classes:
            self.class_names = None


def _v2(multiplier: float) -> MobileViTConfig:
    """timm's `_mobilevitv2_cfg`: every width of (64, 128, 256, 384, 512) and the stem's 32 scaled (truncated), the
    transformer half the stage width."""
    chs = tuple(int(c * multiplier) for c in (64, 128, 256, 384, 512))
    return MobileViTConfig(block="mobilevit2", stem_chs=int(32 * multiplier), stage_chs=chs, conv_depths=(1, 2),
                           transformer_dims=tuple(make_divisible(0.5 * c) for c in chs[2:]), num_features=0)


# timm's variant tables (timm/models/mobilevit.py model_cfgs)
VARIANTS = {
    "mobilevit_xxs": MobileViTConfig(),
    "mobilevit_xs": MobileViTConfig(stage_chs=(32, 48, 64, 80, 96), transformer_dims=(96, 120, 144), expand_ratio=4.0,
                                    num_features=384),
    "mobilevit_s": MobileViTConfig(stage_chs=(32, 64, 96, 128, 160), transformer_dims=(144, 192, 240),
                                   expand_ratio=4.0, num_features=640),
    **{f"mobilevitv2_{m:03d}": _v2(m / 100) for m in (50, 75, 100, 125, 150, 175, 200)},
}

register_family("mobilevit", MobileViTConfig, MobileViT)
for _name, _cfg in VARIANTS.items():
    register_model(_name, "mobilevit", _cfg, group="mobile-hybrid", mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0),
                   crop_pct=0.9 if _cfg.block == "mobilevit" else 0.888, interpolation="bicubic",
                   pretrained={"cvnets_in1k": Pretrained(f"timm/{_name}.cvnets_in1k", license="cvnets-license")},
                   notes="MobileViT (timm's layout and keys): the mobile hybrid of the edge row")
