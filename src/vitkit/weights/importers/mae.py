"""MAE pretraining checkpoints with their decoder -> the `mae` family (models/mae.py): the whole model.

- original (facebookresearch/mae `models_mae.py`, `{'model': sd}`): the encoder in timm's names beside
  `mask_token`, `decoder_embed`, `decoder_pos_embed`, `decoder_blocks.{i}.*` (timm's Block names),
  `decoder_norm`, `decoder_pred`, already MaeDecoder's names. Not recorded: the decoder's heads (MAE's models
  all have 16), LayerNorm eps (1e-6, MAE's `partial(nn.LayerNorm, eps=1e-6)`), mask ratio and target (0.75 and
  norm_pix_loss, as MAE's released decoders were trained);
- transformers' `ViTMAEForPreTraining` (an HF folder or its state dict): `vit.*` (the encoder, through the
  hf-transformers filter) and `decoder.decoder_layers.{i}.attention.q_proj` in memory /
  `decoder.decoder_encoder.layer.{i}.attention.attention.query` on disk; config.json gives the decoder's
  width, depth, heads, MLP, activation, `layer_norm_eps` (1e-12 by default, encoder and decoder alike),
  `mask_ratio` and `norm_pix_loss`.

An encoder-only file (MAE's `mae_pretrain_vit_base.pth`, a ViTMAEModel folder) stays a ViT.
"""
from __future__ import annotations

import re

import torch

from ...errors import CheckpointError
from ...models.config import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from ...models.mae import MaeConfig
from ..infer import default_heads, infer_config
from ..layouts import Imported, StateDict, layout
from .hf_transformers import _ACTS, _QKV, _RENAME, _is_hf, convert_hf
from .timm_native import convert_timm

_HF_LAYER = re.compile(r"^decoder\.(?:decoder_layers|decoder_encoder\.layer)\.(\d+)\.(.+)\.(weight|bias)$")
_MAE_KEYS = ("decoder_embed.", "mask_token", "decoder_pos_embed", "decoder_blocks.", "decoder_norm.", "decoder_pred.")
# MAE's main_finetune / main_linprobe evaluation: ImageNet statistics, bicubic resize to 256, crop 224
_MAE_PREPROCESS = Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", 0.875)


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
            out[f"decoder_blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts, dim=0)  # [3 Dd, Dd]: rows q | k | v
        return out
    out = {k: v for k, v in sd.items() if k.startswith(_MAE_KEYS)}
    if not out:
        raise CheckpointError("no MAE decoder in this checkpoint (expected decoder_* keys, or ViTMAE's decoder.*)")
    return out


def _decoder_shape(dec: StateDict) -> dict:
    """Width, depth and MLP ratio of a decoder in MaeDecoder's names, read off the shapes."""
    if "decoder_embed.weight" not in dec or "decoder_pred.weight" not in dec:
        raise CheckpointError("MAE decoder without decoder_embed / decoder_pred weights")
    width = dec["decoder_embed.weight"].shape[0]
    depth = 1 + max((int(m.group(1)) for k in dec if (m := re.match(r"decoder_blocks\.(\d+)\.", k))), default=-1)
    fc1 = dec.get("decoder_blocks.0.mlp.fc1.weight")
    return {"decoder_dim": width, "decoder_depth": depth,
            "decoder_mlp_ratio": fc1.shape[0] / width if fc1 is not None else 4.0}


def _whole(encoder: Imported, decoder: StateDict, decoder_cfg: dict, layout_name: str, source: str) -> Imported:
    vit = infer_config(encoder.state_dict, encoder.hints, source=source)
    cfg = MaeConfig(encoder=vit, **_decoder_shape(decoder), **decoder_cfg)
    pixels = cfg.encoder.patch_size ** 2 * cfg.in_chans
    if decoder["decoder_pred.weight"].shape[0] != pixels:
        raise CheckpointError(f"the MAE decoder predicts {decoder['decoder_pred.weight'].shape[0]} values per patch; "
                              f"the encoder's patches hold {pixels}: not one MAE")
    sd = {f"encoder.{k}": v for k, v in encoder.state_dict.items()} | {f"decoder.{k}": v for k, v in decoder.items()}
    return Imported(sd, layout_name, encoder.hints, [], preprocess=encoder.preprocess or _MAE_PREPROCESS,
                    family="mae", config=cfg)


def _is_mae_pretraining(sd: StateDict) -> bool:
    return "patch_embed.proj.weight" in sd and "decoder_embed.weight" in sd and "decoder_pred.weight" in sd


@layout("mae", _is_mae_pretraining, priority=6, family="mae")
def convert_mae(sd: StateDict, hf_config=None) -> Imported:
    decoder = mae_decoder_state(sd)
    encoder = convert_timm({k: v for k, v in sd.items() if not k.startswith(_MAE_KEYS)}, hf_config)
    width = decoder["decoder_embed.weight"].shape[0]
    heads = 16 if width % 16 == 0 else default_heads(width)  # MAE's decoders: 16 heads
    return _whole(encoder, decoder, {"decoder_heads": heads, "decoder_eps": 1e-6}, "mae", "the MAE checkpoint")


def _is_hf_mae_pretraining(sd: StateDict) -> bool:
    return _is_hf(sd) and "decoder.decoder_embed.weight" in sd


@layout("hf-vitmae-pretraining", _is_hf_mae_pretraining, priority=6, family="mae")
def convert_hf_mae(sd: StateDict, hf_config: dict | None = None) -> Imported:
    cfg = hf_config or {}
    decoder = mae_decoder_state(sd)
    encoder = convert_hf({k: v for k, v in sd.items() if not k.startswith("decoder.")}, hf_config)
    act = cfg.get("hidden_act", "gelu")
    if act not in _ACTS:
        raise CheckpointError(f"HF config hidden_act={act!r} is not supported (vitkit has {sorted(set(_ACTS.values()))})")
    # transformers' defaults where the folder has no config.json
    decoder_cfg = {"decoder_heads": int(cfg.get("decoder_num_attention_heads", 16)),
                   "decoder_eps": float(cfg.get("layer_norm_eps", 1e-12)), "decoder_act": _ACTS[act],
                   "mask_ratio": float(cfg.get("mask_ratio", 0.75)), "norm_pix_loss": bool(cfg.get("norm_pix_loss", False))}
    return _whole(encoder, decoder, decoder_cfg, "hf-vitmae-pretraining", "the ViTMAE checkpoint")
