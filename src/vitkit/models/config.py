"""The typed architecture config. Everything needed to rebuild a model travels in this one dataclass."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ConfigError
from ..typed_config import JsonConfig

POOLS = ("token", "avg", "max")
POS_EMBEDS = ("learn", "sincos", "none")
ACTS = ("gelu", "gelu_tanh", "quick_gelu")
INITS = ("jax", "timm", "moco", "zero_head")


@dataclass
class ViTConfig(JsonConfig):
    _what = "ViT config"

    img_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    qk_norm: bool = False
    init_values: float | None = None  # LayerScale init; None = no LayerScale
    class_token: bool = True
    distilled: bool = False  # DeiT distillation token + second head
    num_reg_tokens: int = 0  # "registers" (Darcet et al.)
    pos_embed: str = "learn"  # learn | sincos (fixed 2D) | none
    # Position-embedding layout: do the prefix tokens (class, distillation, registers) get a row of the
    # position table? True: concatenate prefix tokens, then add positions (ViT, DeiT, timm default).
    # False: add positions to patches only, then concatenate (DeiT III, big_vision, DINOv2 with registers).
    prefix_pos: bool = True
    global_pool: str = "token"  # token | avg | max
    fc_norm: bool | None = None  # norm after pooling instead of before; None = True for avg/max pooling
    final_norm: bool = True
    pre_norm: bool = False  # LayerNorm before the blocks (CLIP's ln_pre)
    patch_bias: bool = True  # CLIP's patch conv has no bias
    act: str = "gelu"
    norm_eps: float = 1e-6
    representation_size: int | None = None  # pre-logits Linear+tanh (original i21k checkpoints)
    drop_rate: float = 0.0  # before the head
    pos_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    weight_init: str = "timm"
    # how the stored position table is resized to a new grid (load time and run time)
    pos_interpolation: str = "bicubic"
    pos_antialias: bool = True

    def __post_init__(self):
        if isinstance(self.img_size, int):
            self.img_size = (self.img_size, self.img_size)
        self.img_size = (int(self.img_size[0]), int(self.img_size[1]))
        self.validate()

    def validate(self) -> None:
        def need(cond: bool, msg: str):
            if not cond:
                raise ConfigError(msg)

        need(self.global_pool in POOLS, f"global_pool must be one of {POOLS}, got {self.global_pool!r}")
        need(self.pos_embed in POS_EMBEDS, f"pos_embed must be one of {POS_EMBEDS}, got {self.pos_embed!r}")
        need(self.act in ACTS, f"act must be one of {ACTS}, got {self.act!r}")
        need(self.weight_init in INITS, f"weight_init must be one of {INITS}, got {self.weight_init!r}")
        need(self.pos_interpolation in ("bicubic", "bilinear", "nearest"), "pos_interpolation: bicubic|bilinear|nearest")
        need(self.patch_size > 0, f"patch_size must be positive, got {self.patch_size}")
        need(self.in_chans > 0, f"in_chans must be positive, got {self.in_chans}")
        need(self.num_classes >= 0, f"num_classes must be >= 0, got {self.num_classes}")
        need(self.depth >= 0 and self.embed_dim > 0 and self.num_heads > 0, "depth, embed_dim, num_heads must be positive")
        need(self.embed_dim % self.num_heads == 0, f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        for side in self.img_size:
            need(side > 0 and side % self.patch_size == 0,
                 f"img_size {self.img_size[0]}x{self.img_size[1]} is not divisible by patch size {self.patch_size}")
        need(not (self.global_pool == "token" and not self.class_token),
             "global_pool='token' needs a class token; use global_pool='avg' or class_token=True")
        need(not (self.distilled and not self.class_token), "a distilled model needs a class token")
        need(not (self.pos_embed == "sincos" and self.embed_dim % 4), "sincos position embedding needs embed_dim % 4 == 0")

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + int(self.distilled) + self.num_reg_tokens

    @property
    def use_fc_norm(self) -> bool:
        return self.global_pool in ("avg", "max") if self.fc_norm is None else self.fc_norm

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    def replace(self, **overrides: Any) -> ViTConfig:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown model option(s) {unknown}; valid options: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **overrides)


@dataclass
class Preprocess(JsonConfig):
    """How inputs must be prepared for a set of weights (torchvision weight-enum style)."""

    _strict = False  # extra keys written by other tools are ignored

    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    interpolation: str = "bicubic"
    crop_pct: float = 0.9
    input_size: tuple[int, int, int] = (3, 224, 224)


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
INCEPTION_MEAN, INCEPTION_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def default_preprocess(cfg: ViTConfig, mean=IMAGENET_MEAN, std=IMAGENET_STD, **kw) -> Preprocess:
    if cfg.in_chans != len(mean):
        mean, std = (sum(mean) / len(mean),) * cfg.in_chans, (sum(std) / len(std),) * cfg.in_chans
    return Preprocess(mean=tuple(mean), std=tuple(std), input_size=(cfg.in_chans, *cfg.img_size), **kw)

