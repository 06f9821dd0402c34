"""OpenAI CLIP / open_clip checkpoints with both towers -> the `clip` family (models/clip.py): its one layout.

One file holds the pair: `visual.*` (the image tower, renamed by the tower filter in clip.py),
`token_embedding.weight` [V, W], `positional_embedding` [L, W], `transformer.resblocks.{i}.*` (the same block
layout as the image tower), `ln_final`, `text_projection` [W, E] (applied as x @ P) and `logit_scale`.

`vitkit.load_model` of such a file is the whole CLIP (`load_model(path, tower="image")` or `.visual`: the image
tower alone, a ViT; `create_model(<a ViT name>, checkpoint_path=<pair>)` takes that tower too). What the weights
do not record is assumed as OpenAI's models have it: 64-wide attention heads in both towers and QuickGELU
(open_clip's LAION/DataComp weights use GELU: pass act="gelu"; other head counts: num_heads=, text_heads=).
The registered clip names' weights are open_clip's files in timm's hub repos (`HUB_FILES`).
"""
from __future__ import annotations

import re

from ...errors import CheckpointError
from ...models.clip import ClipConfig
from ..infer import infer_config
from ..layouts import Imported, StateDict, layout
from .clip import CLIP_PREPROCESS, block_key, convert_clip

# where timm's hub repos of OpenAI's CLIPs keep open_clip's file of the pair (model.safetensors is the image tower)
HUB_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# entries of OpenAI's TorchScript state dicts that are not weights
_NOT_WEIGHTS = ("input_resolution", "context_length", "vocab_size", "attn_mask")


def is_clip_pair(sd: StateDict) -> bool:
    return "token_embedding.weight" in sd and "text_projection" in sd and "visual.conv1.weight" in sd


def check_clip_pair(sd: StateDict) -> None:
    """One line saying why an unwrapped state dict is not a CLIP pair (nothing when it is one)."""
    if is_clip_pair(sd):
        return
    if "visual.conv1.weight" in sd or "conv1.weight" in sd:
        raise CheckpointError("this CLIP checkpoint has the image tower only (no token_embedding / "
                              "text_projection): zero-shot needs the text tower too")
    raise CheckpointError("not an OpenAI / open_clip CLIP checkpoint (no visual.conv1.weight, "
                          f"token_embedding.weight, text_projection); first keys: {', '.join(sorted(sd)[:5])}")


@layout("openai-clip", is_clip_pair, priority=6, family="clip", hub_files=HUB_FILES)
def convert_clip_pair(sd: StateDict, hf_config=None) -> Imported:
    """An unwrapped OpenAI/open_clip state dict -> the pair in the clip family's names, with its config (heads
    64 wide and QuickGELU assumed: load_model's overrides change them)."""
    check_clip_pair(sd)
    vis = convert_clip({k: v for k, v in sd.items() if k.startswith("visual.")})
    vision = infer_config(vis.state_dict, vis.hints, source="the CLIP checkpoint")
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
        vocab_size=vocab, text_width=width, text_heads=max(1, width // 64), text_layers=layers,
        text_mlp_ratio=fc1.shape[0] / width if fc1 is not None else 4.0)
    if vision.num_classes != cfg.embed_dim:
        raise CheckpointError(f"the image projection is {vision.num_classes} wide, the text projection "
                              f"{cfg.embed_dim}: not one CLIP pair")
    dropped = [k for k in sd if k in _NOT_WEIGHTS]
    return Imported(out, "openai-clip", vis.hints, dropped, preprocess=CLIP_PREPROCESS, family="clip", config=cfg)
