"""The model registry: names decode into a ViTConfig from a short table (big_vision's `B/16` style).

Name grammar (timm-compatible): `vit_{size}_patch{P}_{res}` plus a few families below.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from ..errors import ConfigError
from .config import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, ViTConfig

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


@dataclass
class ModelEntry:
    name: str
    cfg: ViTConfig
    family: str
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    crop_pct: float = 0.9
    interpolation: str = "bicubic"
    # pretrained tag -> Hugging Face hub repo holding timm-format weights (model.safetensors)
    hub: dict[str, str] = field(default_factory=dict)
    notes: str = ""


_REGISTRY: dict[str, ModelEntry] = {}


def _add(name: str, family: str, **kw) -> None:
    entry_kw = {k: kw.pop(k) for k in ("mean", "std", "crop_pct", "interpolation", "hub", "notes") if k in kw}
    _REGISTRY[name] = ModelEntry(name, ViTConfig(**kw), family, **entry_kw)


def _build_registry() -> None:
    # The paper's family: every size x patch x resolution people use.
    for size in ("tiny", "small", "medium", "base", "large", "huge", "giant"):
        for p in (8, 14, 16, 32):
            for res in ((224, 518) if p == 14 else (224, 384)):
                hub = {}
                if p in (16, 32) and size in ("tiny", "small", "base", "large") and res == 224:
                    hub = {"augreg_in21k_ft_in1k": f"timm/vit_{size}_patch{p}_{res}.augreg_in21k_ft_in1k"}
                _add(f"vit_{size}_patch{p}_{res}", "vit", img_size=res, patch_size=p, **size_config(size),
                     mean=INCEPTION_MEAN, std=INCEPTION_STD, crop_pct=0.9 if res == 224 else 1.0, hub=hub)
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
            _add(f"deit_{size}_patch16_{res}", "deit", img_size=res, patch_size=16, crop_pct=crop,
                 hub={"fb_in1k": f"timm/deit_{size}_patch16_{res}.fb_in1k"}, **size_config(size))
            _add(f"deit_{size}_distilled_patch16_{res}", "deit", img_size=res, patch_size=16, distilled=True,
                 crop_pct=crop, hub={"fb_in1k": f"timm/deit_{size}_distilled_patch16_{res}.fb_in1k"},
                 **size_config(size))
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
    # CLIP visual towers (OpenAI layout): pre-norm, no patch bias, QuickGELU.
    for size, p in (("base", 32), ("base", 16), ("large", 14)):
        _add(f"vit_{size}_patch{p}_clip_quickgelu_224", "clip", patch_size=p, pre_norm=True, patch_bias=False,
             act="quick_gelu", norm_eps=1e-5, num_classes=0, mean=CLIP_MEAN, std=CLIP_STD, crop_pct=1.0,
             **size_config(size))
    # MAE encoders: fixed 2D sin-cos positions.
    for size, p in (("base", 16), ("large", 16), ("huge", 14)):
        _add(f"vit_{size}_patch{p}_mae", "mae", patch_size=p, pos_embed="sincos", num_classes=0,
             hub={"mae": f"timm/vit_{size}_patch{p}_224.mae"}, **size_config(size))
    # Small images: models that train in minutes on a CPU.
    _add("vit_pico_patch2_8", "small-images", img_size=8, patch_size=2, in_chans=1, num_classes=10,
         embed_dim=96, depth=4, num_heads=3, mlp_ratio=2.0, mean=(0.5,), std=(0.5,), crop_pct=1.0,
         interpolation="bilinear", notes="for 8x8 digits")
    _add("vit_tiny_patch4_28", "small-images", img_size=28, patch_size=4, in_chans=1, num_classes=10,
         embed_dim=192, depth=6, num_heads=3, mean=(0.5,), std=(0.5,), crop_pct=1.0,
         interpolation="bilinear", notes="for 28x28 (Fashion-)MNIST")
    _add("vit_small_patch4_32", "small-images", img_size=32, patch_size=4, num_classes=10, embed_dim=384,
         depth=6, num_heads=6, crop_pct=1.0, interpolation="bilinear", notes="for 32x32 (CIFAR-like)")


_build_registry()


def list_models(pattern: str | None = None) -> list[str]:
    """Registered names, sorted; `pattern` is a shell-style wildcard (e.g. 'deit*')."""
    names = sorted(_REGISTRY)
    if pattern:
        pat = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
        names = [n for n in names if fnmatch.fnmatch(n, pat)]
    return names


def get_entry(name: str) -> ModelEntry:
    base = name.split(".", 1)[0]
    if base not in _REGISTRY:
        close = [n for n in _REGISTRY if base.split("_")[0] in n][:5]
        hint = f"; similar: {', '.join(close)}" if close else ""
        raise ConfigError(f"unknown model {name!r} (see `vitkit models`){hint}")
    return _REGISTRY[base]


def model_config(name: str, **overrides) -> ViTConfig:
    """The config for a registered name, with overrides applied (validated)."""
    cfg = get_entry(name).cfg
    return cfg.replace(**overrides) if overrides else cfg.replace()
