"""DINOv2 (facebookresearch/dinov2 hub checkpoints) -> vitkit names.

Its blocks already use timm names; what differs: `register_tokens`, a 2-D `mask_token`, optionally
chunked blocks `blocks.{chunk}.{i}` (i is the global block index), and SwiGLU MLPs for ViT-g: `mlp.w12`
(SwiGLUFFNFused's packed [x1; x2] projection, silu(x1) * x2) and `mlp.w3`, which are fc1 / fc2 of vitkit's
`SwiGLUPacked` (gate = first half), as timm's _convert_dinov2 maps them.
"""
from __future__ import annotations

import re

from ...errors import CheckpointError
from ...models.config import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ..layouts import Imported, StateDict, layout

_CHUNKED = re.compile(r"^blocks\.\d+\.(\d+)\.(.+)$")
_SWIGLU_NAMES = {".mlp.w12.": ".mlp.fc1.", ".mlp.w3.": ".mlp.fc2."}


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


def _check_packed_swiglu(sd: StateDict) -> None:
    """w12 holds both SwiGLU branches, so it is twice as wide as w3's input; anything else is not a DINOv2 ViT-g
    file and would load into the wrong MLP."""
    for k, fc1 in sd.items():
        if k.endswith(".mlp.fc1.weight"):
            fc2 = sd.get(k.replace(".fc1.", ".fc2."))
            if fc2 is None or fc1.shape[0] != 2 * fc2.shape[1]:
                block = k[: -len(".mlp.fc1.weight")]
                raise CheckpointError(
                    f"DINOv2 checkpoint: {block}.mlp.w12 has {fc1.shape[0]} rows, not twice the width of "
                    f"{block}.mlp.w3's input ({None if fc2 is None else fc2.shape[1]}); not a packed SwiGLU MLP")


@layout("dinov2", _is_dinov2, priority=10)
def convert_dinov2(sd: StateDict, hf_config=None) -> Imported:
    out, dropped = {}, []
    for k, v in sd.items():
        if k == "mask_token":
            dropped.append(k)  # used only by iBOT masked-token training
            continue
        if m := _CHUNKED.match(k):
            k = f"blocks.{m.group(1)}.{m.group(2)}"
        for dinov2_name, vitkit_name in _SWIGLU_NAMES.items():
            k = k.replace(dinov2_name, vitkit_name)
        out[k] = v
    hints: dict = {"norm_eps": 1e-6}
    if any(".mlp.w12." in k for k in sd):
        _check_packed_swiglu(out)
        hints["mlp_layer"] = "swiglu_packed"
    if "register_tokens" in out:
        out = fold_registers(out)
        hints["prefix_pos"] = False
    return Imported(out, "dinov2", hints, dropped, preprocess=Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", 0.875))
