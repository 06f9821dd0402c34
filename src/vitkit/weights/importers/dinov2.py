"""DINOv2 (facebookresearch/dinov2 hub checkpoints) -> vitkit names.

Its blocks already use timm names; what differs: `register_tokens`, a 2-D `mask_token`, optionally
chunked blocks `blocks.{chunk}.{i}` (i is the global block index), and SwiGLU MLPs for ViT-g.
"""
from __future__ import annotations

import re

from ...errors import CheckpointError
from ...models.config import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ..convert import Imported, StateDict, layout

_CHUNKED = re.compile(r"^blocks\.\d+\.(\d+)\.(.+)$")


def fold_registers(sd: StateDict) -> StateDict:
    """DINOv2 with registers adds pos[0] to the class token and gives registers no position;
    vitkit (like timm) stores that as prefix_pos=False: the class position is folded into cls_token."""
    sd = dict(sd)
    pos = sd.pop("pos_embed")  # [1, 1 + N, D]
    sd["reg_token"] = sd.pop("register_tokens")  # [1, R, D]
    sd["cls_token"] = sd["cls_token"] + pos[:, :1]
    sd["pos_embed"] = pos[:, 1:]  # [1, N, D]
    return sd


def _is_dinov2(sd: StateDict) -> bool:
    if "patch_embed.proj.weight" not in sd:
        return False
    mask = sd.get("mask_token")
    return ("register_tokens" in sd or (mask is not None and mask.ndim == 2)
            or any(_CHUNKED.match(k) or ".mlp.w12." in k for k in sd))


@layout("dinov2", _is_dinov2, priority=10)
def convert_dinov2(sd: StateDict, hf_config=None) -> Imported:
    if any(".mlp.w12." in k for k in sd):
        raise CheckpointError("DINOv2 checkpoint with a SwiGLU MLP (mlp.w12/w3, the ViT-g models): vitkit "
                              "blocks have a GELU MLP and cannot hold these weights")
    out, dropped = {}, []
    for k, v in sd.items():
        if k == "mask_token":
            dropped.append(k)  # used only by iBOT masked-token training
            continue
        if m := _CHUNKED.match(k):
            k = f"blocks.{m.group(1)}.{m.group(2)}"
        out[k] = v
    hints: dict = {"norm_eps": 1e-6, "_preprocess": Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", 0.875)}
    if "register_tokens" in out:
        out = fold_registers(out)
        hints["prefix_pos"] = False
    return Imported(out, "dinov2", hints, dropped)
