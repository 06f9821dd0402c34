"""torchvision `VisionTransformer` (vit_b_16, ...) -> vitkit names."""
from __future__ import annotations

import re

from ...models.config import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ..layouts import Imported, StateDict, layout

_LAYER = re.compile(r"^encoder\.layers\.encoder_layer_(\d+)\.(.+)$")
_RENAME = {
    "ln_1": "norm1", "ln_2": "norm2",
    "self_attention.in_proj_weight": "attn.qkv.weight", "self_attention.in_proj_bias": "attn.qkv.bias",
    "self_attention.out_proj": "attn.proj",
    "mlp.0": "mlp.fc1", "mlp.3": "mlp.fc2", "mlp.linear_1": "mlp.fc1", "mlp.linear_2": "mlp.fc2",  # v1 names
}
_TOP = {"class_token": "cls_token", "encoder.pos_embedding": "pos_embed", "conv_proj.weight": "patch_embed.proj.weight",
        "conv_proj.bias": "patch_embed.proj.bias", "encoder.ln.weight": "norm.weight", "encoder.ln.bias": "norm.bias",
        "heads.head.weight": "head.weight", "heads.head.bias": "head.bias",
        "heads.pre_logits.weight": "pre_logits.fc.weight", "heads.pre_logits.bias": "pre_logits.fc.bias"}


def _is_torchvision(sd: StateDict) -> bool:
    return "conv_proj.weight" in sd and "encoder.pos_embedding" in sd


@layout("torchvision", _is_torchvision)
def convert_torchvision(sd: StateDict, hf_config=None) -> Imported:
    out = {}
    for k, v in sd.items():
        if m := _LAYER.match(k):
            i, rest = m.groups()
            for old, new in _RENAME.items():
                if rest == old or rest.startswith(old + "."):
                    rest = new + rest[len(old):]
                    break
            out[f"blocks.{i}.{rest}"] = v
        else:
            out[_TOP.get(k, k)] = v
    # torchvision's IMAGENET1K_V1 transforms: resize 256 (bilinear) -> crop 224, ImageNet mean/std
    return Imported(out, "torchvision", {"norm_eps": 1e-6, "act": "gelu"},
                    preprocess=Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bilinear", 0.875))
