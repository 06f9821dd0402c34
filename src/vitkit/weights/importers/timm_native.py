"""timm / vitkit names (also DeiT, MAE, DINO, DeiT III training dicts, which reuse them)."""
from __future__ import annotations

from ..convert import Imported, StateDict, layout

# MAE's pretraining model carries its decoder; DINOv2/MAE a mask token: none belong to the encoder.
_DROP_PREFIXES = ("decoder_", "mask_token")


def _is_timm(sd: StateDict) -> bool:
    return "patch_embed.proj.weight" in sd and any(k.startswith("blocks.") for k in sd)


@layout("timm", _is_timm)
def convert_timm(sd: StateDict, hf_config=None) -> Imported:
    out, dropped = {}, []
    hints = {}
    for k, v in sd.items():
        if k.startswith(_DROP_PREFIXES):
            dropped.append(k)
            continue
        # DeiT III names its LayerScale gamma_1/gamma_2
        k = k.replace(".gamma_1", ".ls1.gamma").replace(".gamma_2", ".ls2.gamma")
        out[k] = v
    layout_name = "mae" if any(k.startswith("decoder_") for k in dropped) else "timm"
    return Imported(out, layout_name, hints, dropped)
