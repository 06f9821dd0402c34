"""timm / vitkit names (also DeiT, MAE, DINO, DeiT III training dicts, which reuse them)."""
from __future__ import annotations

from ...errors import CheckpointError
from ...models.config import Preprocess
from ..layouts import Imported, StateDict, layout

# MAE's pretraining model carries its decoder; DINOv2/MAE a mask token: none belong to the encoder.
_DROP_PREFIXES = ("decoder_", "mask_token")


def _is_timm(sd: StateDict) -> bool:
    return "patch_embed.proj.weight" in sd and any(k.startswith("blocks.") for k in sd)


def timm_hub_metadata(cfg: dict | None) -> tuple[dict, Preprocess | None, list[str] | None]:
    """What a timm hub folder's config.json ({'architecture', 'pretrained_cfg': {mean, std, ...}, 'label_names'})
    says beyond the weights -> (config hints, preprocessing, class names)."""
    if not cfg or "architecture" not in cfg:
        return {}, None, None
    hints: dict = {}
    if "quickgelu" in cfg["architecture"]:
        hints["act"] = "quick_gelu"
    pc = cfg.get("pretrained_cfg") or {}
    preprocess = None
    if "mean" in pc and "std" in pc:
        preprocess = Preprocess(tuple(pc["mean"]), tuple(pc["std"]), pc.get("interpolation", "bicubic"),
                                float(pc.get("crop_pct", 0.9)))
    names = cfg.get("label_names")
    return hints, preprocess, names if isinstance(names, list) and names else None


def _registered_hints(cfg: dict | None, sd: StateDict) -> dict:
    """What a timm hub folder's architecture name says beyond the shapes (heads, activation, LayerNorm epsilon,
    rotary and pooling settings, post-norm blocks), when that name is registered here with the width these weights
    have (a narrowed copy keeps only the name)."""
    from ...models.registry import get_entry, list_models

    arch = str((cfg or {}).get("architecture", ""))
    if arch not in list_models(family="vit"):
        return {}
    entry, w = get_entry(arch), sd.get("patch_embed.proj.weight")
    if w is None or w.shape[0] != entry.cfg.embed_dim:
        return {}
    cfg = entry.cfg
    hints = {"num_heads": cfg.num_heads, "act": cfg.act, "norm_eps": cfg.norm_eps}
    # fixed rotary positions, post-norm blocks and MAP pooling over prefix tokens leave no tensor of their own:
    # only the name says so
    keys = ("rope", "rope_temperature", "rope_grid_offset", "rope_xy", "rope_ref_grid", "rope_rotate_half",
            "pool_include_prefix", "pool_num_heads", "post_norm")
    return hints | {k: getattr(cfg, k) for k in keys}


@layout("timm", _is_timm)
def convert_timm(sd: StateDict, hf_config=None) -> Imported:
    if any(".mlp.w12." in k for k in sd):
        raise CheckpointError("checkpoint with an xformers-style SwiGLU MLP (mlp.w12/w3): import it from the DINOv2 "
                              "layout (its own key names) or convert it with timm first")
    out, dropped = {}, []
    for k, v in sd.items():
        if k.startswith(_DROP_PREFIXES):
            dropped.append(k)
            continue
        # DeiT III names its LayerScale gamma_1/gamma_2
        k = k.replace(".gamma_1", ".ls1.gamma").replace(".gamma_2", ".ls2.gamma")
        out[k] = v
    hints: dict = {}
    if "norm_pre.weight" in out and "patch_embed.proj.bias" not in out:
        hints["norm_eps"] = 1e-5  # timm's CLIP towers (pre-norm, bias-free patch conv) use torch's LayerNorm
    hints.update(_registered_hints(hf_config, out))
    stated, preprocess, class_names = timm_hub_metadata(hf_config)
    hints.update(stated)
    return Imported(out, "timm", hints, dropped, preprocess=preprocess, class_names=class_names)
