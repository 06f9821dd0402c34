"""Hybrid ViTs (a CNN stem before the patches): timm files, and the ResNetV2 part of the original JAX `.npz`.

timm's keys are vitkit's (`patch_embed.backbone.*`, `patch_embed.proj`), so a timm file needs no renaming; what
the plain ViT reader cannot know is which stem it holds and the patch size in image pixels. Both come from the
key signature (`stem_of`): the stem's kind and its stage depths name the registered embed layer, the
projection's kernel times the stem's stride is the patch. JAX checkpoints (vit_jax's R+ViT models) name the
ResNetV2 `conv_root`, `gn_root` and `block{s}/unit{u}/{conv,gn}{1,2,3}` (+ `conv_proj`, `gn_proj` on the
first unit of a stage); `backbone_from_jax` / `backbone_to_jax` map between the two.
"""
from __future__ import annotations

import math
import re

import torch

from ...errors import CheckpointError
from ..layouts import Imported, StateDict, layout
from .timm_native import convert_timm

BACKBONE = "patch_embed.backbone."

# (kind, stage depths) -> registered embed layer (models/hybrid.py) and its stride
_STEMS: dict[tuple[str, tuple[int, ...]], tuple[str, int]] = {
    ("resnetv2", ()): ("resnetv2_stem", 4),
    ("resnetv2", (2, 2, 2, 2)): ("resnetv2_r26", 32),
    ("resnetv2", (3, 4, 9)): ("resnetv2_r50_s16", 16),
    ("resnetv2", (3, 4, 6, 3)): ("resnetv2_r50", 32),
    ("resnet-d", (2, 2, 2, 2)): ("resnet26d", 32),
    ("resnet-d", (3, 4, 6, 3)): ("resnet50d", 32),
    ("resnet-d", (3, 4, 6)): ("resnet50d_s16", 16),
    ("mobileclip", ()): ("mobileclip_stem", 16),
    ("conv-small", (2,)): ("conv_small", 2),  # the small stems' "depth" is their conv count
    ("conv-small", (3,)): ("conv_small3", 2),
}


def _depths(sd: StateDict, pattern: str) -> tuple[int, ...]:
    """Blocks per stage from keys matching `pattern` (groups: stage, block), stages in order."""
    blocks: dict[int, set[int]] = {}
    for k in sd:
        if m := re.match(pattern, k):
            blocks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    return tuple(len(blocks[s]) for s in sorted(blocks))


def stem_of(sd: StateDict) -> tuple[str, str, int]:
    """-> (embed layer name, key of the conv that sees the image, stride) for a hybrid state dict in vitkit names."""
    b = BACKBONE
    if f"{b}stem.conv.weight" in sd:
        kind, first = "resnetv2", f"{b}stem.conv.weight"
        depths = _depths(sd, re.escape(b) + r"stages\.(\d+)\.blocks\.(\d+)\.")
    elif f"{b}conv.weight" in sd and f"{b}norm.weight" in sd:
        kind, first, depths = "resnetv2", f"{b}conv.weight", ()
    elif f"{b}conv1.0.weight" in sd:
        kind, first = "resnet-d", f"{b}conv1.0.weight"
        depths = _depths(sd, re.escape(b) + r"layer(\d+)\.(\d+)\.")
    elif f"{b}0.conv.weight" in sd and "patch_embed.proj.weight" not in sd:  # its last conv is the projection
        kind, first, depths = "mobileclip", f"{b}0.conv.weight", ()
    elif f"{b}0.conv.weight" in sd and f"{b}1.conv.weight" in sd:
        kind, first = "conv-small", f"{b}0.conv.weight"
        depths = (sum(1 for k in sd if re.fullmatch(re.escape(b) + r"\d+\.conv\.weight", k)),)
    else:
        sample = ", ".join(sorted(k for k in sd if k.startswith(b))[:4])
        raise CheckpointError(f"hybrid checkpoint with an unknown CNN stem (keys {sample}); known: ResNetV2 (R26, "
                              "R50), ResNet-26/50-D, MobileCLIP's and vitkit's small conv stem")
    if (kind, depths) not in _STEMS:
        counted = "convs" if kind == "conv-small" else "blocks per stage"
        raise CheckpointError(f"hybrid checkpoint: a {kind} stem with {counted} {depths} is not a registered stem; "
                              f"known: {sorted(d for k, d in _STEMS if k == kind)}")
    name, stride = _STEMS[(kind, depths)]
    return name, first, stride


