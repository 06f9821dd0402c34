"""MAE decoders in MAE's own key names (see models/mae.py): from a transformers `ViTMAEForPreTraining`
state dict (`decoder.decoder_layers.{i}.attention.q_proj` in memory, `decoder.decoder_encoder.layer.{i}...` on disk) or an original MAE pretraining checkpoint
(`decoder_blocks.{i}...`, already MAE's names). The encoder half goes through the usual importers."""
from __future__ import annotations

import re

import torch

from ...errors import CheckpointError
from ..convert import StateDict
from .hf_transformers import _QKV, _RENAME

_HF_LAYER = re.compile(r"^decoder\.(?:decoder_layers|decoder_encoder\.layer)\.(\d+)\.(.+)\.(weight|bias)$")
_MAE_KEYS = ("decoder_embed.", "mask_token", "decoder_pos_embed", "decoder_blocks.", "decoder_norm.", "decoder_pred.")


def mae_decoder_state(sd: StateDict) -> StateDict:
    """The decoder's tensors of a pretraining checkpoint, in models.mae.MaeDecoder's names."""
    if any(k.startswith("decoder.decoder_") for k in sd):  # transformers' ViTMAEForPreTraining
        out: StateDict = {}
        qkv: dict[tuple[int, str], list] = {}
        for k, v in sd.items():
            if m := _HF_LAYER.match(k):
                i, mod, kind = int(m.group(1)), m.group(2), m.group(3)
                if mod in _QKV:
                    qkv.setdefault((i, kind), [None] * 3)[_QKV[mod]] = v
                elif mod in _RENAME:
                    out[f"decoder_blocks.{i}.{_RENAME[mod]}.{kind}"] = v
                else:
                    raise CheckpointError(f"{k}: an unknown ViTMAE decoder layer part")
            elif k.startswith("decoder."):
                out[k[len("decoder."):]] = v
        for (i, kind), parts in qkv.items():
            if any(p is None for p in parts):
                raise CheckpointError(f"ViTMAE decoder layer {i}: query/key/value {kind} incomplete")
            out[f"decoder_blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts, dim=0)  # rows q | k | v
        return out
    out = {k: v for k, v in sd.items() if k.startswith(_MAE_KEYS)}
    if not out:
        raise CheckpointError("no MAE decoder in this checkpoint (expected decoder_* keys, or ViTMAE's decoder.*)")
    return out
