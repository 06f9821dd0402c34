"""Swin Transformer checkpoints: timm's layout and the original repository's (microsoft/Swin-Transformer).

Both have `layers.{i}.blocks.{j}.attn.relative_position_bias_table`; the original puts patch merging at the
end of stage i (`layers.0.downsample`), names the classifier `head` and saves the index and mask buffers.
`models.swin.checkpoint_filter` moves either to timm's names; the architecture is read off the shapes:
width, patch and channels from the patch conv, blocks per stage, heads per stage and the window from the
bias tables ((2w-1)^2 rows x heads), the MLP ratio from fc1, the classes from the head.
"""
from __future__ import annotations

import math
import re

from ...errors import CheckpointError
from ...models.swin import SwinConfig, checkpoint_filter
from ..layouts import Imported, StateDict, layout
from .timm_native import timm_hub_metadata

_TABLE = "attn.relative_position_bias_table"


def _is_swin(sd: StateDict) -> bool:
    return "patch_embed.proj.weight" in sd and f"layers.0.blocks.0.{_TABLE}" in sd


def _window(rows: int, key: str) -> int:
    side = math.isqrt(rows)
    if side * side != rows or side % 2 == 0:
        raise CheckpointError(f"{key} has {rows} rows, not (2w-1)^2 for a square window w")
    return (side + 1) // 2


def infer_swin_config(sd: StateDict, img_size: int | tuple[int, int] | None = None) -> SwinConfig:
    """A SwinConfig from timm-named weights. Without `img_size` it is the size the tables imply: where a
    stage's window is smaller than the first stage's, that stage's map was the window (the map was smaller
    than the window); otherwise the last stage's map is one window (224 for window 7, 384 for window 12)."""
    w = sd["patch_embed.proj.weight"]  # [D, C, p, p]
    D, C, p = int(w.shape[0]), int(w.shape[1]), int(w.shape[2])
    stages = 1 + max(int(m.group(1)) for k in sd if (m := re.match(r"layers\.(\d+)\.blocks\.", k)))
    depths, heads, windows = [], [], []
    for i in range(stages):
        blocks = {int(m.group(1)) for k in sd if (m := re.match(rf"layers\.{i}\.blocks\.(\d+)\.", k))}
        if not blocks:
            raise CheckpointError(f"Swin checkpoint: stage {i} has no blocks")
        depths.append(max(blocks) + 1)
        key = f"layers.{i}.blocks.0.{_TABLE}"
        heads.append(int(sd[key].shape[1]))
        windows.append(_window(int(sd[key].shape[0]), key))
    window = windows[0]
    if img_size is None:
        clamped = next((i for i, ws in enumerate(windows) if ws < window), None)
        img_size = (windows[clamped] * p * 2 ** clamped if clamped is not None
                    else window * p * 2 ** (stages - 1))
    head = sd.get("head.fc.weight")
    return SwinConfig(
        img_size=img_size, patch_size=p, in_chans=C, embed_dim=D, depths=tuple(depths), num_heads=tuple(heads),
        window_size=window, mlp_ratio=sd["layers.0.blocks.0.mlp.fc1.weight"].shape[0] / D,
        qkv_bias="layers.0.blocks.0.attn.qkv.bias" in sd, num_classes=int(head.shape[0]) if head is not None else 0)


@layout("swin", _is_swin, priority=10, family="swin")
def convert_swin(sd: StateDict, hf_config=None) -> Imported:
    original = "layers.0.downsample.reduction.weight" in sd
    out = checkpoint_filter(sd, model=None)  # keys only: the model resamples tables itself when it loads
    _, preprocess, class_names = timm_hub_metadata(hf_config)  # a ViT's hints do not apply
    size = ((hf_config or {}).get("pretrained_cfg") or {}).get("input_size")  # timm hub folders: [C, H, W]
    cfg = infer_swin_config(out, tuple(size[1:]) if size else None)
    dropped = [k for k in sd if k.endswith(("relative_position_index", "attn_mask"))]
    return Imported(out, "swin-original" if original else "timm-swin", {}, dropped, preprocess, class_names,
                    family="swin", config=cfg)
