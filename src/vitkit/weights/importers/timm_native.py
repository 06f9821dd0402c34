"""timm / vitkit names (also DeiT, MAE, DINO, DeiT III training dicts, which reuse them)."""
from __future__ import annotations

from ...errors import CheckpointError
from ...models.config import Preprocess
from ..convert import Imported, StateDict, layout

# MAE's pretraining model carries its decoder; DINOv2/MAE a mask token: none belong to the encoder.
_DROP_PREFIXES = ("decoder_", "mask_token")


def _is_timm(sd: StateDict) -> bool:
    return "patch_embed.proj.weight" in sd and any(k.startswith("blocks.") for k in sd)


def _timm_config_hints(cfg: dict | None) -> dict:
    """A timm hub folder's config.json ({'architecture', 'pretrained_cfg': {mean, std, ...}})."""
    if not cfg or "architecture" not in cfg:
        return {}
    hints: dict = {}
    if "quickgelu" in cfg["architecture"]:
        hints["act"] = "quick_gelu"
    pc = cfg.get("pretrained_cfg") or {}
    if "mean" in pc and "std" in pc:
        hints["_preprocess"] = Preprocess(tuple(pc["mean"]), tuple(pc["std"]), pc.get("interpolation", "bicubic"),
                                          float(pc.get("crop_pct", 0.9)))
    names = cfg.get("label_names")
    if isinstance(names, list) and names:
        hints["_class_names"] = names
    return hints


@layout("timm", _is_timm)
def convert_timm(sd: StateDict, hf_config=None) -> Imported:
    if any(".mlp.fc1_g." in k or ".mlp.w12." in k for k in sd):
        raise CheckpointError("checkpoint with a SwiGLU MLP (mlp.fc1_g/fc1_x): vitkit blocks have a GELU MLP "
                              "and cannot hold these weights")
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
    hints.update(_timm_config_hints(hf_config))
    layout_name = "mae" if any(k.startswith("decoder_") for k in dropped) else "timm"
    return Imported(out, layout_name, hints, dropped)