def hybrid_hints(sd: StateDict) -> dict:
    """Config fields the plain ViT reader (weights.infer) cannot see in a hybrid: the embed layer, the patch in
    image pixels, the image channels and, from the position table, the image size."""
    name, first, stride = stem_of(sd)
    proj = sd.get("patch_embed.proj.weight")
    patch = stride * (proj.shape[-1] if proj is not None else 1)
    hints = {"embed_layer": name, "patch_size": patch, "in_chans": int(sd[first].shape[1])}
    pos = sd.get("pos_embed")
    if pos is not None:
        rows = pos.shape[1]
        prefix = int("cls_token" in sd) + int("dist_token" in sd) + (sd["reg_token"].shape[1] if "reg_token" in sd
                                                                      else 0)
        for grid_rows in (rows - prefix, rows):  # prefix tokens with or without position rows
            side = math.isqrt(max(grid_rows, 0))
            if side * side == grid_rows:
                hints["img_size"] = side * patch
                break
    return hints


def _is_timm_hybrid(sd: StateDict) -> bool:
    return any(k.startswith(BACKBONE) for k in sd) and any(k.startswith("blocks.") for k in sd)


@layout("timm-hybrid", _is_timm_hybrid, priority=1)  # before the plain timm reader, which would see a 1x1 patch
def convert_timm_hybrid(sd: StateDict, hf_config=None) -> Imported:
    out = convert_timm(sd, hf_config)
    out.hints.update(hybrid_hints(out.state_dict))
    out.layout = "timm"
    return out


# ---------------------------------------------------------------------------- the original JAX layout
def _oihw(kernel: torch.Tensor) -> torch.Tensor:
    return kernel.permute(3, 2, 0, 1).contiguous()  # HWIO -> OIHW


def backbone_from_jax(w: StateDict) -> tuple[StateDict, set[str]]:
    """vit_jax's ResNetV2 arrays (prefix already removed) -> (vitkit-named tensors, the JAX keys used)."""
    full = any(k.startswith("block1/") for k in w)
    stem = BACKBONE + ("stem." if full else "")  # timm's stem-only backbone is the stem itself
    out = {stem + "conv.weight": _oihw(w["conv_root/kernel"]),
           stem + "norm.weight": w["gn_root/scale"].reshape(-1), stem + "norm.bias": w["gn_root/bias"].reshape(-1)}
    used = {"conv_root/kernel", "gn_root/scale", "gn_root/bias"}
    units = sorted({(int(m.group(1)), int(m.group(2))) for k in w if (m := re.match(r"block(\d+)/unit(\d+)/", k))})
    for s, u in units:
        jp, vp = f"block{s}/unit{u}/", f"{BACKBONE}stages.{s - 1}.blocks.{u - 1}."
        pairs = [(f"conv{r}", f"conv{r}", f"gn{r}", f"norm{r}") for r in (1, 2, 3)]
        if f"{jp}conv_proj/kernel" in w:
            pairs.append(("conv_proj", "downsample.conv", "gn_proj", "downsample.norm"))
        for jconv, vconv, jgn, vgn in pairs:
            out[f"{vp}{vconv}.weight"] = _oihw(w[f"{jp}{jconv}/kernel"])
            out[f"{vp}{vgn}.weight"] = w[f"{jp}{jgn}/scale"].reshape(-1)
            out[f"{vp}{vgn}.bias"] = w[f"{jp}{jgn}/bias"].reshape(-1)
            used |= {f"{jp}{jconv}/kernel", f"{jp}{jgn}/scale", f"{jp}{jgn}/bias"}
    return out, used


def backbone_to_jax(sd: StateDict) -> dict[str, torch.Tensor]:
    """The inverse of `backbone_from_jax`: a ResNetV2 hybrid's `patch_embed.backbone.*` -> vit_jax arrays."""
    name = stem_of(sd)[0]
    if not name.startswith("resnetv2"):
        raise CheckpointError(f"the JAX layout holds ResNetV2 hybrids only, not a {name} stem")
    stem = BACKBONE + ("stem." if f"{BACKBONE}stem.conv.weight" in sd else "")
    out = {"conv_root/kernel": sd[stem + "conv.weight"].permute(2, 3, 1, 0),  # OIHW -> HWIO
           "gn_root/scale": sd[stem + "norm.weight"], "gn_root/bias": sd[stem + "norm.bias"]}
    names = {"conv1": "conv1", "conv2": "conv2", "conv3": "conv3", "downsample.conv": "conv_proj",
             "norm1": "gn1", "norm2": "gn2", "norm3": "gn3", "downsample.norm": "gn_proj"}
    for k, v in sd.items():
        m = re.fullmatch(re.escape(BACKBONE) + r"stages\.(\d+)\.blocks\.(\d+)\.(.+)\.(weight|bias)", k)
        if not m:
            continue
        s, u, mod, kind = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
        jp = f"block{s + 1}/unit{u + 1}/{names[mod]}/"
        if names[mod].startswith("conv"):
            out[jp + "kernel"] = v.permute(2, 3, 1, 0)
        else:
            out[jp + ("scale" if kind == "weight" else "bias")] = v
    return out
