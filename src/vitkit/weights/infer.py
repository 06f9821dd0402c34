"""Read a ViTConfig off a vitkit/timm-named state dict (what the shapes say), plus source hints.

`infer_config` is the vit family's reader (its Family entry names it, models.vision_transformer.VIT_CONFIG_READER):
vitkit.api calls it through `Family.read_config` for a foreign ViT file, the whole-model importers directly."""
from __future__ import annotations

import logging
import math
import re

from ..errors import CheckpointError
from ..models.config import ViTConfig
from ..models.vit_variants import SIZES
from .layouts import StateDict

log = logging.getLogger("vitkit")

# Width -> heads of the registered sizes, where that is not 64 per head (H, g, G use 16), and so400m's 1152.
_HEADS = {w: h for w, _, h, _ in SIZES.values() if w // h != 64} | {1152: 16}


def default_heads(width: int) -> int:
    return _HEADS.get(width, max(1, width // 64))


def infer_config(sd: StateDict, hints: dict | None = None, source: str = "the checkpoint") -> ViTConfig:
    hints = dict(hints or {})
    w = sd.get("patch_embed.proj.weight")
    if w is None or w.ndim != 4:
        raise CheckpointError("cannot infer the architecture: no 4-D patch_embed.proj.weight")
    D, C, P = w.shape[0], w.shape[1], w.shape[2]
    depth = 1 + max((int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    kw: dict = dict(embed_dim=D, in_chans=C, patch_size=P, depth=depth)
    if depth:
        if "blocks.0.mlp.fc1_g.weight" in sd:  # SwiGLU: gate and value branches, each `hidden` wide
            kw["mlp_layer"], hidden = "swiglu", sd["blocks.0.mlp.fc1_g.weight"].shape[0]
        else:
            hidden = sd["blocks.0.mlp.fc1.weight"].shape[0]
            if sd["blocks.0.mlp.fc2.weight"].shape[1] * 2 == hidden:  # both SwiGLU branches packed in fc1
                kw["mlp_layer"] = "swiglu_packed"
            elif "blocks.0.mlp.dwconv.weight" in sd:  # a 3x3 depthwise conv between fc1 and fc2 (PVTv2's MLP)
                kw["mlp_layer"] = "mlp_dwconv"
        kw["mlp_ratio"] = hidden / D
        kw["qkv_bias"] = "blocks.0.attn.qkv.bias" in sd or "blocks.0.attn.q_bias" in sd
        kw["k_bias"] = "blocks.0.attn.q_bias" not in sd  # EVA-style: q and v biases only
        kw["qk_norm"] = "blocks.0.attn.q_norm.weight" in sd
        if "blocks.0.attn.rel_pos.mlp.fc1.weight" in sd:  # a relative-position MLP per block (timm vit_relpos_*)
            kw["rel_pos"], kw["rel_pos_dim"] = "mlp", sd["blocks.0.attn.rel_pos.mlp.fc1.weight"].shape[0]
        if "blocks.0.ls1.gamma" in sd:
            kw["init_values"] = 1e-5  # the value is only an init; the trained gammas are loaded
    kw["class_token"] = "cls_token" in sd
    kw["distilled"] = "dist_token" in sd
    kw["num_reg_tokens"] = sd["reg_token"].shape[1] if "reg_token" in sd else 0
    if "shared_rel_pos.mlp.fc1.weight" in sd:  # one for all blocks (timm vit_srelpos_*)
        kw["rel_pos"], kw["rel_pos_dim"] = "mlp_shared", sd["shared_rel_pos.mlp.fc1.weight"].shape[0]
    if "rope.freqs" in sd:  # RoPE-Mixed's learned frequencies; timm builds these models column-first
        kw["rope"], kw["rope_xy"] = "mixed", True
    kw["pre_norm"] = "norm_pre.weight" in sd
    kw["patch_bias"] = "patch_embed.proj.bias" in sd
    kw["final_norm"] = "norm.weight" in sd or "fc_norm.weight" in sd
    if "attn_pool.latent" in sd:  # SigLIP's attention-pooling (MAP) head
        kw["global_pool"] = "map"
        kw["fc_norm"] = "fc_norm.weight" in sd
        if "attn_pool.mlp.fc1.weight" in sd:
            kw["pool_mlp_ratio"] = sd["attn_pool.mlp.fc1.weight"].shape[0] / D
    elif "fc_norm.weight" in sd:
        kw["global_pool"] = hints.pop("global_pool", "avg")
        kw["fc_norm"] = True
    elif not kw["class_token"]:
        kw["global_pool"] = "avg"
        kw["fc_norm"] = False
    head = sd.get("head.weight")
    kw["num_classes"] = head.shape[0] if head is not None else 0
    if "pre_logits.fc.weight" in sd:
        kw["representation_size"] = sd["pre_logits.fc.weight"].shape[0]
    prefix = int(kw["class_token"]) + int(kw["distilled"]) + kw["num_reg_tokens"]
    pos = sd.get("pos_embed")
    if pos is None:
        kw["pos_embed"] = "none"
        kw["img_size"] = hints.pop("img_size", 224)
    else:
        rows = pos.shape[1]
        side_with = math.isqrt(max(rows - prefix, 0))
        side_without = math.isqrt(rows)
        if "prefix_pos" in hints:
            grid_rows = rows - prefix if hints["prefix_pos"] else rows
        elif prefix and side_with * side_with == rows - prefix:
            kw["prefix_pos"], grid_rows = True, rows - prefix
        elif side_without * side_without == rows:
            kw["prefix_pos"], grid_rows = False, rows
        else:
            grid_rows = rows - prefix
        if "img_size" not in hints:
            side = math.isqrt(grid_rows)
            if side * side != grid_rows:
                raise CheckpointError(
                    f"pos_embed has {grid_rows} grid rows, not a square grid; pass the model name or img_size")
            kw["img_size"] = side * P
    if hints.get("num_heads") is None:
        from .notes import note_once

        note_once(f"{source} does not record its number of attention heads: assuming {default_heads(D)} for width "
                  f"{D}; if that is wrong, convert it once with `vitkit convert {source} OUT.safetensors --model "
                  "NAME` (a registered name, `vitkit models`) and use OUT (in Python: load_model(..., num_heads=N))")
    kw["num_heads"] = hints.pop("num_heads", None) or default_heads(D)
    kw.update(hints)
    return ViTConfig(**kw)
