"""DINO v1 training checkpoints with their projection head -> the `dino` family (models/dino.py).

facebookresearch/dino saves `{'teacher': {backbone.*, head.*}, 'student': {module.backbone.*, module.head.*},
'optimizer', 'epoch', 'args', 'dino_loss'}`; weights.convert picks the teacher (DINO evaluates and releases it)
and strips `backbone.`, keeping `head.*`. The backbone is in timm's names; the head is DINOHead: Linear layers
`mlp.{i}` (BatchNorm between them with use_bn), GELUs, and the weight-normalised `last_layer.weight_g` [K, 1] /
`weight_v` [K, bottleneck] (or torch's newer `parametrizations.weight.original0/1`).

Read off the shapes: hidden and bottleneck widths, the number of layers, BatchNorm, K; `norm_last_layer` from
weight_g (DINO freezes it at 1). A backbone-only file (DINO's `dino_deitsmall16_pretrain.pth`) stays a ViT.
"""
from __future__ import annotations

import re

import torch

from ...errors import CheckpointError
from ...models.config import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ...models.dino import DinoConfig
from ..infer import infer_config
from ..layouts import Imported, StateDict, layout
from .timm_native import convert_timm

_HEAD = "head."
_G_NAMES = ("head.last_layer.weight_g", "head.last_layer.parametrizations.weight.original0")
_V_NAMES = ("head.last_layer.weight_v", "head.last_layer.parametrizations.weight.original1")
# DINO's eval_knn / eval_linear: ImageNet statistics, bicubic resize to 256, crop 224
_DINO_PREPROCESS = Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", 0.875)


def _is_dino_with_head(sd: StateDict) -> bool:
    return "patch_embed.proj.weight" in sd and any(k in sd for k in _V_NAMES)


def head_config(head: StateDict) -> dict:
    """DinoConfig's head fields from a DINOHead state dict in DINO's names (without the `head.` prefix)."""
    weight_g = next((head[k[len(_HEAD):]] for k in _G_NAMES if k[len(_HEAD):] in head), None)
    weight_v = next((head[k[len(_HEAD):]] for k in _V_NAMES if k[len(_HEAD):] in head), None)
    if weight_g is None or weight_v is None:
        raise CheckpointError("DINO head without last_layer.weight_g / weight_v")
    if "mlp.weight" in head:  # nlayers=1: one Linear straight to the bottleneck
        linears = [head["mlp.weight"]]
        use_bn = False
    else:
        idx = sorted(int(m.group(1)) for k in head if (m := re.match(r"mlp\.(\d+)\.weight$", k)))
        linears = [head[f"mlp.{i}.weight"] for i in idx if head[f"mlp.{i}.weight"].ndim == 2]
        use_bn = any(k.startswith("mlp.") and k.endswith(".running_mean") for k in head)
    if not linears:
        raise CheckpointError("DINO head without mlp Linear layers")
    return {"out_dim": int(weight_v.shape[0]), "bottleneck_dim": int(weight_v.shape[1]),
            "hidden_dim": int(linears[0].shape[0]) if len(linears) > 1 else 2048, "head_layers": len(linears),
            "use_bn": use_bn, "norm_last_layer": bool(torch.all(weight_g == 1))}


@layout("dino", _is_dino_with_head, priority=6, family="dino")
def convert_dino(sd: StateDict, hf_config=None) -> Imported:
    backbone = convert_timm({k: v for k, v in sd.items() if not k.startswith(_HEAD)}, hf_config)
    head = {k[len(_HEAD):]: v for k, v in sd.items() if k.startswith(_HEAD)}
    vit = infer_config(backbone.state_dict, backbone.hints, source="the DINO checkpoint")
    cfg = DinoConfig(backbone=vit, **head_config(head))
    first = head.get("mlp.weight", head.get("mlp.0.weight"))  # [hidden or bottleneck, D]
    if first is None or first.shape[1] != vit.embed_dim:
        raise CheckpointError(f"the DINO head's first layer does not take the backbone's {vit.embed_dim} features")
    out = {f"backbone.{k}": v for k, v in backbone.state_dict.items()} | {f"dino_head.{k}": v for k, v in head.items()}
    return Imported(out, "dino", backbone.hints, backbone.dropped,
                    preprocess=backbone.preprocess or _DINO_PREPROCESS, family="dino", config=cfg)
