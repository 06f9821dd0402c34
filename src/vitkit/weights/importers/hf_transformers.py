"""Hugging Face transformers ViT / DeiT / ViTMAE / DINOv2 folders or state dicts -> vitkit names.

Both on-disk names (`encoder.layer.{i}.attention.attention.query`, what `save_pretrained` writes) and
transformers-5 module names (`layers.{i}.attention.q_proj`) are accepted. q/k/v are concatenated
into timm's packed `qkv` (rows q|k|v, heads contiguous inside each, as HF splits them).
"""
from __future__ import annotations

import logging
import re

import torch

from ...errors import CheckpointError
from ...models.config import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, Preprocess
from ..layouts import Imported, StateDict, layout
from .dinov2 import fold_registers

log = logging.getLogger("vitkit")

_PATCH = "embeddings.patch_embeddings.projection.weight"
_BLOCK = re.compile(r"^(?:encoder\.layer|layers)\.(\d+)\.(.+)\.(weight|bias|lambda1)$")
_QKV = {"attention.attention.query": 0, "attention.attention.key": 1, "attention.attention.value": 2,
        "attention.q_proj": 0, "attention.k_proj": 1, "attention.v_proj": 2}
_RENAME = {
    "layernorm_before": "norm1", "layernorm_after": "norm2", "norm1": "norm1", "norm2": "norm2",
    "attention.output.dense": "attn.proj", "attention.o_proj": "attn.proj",
    "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2",
    "layer_scale1": "ls1", "layer_scale2": "ls2",  # DINOv2's LayerScale (lambda1 -> gamma)
}
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
         "quick_gelu": "quick_gelu"}
_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL codes in preprocessor_config.json


def _prefix(sd: StateDict) -> str | None:
    return next((k[: -len(_PATCH)] for k in sd if k.endswith(_PATCH)), None)


def _is_hf(sd: StateDict) -> bool:
    return _prefix(sd) is not None


def _preprocess(family: str, proc: dict | None) -> Preprocess:
    """The image processor's settings: preprocessor_config.json when present, else the class defaults
    (ViTImageProcessor: plain resize, bilinear, mean=std=0.5; DeiT/DINOv2: 256 -> crop 224, bicubic, ImageNet)."""
    if family == "vit":
        pre = Preprocess(INCEPTION_MEAN, INCEPTION_STD, "bilinear", 1.0)
    else:
        pre = Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", 0.875)
    if proc:
        size = proc.get("size") or {}
        if isinstance(size, int):
            size = {"shortest_edge": size}
        crop = proc.get("crop_size") or {}
        crop_side = crop.get("height") if isinstance(crop, dict) else crop
        short = size.get("shortest_edge") or size.get("height")
        crop_pct = crop_side / short if proc.get("do_center_crop") and crop_side and short else 1.0
        pre = Preprocess(tuple(proc.get("image_mean", pre.mean)), tuple(proc.get("image_std", pre.std)),
                         _RESAMPLE.get(proc.get("resample"), pre.interpolation), round(crop_pct, 4))
    return pre


@layout("hf-transformers", _is_hf, priority=5)
def convert_hf(sd: StateDict, hf_config: dict | None = None) -> Imported:
    base = _prefix(sd)
    cfg = hf_config or {}
    out: StateDict = {}
    qkv: dict[int, dict[str, list]] = {}
    dropped: list[str] = []
    for k, v in sd.items():
        if not k.startswith(base):
            name = {"classifier.weight": "head.weight", "classifier.bias": "head.bias",
                    "cls_classifier.weight": "head.weight", "cls_classifier.bias": "head.bias",
                    "distillation_classifier.weight": "head_dist.weight",
                    "distillation_classifier.bias": "head_dist.bias"}.get(k)
            if name is None:
                dropped.append(k)  # e.g. ViTMAE's decoder.*
            else:
                out[name] = v
            continue
        k2 = k[len(base):]
        if m := _BLOCK.match(k2):
            i, mod, kind = int(m.group(1)), m.group(2), m.group(3)
            if mod in _QKV:
                qkv.setdefault(i, {}).setdefault(kind, [None] * 3)[_QKV[mod]] = v
            elif mod in _RENAME:
                out[f"blocks.{i}.{_RENAME[mod]}.{'gamma' if kind == 'lambda1' else kind}"] = v
            elif mod.startswith("mlp.weights_"):
                raise CheckpointError(f"{k}: a SwiGLU MLP (DINOv2 giant); vitkit blocks have a GELU MLP "
                                      "and cannot hold these weights")
            else:
                out[k2] = v  # unknown: left for the loader to report as unexpected
            continue
        name = {
            "embeddings.cls_token": "cls_token", "embeddings.distillation_token": "dist_token",
            "embeddings.position_embeddings": "pos_embed", "embeddings.register_tokens": "register_tokens",
            "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
            "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
            "layernorm.weight": "norm.weight", "layernorm.bias": "norm.bias",
        }.get(k2)
        if name is not None:
            out[name] = v
        elif k2.startswith(("pooler.", "embeddings.mask_token")):
            dropped.append(k)  # the tanh pooler is not used by the classifier; mask_token only in pretraining
        else:
            out[k2] = v
    for i, parts in qkv.items():
        for kind, qkv_parts in parts.items():
            if any(p is None for p in qkv_parts):
                raise CheckpointError(f"HF checkpoint: block {i} lacks one of query/key/value {kind}")
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(qkv_parts, dim=0)  # [3D, D] / [3D]
    if any(k.startswith("pooler.") or ".pooler." in k for k in dropped):
        log.info("HF checkpoint: dropped the tanh pooler (ViTModel's pooler_output; the classifier never uses it)")

    model_type = cfg.get("model_type") or ("deit" if base.startswith("deit") or "dist_token" in out else
                                            "dinov2" if "blocks.0.ls1.gamma" in out else "vit")
    family = "vit" if model_type in ("vit", "vit_mae") else model_type
    hints: dict = {"norm_eps": float(cfg.get("layer_norm_eps", 1e-6 if family == "dinov2" else 1e-12))}
    act = cfg.get("hidden_act", "gelu")
    if act not in _ACTS:
        raise CheckpointError(f"HF config hidden_act={act!r} is not supported (vitkit has {sorted(set(_ACTS.values()))})")
    hints["act"] = _ACTS[act]
    if "num_attention_heads" in cfg:
        hints["num_heads"] = int(cfg["num_attention_heads"])
    if "register_tokens" in out:
        out = fold_registers(out)
        hints["prefix_pos"] = False
    elif "image_size" in cfg and family != "dinov2":  # DINOv2's config says 518 whatever the table holds
        side = cfg["image_size"]
        hints["img_size"] = tuple(side) if isinstance(side, (list, tuple)) else (side, side)
    labels = cfg.get("id2label") or {}
    names = [labels[str(j)] if str(j) in labels else labels.get(j) for j in range(len(labels))]
    if not (names and "head.weight" in out and len(names) == out["head.weight"].shape[0]
            and not all(n == f"LABEL_{j}" for j, n in enumerate(names))):
        names = None  # no head, another head, or transformers' placeholder names
    name = {"deit": "hf-deit", "vit_mae": "hf-vitmae", "dinov2": "hf-dinov2"}.get(model_type, "hf-vit")
    return Imported(out, name, hints, dropped, preprocess=_preprocess(family, cfg.get("_preprocessor_config")),
                    class_names=names)
