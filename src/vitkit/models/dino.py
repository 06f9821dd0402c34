"""The `dino` family: a DINO (Caron et al. 2021) backbone with its projection head, as a DINO training checkpoint
holds them (facebookresearch/dino `{'teacher': {backbone.*, head.*}, 'student': ...}`).

Key names: `backbone.*` (a VisionTransformer, timm's names) and `dino_head.*` (layers.dino_head: DINO's own
`mlp.{i}`, `last_layer.weight_g/_v`). As a VitkitModel it is its backbone (models/towers.py); `model(images,
prototypes=True)` runs the head: the scores [B, out_dim] of the L2-normalised bottleneck against the prototypes,
what DINO's loss compares between teacher and student.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ConfigError
from ..layers.dino_head import DinoHead
from . import vit_variants  # noqa: F401  (registers the backbones the names below are built on)
from .config import Preprocess, ViTConfig
from .registry import get_entry, register_family, register_model
from .towers import ImageTowerModel, TowerConfig
from .vision_transformer import VisionTransformer


def _dino_backbone(name: str = "vit_small_patch16_224") -> ViTConfig:
    return get_entry(name).cfg.replace(num_classes=0)  # DINO's backbones end at the class token


@dataclass
class DinoConfig(TowerConfig):
    _what = "DINO config"
    tower_field = "backbone"

    backbone: ViTConfig = field(default_factory=_dino_backbone)
    out_dim: int = 65536  # prototypes K (DINO's ImageNet value)
    hidden_dim: int = 2048
    bottleneck_dim: int = 256
    head_layers: int = 3
    use_bn: bool = False  # DINO: False for a ViT
    norm_last_layer: bool = True  # prototypes of norm 1 (weight_g frozen at 1)

    def __post_init__(self):
        super().__post_init__()
        if min(self.out_dim, self.hidden_dim, self.bottleneck_dim, self.head_layers) <= 0:
            raise ConfigError("out_dim, hidden_dim, bottleneck_dim and head_layers must be positive")


class DinoModel(ImageTowerModel):
    """`backbone` (a VisionTransformer) and `dino_head` (DinoHead on its pooled features)."""

    image_attr = "backbone"
    towers = {"image": ("backbone", "backbone")}  # name -> (module, config field): load_model(path, tower="image")
    head_names = ("backbone.head", "backbone.head_dist")
    capabilities = frozenset({"intermediates"})  # attention maps and the token seam: `model.backbone`

    def __init__(self, cfg: DinoConfig | None = None, *, preprocess: Preprocess | None = None, class_names=None,
                 provenance=None, **overrides):
        super().__init__()
        cfg = cfg or DinoConfig()
        cfg = cfg.replace(**overrides) if overrides else cfg
        self.cfg = cfg
        self.backbone = VisionTransformer(cfg.backbone, preprocess=preprocess)
        self.preprocess = self.backbone.preprocess
        self.num_classes = cfg.num_classes
        self.num_features = self.embed_dim = self.backbone.num_features
        self.class_names = list(class_names) if class_names else None
        self.provenance = dict(provenance or {})
        self.dino_head = DinoHead(self.num_features, cfg.out_dim, hidden_dim=cfg.hidden_dim,
                                  bottleneck_dim=cfg.bottleneck_dim, nlayers=cfg.head_layers, use_bn=cfg.use_bn,
                                  norm_last_layer=cfg.norm_last_layer)

    def forward(self, images: torch.Tensor, prototypes: bool = False) -> torch.Tensor:
        """The backbone's output [B, K or D]; with `prototypes`, the DINO head's scores [B, out_dim]."""
        if not prototypes:
            return self.backbone(images)
        feats = self.backbone.forward_head(self.backbone.forward_features(images), pre_logits=True)  # [B, D]
        return self.dino_head(feats)


register_family("dino", DinoConfig, DinoModel)

# DINO's released ViTs with their training head (facebookresearch/dino: 65536 prototypes, no BatchNorm); the
# full checkpoints (dino_deitsmall16_pretrain_full_checkpoint.pth, ...) are DINO's own files, read by load_model.
for _name, _backbone in (("dino_vit_small_patch16", "vit_small_patch16_224"),
                         ("dino_vit_base_patch16", "vit_base_patch16_224")):
    register_model(_name, "dino", DinoConfig(backbone=_dino_backbone(_backbone)), group="dino", crop_pct=0.875,
                   notes=f"DINO: the {_backbone} backbone with its projection head (65536 prototypes)")
