"""OpenAI CLIP / open_clip checkpoints with both towers -> the `clip` family (models/clip.py).

One file holds the pair: `visual.*` (the image tower, renamed by the `clip` layout's filter in clip.py),
`token_embedding.weight` [V, W], `positional_embedding` [L, W], `transformer.resblocks.{i}.*` (the same block
layout as the image tower), `ln_final`, `text_projection` [W, E] (applied as x @ P) and `logit_scale`.

This is not a registered layout: `vitkit.load_model` keeps reading such a file as its image tower (a ViT, as
before); `vitkit.zeroshot.load_clip` reads it as the pair. What the weights do not record is assumed as
OpenAI's models have it: 64-wide attention heads in both towers and QuickGELU (open_clip's LAION/DataComp
weights use GELU: pass act="gelu").
"""
from __future__ import annotations

import re

from ...errors import CheckpointError
from ...models.clip import ClipConfig, ClipModel
from ...models.config import CLIP_MEAN, CLIP_STD, Preprocess
from ...models.registry import get_entry, list_models
from ..convert import StateDict, unwrap
from ..infer import infer_config
from ..load import load_into
from .clip import block_key, convert_clip

# registered name -> pretrained tag -> Hugging Face repo holding open_clip's file of that pair
HUB = {
    "clip_vit_base_patch32": {"openai": "timm/vit_base_patch32_clip_224.openai"},
    "clip_vit_base_patch16": {"openai": "timm/vit_base_patch16_clip_224.openai"},
    "clip_vit_large_patch14": {"openai": "timm/vit_large_patch14_clip_224.openai"},
}
HUB_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# entries of OpenAI's TorchScript state dicts that are not weights
_NOT_WEIGHTS = ("input_resolution", "context_length", "vocab_size", "attn_mask")


def is_clip_pair(sd: StateDict) -> bool:
    return "token_embedding.weight" in sd and "text_projection" in sd and "visual.conv1.weight" in sd


def convert_clip_pair(sd: StateDict, act: str = "quick_gelu", text_heads: int | None = None,
                      vision_heads: int | None = None) -> tuple[StateDict, ClipConfig]:
    """An unwrapped OpenAI/open_clip state dict -> (state dict in the clip family's names, its config).
    `text_heads` / `vision_heads`: the head counts, when they are not width // 64."""
    if not is_clip_pair(sd):
        if "visual.conv1.weight" in sd or "conv1.weight" in sd:
            raise CheckpointError("this CLIP checkpoint has the image tower only (no token_embedding / "
                                  "text_projection): zero-shot needs the text tower too")
        raise CheckpointError("not an OpenAI / open_clip CLIP checkpoint (no visual.conv1.weight, "
                              f"token_embedding.weight, text_projection); first keys: {', '.join(sorted(sd)[:5])}")
    vis = convert_clip({k: v for k, v in sd.items() if k.startswith("visual.")})
    hints = {k: v for k, v in vis.hints.items() if not k.startswith("_")} | {"act": act}
    if vision_heads is not None:
        hints["num_heads"] = vision_heads
    vision = infer_config(vis.state_dict, hints, source="the CLIP checkpoint")
    out = {f"visual.{k}": v for k, v in vis.state_dict.items()}
    unknown = []
    for k, v in sd.items():
        if k.startswith("visual.") or k in _NOT_WEIGHTS:
            continue
        if k == "token_embedding.weight":
            out["text.token_embed.weight"] = v
        elif k == "positional_embedding":
            out["text.pos_embed"] = v  # [L, W]
        elif k.startswith("ln_final."):
            out["text.norm." + k[len("ln_final."):]] = v
        elif k == "text_projection":
            out["text.proj.weight"] = v.t().contiguous()  # x @ P == Linear with weight P.T: [E, W]
        elif k == "logit_scale":
            out["logit_scale"] = v.reshape(())  # open_clip may store [1]
        elif k.startswith("transformer.resblocks."):
            out["text.blocks." + block_key(k)] = v
        else:
            unknown.append(k)
    if unknown:  # e.g. a text projection with a bias or an attention-pooled text tower
        raise CheckpointError(f"CLIP text tower keys vitkit does not know: {', '.join(unknown[:6])}"
                              + (" ..." if len(unknown) > 6 else ""))
    vocab, width = out["text.token_embed.weight"].shape
    layers = 1 + max((int(m.group(1)) for k in out if (m := re.match(r"text\.blocks\.(\d+)\.", k))), default=-1)
    fc1 = out.get("text.blocks.0.mlp.fc1.weight")
    cfg = ClipConfig(
        embed_dim=out["text.proj.weight"].shape[0], vision=vision, context_length=out["text.pos_embed"].shape[0],
        vocab_size=vocab, text_width=width, text_heads=text_heads or max(1, width // 64), text_layers=layers,
        text_mlp_ratio=fc1.shape[0] / width if fc1 is not None else 4.0)
    if vision.num_classes != cfg.embed_dim:
        raise CheckpointError(f"the image projection is {vision.num_classes} wide, the text projection "
                              f"{cfg.embed_dim}: not one CLIP pair")
    return out, cfg


def clip_from_state_dict(raw: dict, source: str = "checkpoint", act: str = "quick_gelu",
                         text_heads: int | None = None, vision_heads: int | None = None, **overrides) -> ClipModel:
    """A ClipModel with the weights of an OpenAI/open_clip checkpoint already read into a dict (training
    containers and DDP prefixes are unwrapped). `overrides` change the config (e.g. img_size=336)."""
    sd, cfg = convert_clip_pair(unwrap(raw), act, text_heads, vision_heads)
    if overrides:
        cfg = cfg.replace(**overrides)
    arch = next((n for n in list_models(family="clip") if get_entry(n).cfg == cfg), None)
    model = ClipModel(cfg, preprocess=Preprocess(CLIP_MEAN, CLIP_STD, "bicubic", 1.0),
                      provenance={"arch": arch or f"clip {cfg.vision.embed_dim}/{cfg.vision.depth} patch "
                                  f"{cfg.vision.patch_size}, text {cfg.text_width}/{cfg.text_layers}",
                                  "source": source, "imported_from": "openai-clip"})
    load_into(model, sd, strict=True, source=source)
    return model
