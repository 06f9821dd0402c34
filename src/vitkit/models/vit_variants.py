"""The `vit` family's names: a short variant table (big_vision's `B/16` style) decoded into ViTConfigs.

Name grammar (timm-compatible): `vit_{size}_patch{P}_{res}` plus DeiT, DeiT III, DINOv2, CLIP, MAE and
small-image entries below. Pretrained tags name timm's hub repos (`timm/{name}.{tag}`); a test checks each
against timm's list of pretrained weights.
"""
from __future__ import annotations

import re
from typing import Any

from torch import nn

from ..errors import ConfigError
from ..layers import layer_name
from .config import CLIP_MEAN, CLIP_STD, INCEPTION_MEAN, INCEPTION_STD, ViTConfig
from .cost import vit_cost
from .registry import Pretrained, register_family, register_model
from .vision_transformer import VisionTransformer

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
    "block_fn": (None, "choose the MLP with mlp_layer= (mlp, swiglu, swiglu_packed)"),
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


register_family("vit", ViTConfig, VisionTransformer, cost=vit_cost, translate_kwargs=translate_timm_kwargs)


def _add(name: str, group: str, *, pretrained: dict[str, str] | None = None, **kw) -> None:
    entry = {k: kw.pop(k) for k in ("mean", "std", "crop_pct", "interpolation", "notes") if k in kw}
    tags = {tag: Pretrained(hub=repo) for tag, repo in (pretrained or {}).items()}
    register_model(name, "vit", ViTConfig(**kw), group=group, pretrained=tags, **entry)


def _timm(name: str, *tags: str) -> dict[str, str]:
    return {tag: f"timm/{name}.{tag}" for tag in tags}


def _register() -> None:
    # The paper's family: every size x patch x resolution people use. timm publishes augreg weights for
    # Ti/16, S/16, S/32, B/16, B/32, L/16 at 224 and only the original in21k ones for L/32.
    augreg = {"tiny": (16,), "small": (16, 32), "base": (16, 32), "large": (16,)}
    for size in ("tiny", "small", "medium", "base", "large", "huge", "giant"):
        for p in (8, 14, 16, 32):
            for res in ((224, 518) if p == 14 else (224, 384)):
                name = f"vit_{size}_patch{p}_{res}"
                tags = {}
                if res == 224 and p in augreg.get(size, ()):
                    tags = _timm(name, "augreg_in21k_ft_in1k")
                elif name == "vit_large_patch32_224":
                    tags = _timm(name, "orig_in21k")
                _add(name, "vit", img_size=res, patch_size=p, **size_config(size), mean=INCEPTION_MEAN,
                     std=INCEPTION_STD, crop_pct=0.9 if res == 224 else 1.0, pretrained=tags)
    # Global-average-pooled variants (no class token, fc_norm after pooling).
    for size in ("tiny", "small", "base", "large"):
        _add(f"vit_{size}_patch16_gap_224", "vit-gap", patch_size=16, class_token=False, global_pool="avg",
             **size_config(size))
    # DeiT: ImageNet mean/std, crop 0.875; distilled adds a distillation token and head.
    for size in ("tiny", "small", "base"):
        for res in (224, 384):
            if size != "base" and res == 384:
                continue
            crop = 0.875 if res == 224 else 1.0
            name, dname = f"deit_{size}_patch16_{res}", f"deit_{size}_distilled_patch16_{res}"
            _add(name, "deit", img_size=res, patch_size=16, crop_pct=crop, pretrained=_timm(name, "fb_in1k"),
                 **size_config(size))
            _add(dname, "deit", img_size=res, patch_size=16, distilled=True, crop_pct=crop,
                 pretrained=_timm(dname, "fb_in1k"), **size_config(size))
    # DeiT III: LayerScale, no position rows for the class token.
    for size in ("small", "base", "large"):
        _add(f"deit3_{size}_patch16_224", "deit3", patch_size=16, init_values=1e-6, prefix_pos=False,
             crop_pct=0.875, **size_config(size))
    # DINOv2: patch 14 at 518, LayerScale; with registers the prefix tokens get no positions.
    for size in ("small", "base", "large"):
        _add(f"vit_{size}_patch14_dinov2", "dinov2", img_size=518, patch_size=14, init_values=1e-5,
             num_classes=0, crop_pct=1.0, **size_config(size))
        _add(f"vit_{size}_patch14_reg4_dinov2", "dinov2", img_size=518, patch_size=14, init_values=1e-5,
             num_reg_tokens=4, prefix_pos=False, num_classes=0, crop_pct=1.0, **size_config(size))
    # CLIP visual towers (OpenAI layout): pre-norm, no patch bias, QuickGELU. Headless by default; a
    # checkpoint's image projection (768 -> 512 for B) is kept as the head when it has one.
    for size, p in (("base", 32), ("base", 16), ("large", 14)):
        _add(f"vit_{size}_patch{p}_clip_quickgelu_224", "clip", patch_size=p, pre_norm=True, patch_bias=False,
             act="quick_gelu", norm_eps=1e-5, num_classes=0, mean=CLIP_MEAN, std=CLIP_STD, crop_pct=1.0,
             **size_config(size))
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
