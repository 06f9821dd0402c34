"""The `vit` family's names: a short variant table (big_vision's `B/16` style) decoded into ViTConfigs.

Every `vit_*` / `deit*` name timm registers comes from models/vit_catalogue.py, as timm defines it (DeiT, DeiT III,
CLIP, SigLIP, DINOv2/v3, registers, RoPE, relative positions, ...), or is refused there with the reason; below are
the paper's grid under timm's grammar `vit_{size}_patch{P}_{res}` (sizes timm lacks), MAE encoders and small-image
models. Pretrained tags name timm's hub repos (`timm/{name}.{tag}`); a test checks each against timm's list.
"""
from __future__ import annotations

import re
from typing import Any

from torch import nn

from ..errors import ConfigError
from ..layers import layer_name
from .config import INCEPTION_MEAN, INCEPTION_STD, ViTConfig
from .cost import vit_cost
from .registry import Pretrained, register_family, register_model
from .vision_transformer import (
    VIT_CONFIG_READER,
    VIT_UNRECORDED_FIELDS,
    VisionTransformer,
    check_vit_hints,
    describe_vit_shape,
    vit_shape_key,
)
from .vit_catalogue import CATALOGUE, STATS, hub_name, refusal

# size -> (width, depth, heads, mlp width). The ViT paper's Table 1 plus the usual extras.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "pico": (96, 6, 3, 384),
    "tiny": (192, 12, 3, 768),     # Ti
    "small": (384, 12, 6, 1536),   # S
    "medium": (512, 12, 8, 2048),  # M
    "base": (768, 12, 12, 3072),   # B
    "large": (1024, 24, 16, 4096),  # L
    "huge": (1280, 32, 16, 5120),  # H
    "giant": (1408, 40, 16, 6144),  # g
    "gigantic": (1664, 48, 16, 8192),  # G
}
SHORT = {"Ti": "tiny", "S": "small", "M": "medium", "B": "base", "L": "large", "H": "huge", "g": "giant", "G": "gigantic"}


def size_config(size: str) -> dict:
    """'B' or 'base' -> width/depth/heads/mlp_ratio kwargs."""
    size = SHORT.get(size, size)
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r}; known: {', '.join(SIZES)}")
    w, d, h, m = SIZES[size]
    return dict(embed_dim=w, depth=d, num_heads=h, mlp_ratio=m / w)


def decode_variant(variant: str, **overrides) -> ViTConfig:
    """big_vision style: 'B/16' -> ViT-Base with patch 16; 'S/14@518' sets the resolution."""
    m = re.fullmatch(r"(\w+)/(\d+)(?:@(\d+))?", variant)
    if not m:
        raise ConfigError(f"variant must look like 'B/16' or 'S/14@518', got {variant!r}")
    kw = size_config(m.group(1)) | {"patch_size": int(m.group(2))}
    if m.group(3):
        kw["img_size"] = int(m.group(3))
    return ViTConfig(**(kw | overrides))


# ---------------------------------------------------------------------------- timm's keyword names
_ACTS = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu", "quickgelu": "quick_gelu"}
_RENAMED = {"reg_tokens": "num_reg_tokens"}
# timm options vitkit has no counterpart for, with what to do instead; refused unless given their default
_REFUSED = {
    "dynamic_img_pad": (False, "pad or crop the image to a multiple of the patch size instead"),
    "patch_drop_rate": (0.0, "patch dropout is not implemented"),
    "proj_bias": (True, "projection layers always have a bias here"),
    "fix_init": (False, "the fix_init rescaling is not implemented; pick weight_init"),
    "block_fn": (None, "choose the MLP with mlp_layer= (mlp, swiglu, swiglu_packed, mlp_dwconv)"),
    "norm_layer": (None, "blocks use LayerNorm; set its epsilon with norm_eps="),
    "embed_norm_layer": (None, "not implemented"),
}


def translate_timm_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """timm's `create_model` keyword names -> ViTConfig fields, or one line saying why one is refused.

    act_layer (a name or nn.GELU / QuickGELU), reg_tokens, no_embed_class, global_pool ('' is refused),
    class_token, fc_norm, dynamic_img_size (always on here: any multiple of the patch size runs), pos_embed
    ('' -> none), weight_init ('' -> timm), embed_layer / mlp_layer (registered names or classes).
    """
    out = dict(kw)
    if "act_layer" in out:
        act = out.pop("act_layer")
        name = act if isinstance(act, str) else {nn.GELU: "gelu"}.get(act, getattr(act, "__name__", str(act)).lower())
        if name not in _ACTS:
            raise ConfigError(f"act_layer={act!r} is not supported; choose one of {', '.join(sorted(_ACTS))}")
        out["act"] = _ACTS[name]
    for old, new in _RENAMED.items():
        if old in out:
            out[new] = out.pop(old)
    if "no_embed_class" in out:
        out["prefix_pos"] = not out.pop("no_embed_class")
    if out.get("global_pool") == "":
        raise ConfigError("global_pool='' (no pooling) is not a head here; use forward_features() for the tokens")
    if out.get("pos_embed") == "":
        out["pos_embed"] = "none"
    if out.get("weight_init") in ("", "skip"):
        out["weight_init"] = "timm"
    out.pop("dynamic_img_size", None)  # vitkit resizes positions for any input size
    for key, (default, why) in _REFUSED.items():
        if key in out:
            value = out.pop(key)
            if value != default:
                raise ConfigError(f"{key}={value!r} is not supported: {why}")
    for kind in ("embed", "mlp"):
        if f"{kind}_layer" in out:
            out[f"{kind}_layer"] = layer_name(kind, out[f"{kind}_layer"])
    return out


