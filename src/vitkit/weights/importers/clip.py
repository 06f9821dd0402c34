"""OpenAI CLIP / open_clip image towers alone -> the `vit` family's names (a file with both towers is the `clip`
family's pair: importers/clip_text.py).

OpenAI layout: `visual.conv1` (no bias), `class_embedding` (D,), `positional_embedding` (N+1, D),
`ln_pre`, `transformer.resblocks.{i}`, `ln_post`, `proj` (D, E) applied as x @ proj.
open_clip towers with a timm trunk keep timm names under `visual.trunk.` (+ `visual.head.proj`).
"""
from __future__ import annotations

import torch

from ...errors import CheckpointError
from ...models.config import CLIP_MEAN, CLIP_STD, Preprocess
from ..layouts import Imported, StateDict, layout

CLIP_PREPROCESS = Preprocess(CLIP_MEAN, CLIP_STD, "bicubic", 1.0)  # OpenAI's: resize the short side, crop, bicubic


def block_key(key: str) -> str:
    """'transformer.resblocks.{i}.<OpenAI name>' -> '{i}.<timm name>' (both towers use the same block)."""
    i, rest = key[len("transformer.resblocks."):].split(".", 1)
    for old, new in _BLOCK_RENAME:
        if rest.startswith(old):
            return f"{i}.{new}{rest[len(old):]}"
    return f"{i}.{rest}"


_BLOCK_RENAME = (("ln_1", "norm1"), ("ln_2", "norm2"), ("attn.in_proj_weight", "attn.qkv.weight"),
                 ("attn.in_proj_bias", "attn.qkv.bias"), ("attn.out_proj", "attn.proj"), ("mlp.c_fc", "mlp.fc1"),
                 ("mlp.c_proj", "mlp.fc2"), ("ls_1", "ls1"), ("ls_2", "ls2"))


def _prefix(sd: StateDict) -> str | None:
    for p in ("visual.", ""):
        if f"{p}conv1.weight" in sd and f"{p}class_embedding" in sd:
            return p
    return None


def _is_clip(sd: StateDict) -> bool:
    return _prefix(sd) is not None


def _is_open_clip_timm(sd: StateDict) -> bool:
    return "visual.trunk.patch_embed.proj.weight" in sd


@layout("clip", _is_clip, priority=5)
def convert_clip(sd: StateDict, hf_config=None) -> Imported:
    p = _prefix(sd)
    out, dropped = {}, [k for k in sd if not k.startswith(p)]
    for k, v in sd.items():
        if not k.startswith(p):
            continue
        k = k[len(p):]
        if k.startswith("attn_pool"):
            raise CheckpointError(f"CLIP tower key {p}{k}: attention-pooling towers are not supported")
        if k == "conv1.weight":
            out["patch_embed.proj.weight"] = v
        elif k == "class_embedding":
            out["cls_token"] = v.reshape(1, 1, -1)  # (D,) -> [1, 1, D]
        elif k == "positional_embedding":
            out["pos_embed"] = v.unsqueeze(0)  # [N+1, D] -> [1, N+1, D]
        elif k.startswith("ln_pre."):
            out["norm_pre." + k[len("ln_pre."):]] = v
        elif k.startswith("ln_post."):
            out["norm." + k[len("ln_post."):]] = v
        elif k == "proj":
            out["head.weight"] = v.t().contiguous()  # x @ proj == Linear with weight proj.T
            out["head.bias"] = torch.zeros(v.shape[1], dtype=v.dtype)
        elif k.startswith("transformer.resblocks."):
            out["blocks." + block_key(k)] = v
        else:
            out[k] = v  # left for the loader to report
    D = out["patch_embed.proj.weight"].shape[0]
    # OpenAI's towers: 64-wide heads, QuickGELU, torch LayerNorm (eps 1e-5), CLIP mean/std, resize+crop
    hints = {"num_heads": max(1, D // 64), "act": "quick_gelu", "norm_eps": 1e-5}
    return Imported(out, "clip", hints, dropped, preprocess=CLIP_PREPROCESS)


@layout("open_clip-timm", _is_open_clip_timm, priority=5)
def convert_open_clip_timm(sd: StateDict, hf_config=None) -> Imported:
    p = "visual.trunk."
    out = {k[len(p):]: v for k, v in sd.items() if k.startswith(p)}
    if "visual.head.proj.weight" in sd:
        w = sd["visual.head.proj.weight"]
        out["head.weight"] = w
        out["head.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
    dropped = [k for k in sd if not k.startswith(p) and k != "visual.head.proj.weight"]
    return Imported(out, "open_clip-timm", {}, dropped, preprocess=CLIP_PREPROCESS)