register_family("vit", ViTConfig, VisionTransformer, cost=vit_cost, translate_kwargs=translate_timm_kwargs,
                infer_config=VIT_CONFIG_READER, unrecorded_fields=VIT_UNRECORDED_FIELDS, shape_key=vit_shape_key,
                describe_shape=describe_vit_shape, check_hints=check_vit_hints)


def _add(name: str, group: str, *, pretrained: dict[str, str] | None = None, **kw) -> None:
    if name in CATALOGUE:  # timm's names are registered from the catalogue, as timm defines them
        return
    entry = {k: kw.pop(k) for k in ("mean", "std", "crop_pct", "interpolation", "notes") if k in kw}
    tags = {tag: Pretrained(hub=repo) for tag, repo in (pretrained or {}).items()}
    register_model(name, "vit", ViTConfig(**kw), group=group, pretrained=tags, **entry)


def _timm(name: str, *tags: str) -> dict[str, str]:
    return {tag: f"timm/{name}.{tag}" for tag in tags}


def catalogue_group(name: str) -> str:
    """A listing label for a timm name: the training recipe or model line it comes from."""
    for key in ("deit3", "deit", "_pe_", "siglip", "clip", "dinov3", "dinov2", "tipsv2", "radio", "intern", "miil",
                "lingbot", "relpos", "rope"):
        if key in name:
            return key.strip("_")
    if "_reg" in name:
        return "vit-reg"
    return "vit-gap" if "_gap_" in name or "_map_" in name else "vit"


def _register_catalogue() -> None:
    """timm's `vit_*` / `deit*` names (models/vit_catalogue.py), with timm's default head and preprocessing."""
    for name, (kw, pre, tags) in CATALOGUE.items():
        stats, crop, interpolation = pre.split()
        mean, std = STATS[stats]
        weights = {tag: Pretrained(hub=f"timm/{hub_name(name)}.{tag}") for tag in tags.split()}
        register_model(name, "vit", ViTConfig(**kw), group=catalogue_group(name), pretrained=weights, mean=mean,
                       std=std, crop_pct=float(crop), interpolation=interpolation)


def refused_error(name: str) -> ConfigError | None:
    """The one-line error for a timm name vitkit refuses on purpose (models/vit_catalogue.py REFUSED)."""
    why = refusal(name)
    return ConfigError(f"{name.split('.', 1)[0]} is not built by vitkit: {why} (see docs/catalogue.md)") if why else None


def _register() -> None:
    _register_catalogue()
    # The paper's family at every size x patch x resolution people use (timm's names among them, with their
    # weights, come from the catalogue).
    for size in ("tiny", "small", "medium", "base", "large", "huge", "giant"):
        for p in (8, 14, 16, 32):
            for res in ((224, 518) if p == 14 else (224, 384)):
                _add(f"vit_{size}_patch{p}_{res}", "vit", img_size=res, patch_size=p, **size_config(size),
                     mean=INCEPTION_MEAN, std=INCEPTION_STD, crop_pct=0.9 if res == 224 else 1.0)
    # Global-average-pooled variants (no class token, fc_norm after pooling); timm's base one differs (16
    # heads, no fc_norm) and comes from the catalogue.
    for size in ("tiny", "small", "base", "large"):
        _add(f"vit_{size}_patch16_gap_224", "vit-gap", patch_size=16, class_token=False, global_pool="avg",
             **size_config(size))
    # DeiT, DeiT III, DINOv2 and CLIP towers: all timm's names, registered from the catalogue above.
    # MAE encoders: fixed 2D sin-cos positions.
    for size, p in (("base", 16), ("large", 16), ("huge", 14)):
        _add(f"vit_{size}_patch{p}_mae", "mae", patch_size=p, pos_embed="sincos", num_classes=0,
             pretrained={"mae": f"timm/vit_{size}_patch{p}_224.mae"}, **size_config(size))
    # Small images: models that train in minutes on a CPU.
    _add("vit_pico_patch2_8", "small-images", img_size=8, patch_size=2, in_chans=1, num_classes=10,
         embed_dim=96, depth=4, num_heads=3, mlp_ratio=2.0, mean=(0.5,), std=(0.5,), crop_pct=1.0,
         interpolation="bilinear", notes="for 8x8 digits")
    _add("vit_tiny_patch4_28", "small-images", img_size=28, patch_size=4, in_chans=1, num_classes=10,
         embed_dim=192, depth=6, num_heads=3, mean=(0.5,), std=(0.5,), crop_pct=1.0,
         interpolation="bilinear", notes="for 28x28 (Fashion-)MNIST")
    _add("vit_small_patch4_32", "small-images", img_size=32, patch_size=4, num_classes=10, embed_dim=384,
         depth=6, num_heads=6, crop_pct=1.0, interpolation="bilinear", notes="for 32x32 (CIFAR-like)")


_register()
