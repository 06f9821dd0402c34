"""Original JAX checkpoints (.npz): vit_jax / AugReg and big_vision -> vitkit names, and back. Hybrid (R+ViT)
checkpoints add their ResNetV2 (`conv_root`, `gn_root`, `block{s}/unit{u}/...`, see importers/hybrid.py).

Keys are a flattened pytree ('/'-separated) under a prefix: '' (vit_jax), 'opt/target/' (old),
'params/' (big_vision), 'params/img/' (SigLIP image tower). Blocks are `Transformer/encoderblock_{i}`
or, for scanned models, one `Transformer/encoderblock` whose arrays carry a leading depth axis.
Sub-module numbering differs (vit_jax: LayerNorm_0, MultiHeadDotProductAttention_1, LayerNorm_2,
MlpBlock_3; big_vision: LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0), so
they are matched by kind, not by number. big_vision's MAP head (SigLIP's attention pooling) is
`MAPHead_0/{probe, MultiHeadDotProductAttention_0, LayerNorm_0, MlpBlock_0}` -> `attn_pool.*`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch

from ...errors import CheckpointError
from ...models.config import INCEPTION_MEAN, INCEPTION_STD, Preprocess
from ..layouts import Imported, StateDict, layout
from .hybrid import BACKBONE, backbone_from_jax, backbone_to_jax, hybrid_hints

_PREFIXES = ("", "opt/target/", "params/", "params/img/")


def _prefix(sd: StateDict) -> str | None:
    return next((p for p in _PREFIXES if f"{p}embedding/kernel" in sd), None)


def _is_jax(sd: StateDict) -> bool:
    return _prefix(sd) is not None


def _block_modules(w: StateDict, bp: str) -> dict[str, str]:
    """Map norm1/attn/norm2/mlp to the module names used inside block prefix `bp`."""
    mods = {k[len(bp):].split("/", 1)[0] for k in w if k.startswith(bp)}
    lns = sorted((m for m in mods if m.startswith("LayerNorm_")), key=lambda m: int(m.rsplit("_", 1)[1]))
    mha = [m for m in mods if m.startswith("MultiHeadDotProductAttention_")]
    mlp = [m for m in mods if m.startswith("MlpBlock_")]
    if len(lns) != 2 or len(mha) != 1 or len(mlp) != 1:
        raise CheckpointError(f"JAX checkpoint: unexpected block structure under {bp}: {sorted(mods)}")
    return {"norm1": lns[0], "norm2": lns[1], "attn": mha[0], "mlp": mlp[0]}


def _projections_from_jax(get, mha: str, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flax per-head Dense kernels `{mha}/{name}/kernel` [D, H, Dh] (biases [H, Dh]) -> one torch Linear's
    weight [len(names) * D, D] and bias, the projections stacked in `names` order (q|k|v for qkv)."""
    weight = torch.cat([get(f"{mha}/{n}/kernel").flatten(1).t() for n in names])  # [len(names) * H * Dh, D]
    bias = torch.cat([get(f"{mha}/{n}/bias").reshape(-1) for n in names])
    return weight, bias


def _projections_to_jax(weight: torch.Tensor, bias: torch.Tensor, mha: str, names: tuple[str, ...],
                        num_heads: int) -> dict[str, torch.Tensor]:
    """The inverse of `_projections_from_jax`: a Linear [len(names) * D, D] -> per-head kernels [D, H, Dh]."""
    out = {}
    for n, w, b in zip(names, weight.chunk(len(names), 0), bias.chunk(len(names), 0)):  # w [H * Dh, D]
        head_dim = w.shape[0] // num_heads
        out[f"{mha}/{n}/kernel"] = w.t().reshape(w.shape[1], num_heads, head_dim)  # [D, H, Dh]
        out[f"{mha}/{n}/bias"] = b.reshape(num_heads, head_dim)
    return out


def _map_head_from_jax(w: StateDict) -> tuple[StateDict, int]:
    """big_vision's MAPHead_0 -> vitkit's attention pooling (`attn_pool.*`, timm's names); also its head count."""
    mha = "MultiHeadDotProductAttention_0"

    def get(name: str) -> torch.Tensor:
        return w["MAPHead_0/" + name]

    out: StateDict = {"attn_pool.latent": get("probe")}  # [1, 1, D]: the learned query
    out["attn_pool.q.weight"], out["attn_pool.q.bias"] = _projections_from_jax(get, mha, ("query",))  # [D, D]
    out["attn_pool.kv.weight"], out["attn_pool.kv.bias"] = _projections_from_jax(get, mha, ("key", "value"))  # [2D, D]
    out["attn_pool.proj.weight"] = get(f"{mha}/out/kernel").flatten(0, 1).t().contiguous()  # [H, Dh, D] -> [D, D]
    out["attn_pool.proj.bias"] = get(f"{mha}/out/bias")
    out["attn_pool.norm.weight"], out["attn_pool.norm.bias"] = get("LayerNorm_0/scale"), get("LayerNorm_0/bias")
    for j in (0, 1):
        out[f"attn_pool.mlp.fc{j + 1}.weight"] = get(f"MlpBlock_0/Dense_{j}/kernel").t().contiguous()
        out[f"attn_pool.mlp.fc{j + 1}.bias"] = get(f"MlpBlock_0/Dense_{j}/bias")
    return out, get(f"{mha}/query/kernel").shape[1]


def _map_head_to_jax(t: StateDict, num_heads: int) -> dict[str, torch.Tensor]:
    """The inverse of `_map_head_from_jax`: `attn_pool.*` -> MAPHead_0/..."""
    mha = "MAPHead_0/MultiHeadDotProductAttention_0"
    D = t["attn_pool.latent"].shape[-1]
    out = {"MAPHead_0/probe": t["attn_pool.latent"],
           "MAPHead_0/LayerNorm_0/scale": t["attn_pool.norm.weight"], "MAPHead_0/LayerNorm_0/bias": t["attn_pool.norm.bias"],
           f"{mha}/out/kernel": t["attn_pool.proj.weight"].t().reshape(num_heads, D // num_heads, D),  # [H, Dh, D]
           f"{mha}/out/bias": t["attn_pool.proj.bias"]}
    out |= _projections_to_jax(t["attn_pool.q.weight"], t["attn_pool.q.bias"], mha, ("query",), num_heads)
    out |= _projections_to_jax(t["attn_pool.kv.weight"], t["attn_pool.kv.bias"], mha, ("key", "value"), num_heads)
    for j in (0, 1):
        out[f"MAPHead_0/MlpBlock_0/Dense_{j}/kernel"] = t[f"attn_pool.mlp.fc{j + 1}.weight"].t()
        out[f"MAPHead_0/MlpBlock_0/Dense_{j}/bias"] = t[f"attn_pool.mlp.fc{j + 1}.bias"]
    return out


@layout("jax-npz", _is_jax)
def convert_jax(sd: StateDict, hf_config=None) -> Imported:
    p = _prefix(sd)
    w = {k[len(p):]: v.float() for k, v in sd.items() if k.startswith(p)}
    dropped = [k for k in sd if not k.startswith(p)]
    kernel = w["embedding/kernel"]
    if kernel.ndim != 4:
        raise CheckpointError(f"JAX checkpoint: embedding/kernel has shape {tuple(kernel.shape)}; "
                              "only convolutional (p, p, C, D) patch embeddings are supported")
    out: StateDict = {"patch_embed.proj.weight": kernel.permute(3, 2, 0, 1).contiguous()}  # HWIO -> OIHW
    backbone_keys: set[str] = set()
    if "conv_root/kernel" in w:  # a hybrid (R+ViT): the ResNetV2 that makes the feature map the patches come from
        backbone, backbone_keys = backbone_from_jax(w)
        out.update(backbone)
    if "embedding/bias" in w:
        out["patch_embed.proj.bias"] = w["embedding/bias"]
    if "cls" in w:
        out["cls_token"] = w["cls"]  # [1, 1, D]
    hints: dict = {}
    if "Transformer/posembed_input/pos_embedding" in w:  # vit_jax: the table includes the cls slot
        out["pos_embed"] = w["Transformer/posembed_input/pos_embedding"]
    elif "pos_embedding" in w:  # big_vision: positions are added before the cls token is prepended
        out["pos_embed"] = w["pos_embedding"]
        hints["prefix_pos"] = False

    scanned = "Transformer/encoderblock/LayerNorm_0/scale" in w
    if scanned:
        depth = w["Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
    else:
        depth = 1 + max((int(m.group(1)) for k in w if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))),
                        default=-1)
    num_heads = None
    for i in range(depth):
        bp = "Transformer/encoderblock/" if scanned else f"Transformer/encoderblock_{i}/"

        def get(name: str, bp: str = bp, i: int = i) -> torch.Tensor:
            t = w[bp + name]
            return t[i] if scanned else t

        mods = _block_modules(w, bp)
        o = f"blocks.{i}."
        for ln in ("norm1", "norm2"):
            out[o + ln + ".weight"] = get(f"{mods[ln]}/scale")
            out[o + ln + ".bias"] = get(f"{mods[ln]}/bias")
        a = mods["attn"]
        q = get(f"{a}/query/kernel")  # [D, H, Dh]
        num_heads = q.shape[1]
        out[o + "attn.qkv.weight"], out[o + "attn.qkv.bias"] = _projections_from_jax(
            get, a, ("query", "key", "value"))  # [3D, D], [3D]
        out[o + "attn.proj.weight"] = get(f"{a}/out/kernel").flatten(0, 1).t().contiguous()  # [H, Dh, D] -> [D, D]
        out[o + "attn.proj.bias"] = get(f"{a}/out/bias")
        for j in (0, 1):
            out[o + f"mlp.fc{j + 1}.weight"] = get(f"{mods['mlp']}/Dense_{j}/kernel").t().contiguous()
            out[o + f"mlp.fc{j + 1}.bias"] = get(f"{mods['mlp']}/Dense_{j}/bias")
    if "Transformer/encoder_norm/scale" in w:
        out["norm.weight"] = w["Transformer/encoder_norm/scale"]
        out["norm.bias"] = w["Transformer/encoder_norm/bias"]
    map_head_keys = {k for k in w if k.startswith("MAPHead_0/")}
    if map_head_keys:  # SigLIP's attention pooling over the encoder's (normed) tokens
        map_head, pool_heads = _map_head_from_jax(w)
        out.update(map_head)
        if pool_heads != num_heads:
            hints["pool_num_heads"] = int(pool_heads)
    if "pre_logits/kernel" in w:  # original i21k checkpoints: a tanh representation layer before the head
        out["pre_logits.fc.weight"] = w["pre_logits/kernel"].t().contiguous()
        out["pre_logits.fc.bias"] = w["pre_logits/bias"]
    if "head/kernel" in w and w["head/kernel"].numel():
        out["head.weight"] = w["head/kernel"].t().contiguous()
        out["head.bias"] = w["head/bias"]
    used = {"embedding/kernel", "embedding/bias", "cls", "Transformer/posembed_input/pos_embedding", "pos_embedding",
            "Transformer/encoder_norm/scale", "Transformer/encoder_norm/bias", "pre_logits/kernel", "pre_logits/bias",
            "head/kernel", "head/bias"}
    used |= backbone_keys | map_head_keys
    dropped += [p + k for k in w if k not in used and not k.startswith("Transformer/encoderblock")]
    if backbone_keys:
        hints.update(hybrid_hints(out))  # the stem, the patch in pixels, the image size
    if num_heads:
        hints["num_heads"] = int(num_heads)
    # flax's nn.gelu is the tanh approximation; LN eps 1e-6; inputs in [-1, 1], plain bilinear resize
    hints.update(act="gelu_tanh", norm_eps=1e-6)
    name = "big_vision-npz" if "prefix_pos" in hints or p.startswith("params/") else "vit_jax-npz"
    return Imported(out, name, hints, dropped, preprocess=Preprocess(INCEPTION_MEAN, INCEPTION_STD, "bilinear", 1.0))


def to_jax_arrays(sd: StateDict, num_heads: int, style: str = "vit_jax", scan: bool = False,
                  prefix: str | None = None, pool_num_heads: int | None = None) -> dict[str, np.ndarray]:
    """A vitkit/timm-named state dict -> flat JAX pytree arrays (the inverse of `convert_jax`).

    style 'vit_jax': Transformer/posembed_input holds the cls row (prefix_pos=True models);
    'big_vision': top-level pos_embedding without prefix rows (prefix_pos=False or no cls token).
    A MAP head (`attn_pool.*`) is written as big_vision's MAPHead_0 with `pool_num_heads` (default: num_heads).
    """
    if style not in ("vit_jax", "big_vision"):
        raise ValueError("style must be 'vit_jax' or 'big_vision'")
    bv = style == "big_vision"
    prefix = ("params/" if bv else "") if prefix is None else prefix
    t = {k: v.detach().float().cpu() for k, v in sd.items()}
    D = t["patch_embed.proj.weight"].shape[0]
    H, Dh = num_heads, D // num_heads
    names = ("MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0") if bv else \
        ("MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
    mha, ln2, mlp = names
    out: dict[str, torch.Tensor] = {"embedding/kernel": t["patch_embed.proj.weight"].permute(2, 3, 1, 0)}
    if "patch_embed.proj.bias" in t:
        out["embedding/bias"] = t["patch_embed.proj.bias"]
    if "cls_token" in t:
        out["cls"] = t["cls_token"]
    if "pos_embed" in t:
        out["pos_embedding" if bv else "Transformer/posembed_input/pos_embedding"] = t["pos_embed"]
    depth = 1 + max((int(m.group(1)) for k in t if (m := re.match(r"blocks\.(\d+)\.", k))), default=-1)
    blocks = []
    for i in range(depth):
        def b(n: str, i: int = i) -> torch.Tensor:
            return t[f"blocks.{i}.{n}"]

        blk = {"LayerNorm_0/scale": b("norm1.weight"), "LayerNorm_0/bias": b("norm1.bias"),
               f"{ln2}/scale": b("norm2.weight"), f"{ln2}/bias": b("norm2.bias"),
               f"{mha}/out/kernel": b("attn.proj.weight").t().reshape(H, Dh, D), f"{mha}/out/bias": b("attn.proj.bias")}
        blk |= _projections_to_jax(b("attn.qkv.weight"), b("attn.qkv.bias"), mha, ("query", "key", "value"), H)
        for j in (0, 1):
            blk[f"{mlp}/Dense_{j}/kernel"] = b(f"mlp.fc{j + 1}.weight").t()
            blk[f"{mlp}/Dense_{j}/bias"] = b(f"mlp.fc{j + 1}.bias")
        blocks.append(blk)
    if scan and blocks:
        for n in blocks[0]:
            out[f"Transformer/encoderblock/{n}"] = torch.stack([blk[n] for blk in blocks])  # [depth, ...]
    else:
        for i, blk in enumerate(blocks):
            out.update({f"Transformer/encoderblock_{i}/{n}": v for n, v in blk.items()})
    if "norm.weight" in t:
        out["Transformer/encoder_norm/scale"], out["Transformer/encoder_norm/bias"] = t["norm.weight"], t["norm.bias"]
    if "pre_logits.fc.weight" in t:
        out["pre_logits/kernel"], out["pre_logits/bias"] = t["pre_logits.fc.weight"].t(), t["pre_logits.fc.bias"]
    if "head.weight" in t:
        out["head/kernel"], out["head/bias"] = t["head.weight"].t(), t["head.bias"]
    if "attn_pool.latent" in t:
        out.update(_map_head_to_jax(t, pool_num_heads or num_heads))
    if any(k.startswith(BACKBONE) for k in t):  # a ResNetV2 hybrid (other stems are refused there)
        out.update(backbone_to_jax(t))
    return {prefix + k: np.ascontiguousarray(v.numpy()) for k, v in out.items()}


def export_npz(model, path: str | os.PathLike, style: str = "vit_jax", scan: bool = False) -> Path:
    """Write a vitkit model as a JAX .npz checkpoint (vit_jax or big_vision naming) that timm's and
    vitkit's npz loaders read. big_vision style needs a model without class-position rows."""
    cfg = model.cfg
    if cfg.distilled or cfg.num_reg_tokens or cfg.use_fc_norm or not cfg.patch_bias or cfg.pre_norm \
            or cfg.init_values is not None or cfg.qk_norm:
        raise CheckpointError("export_npz: the JAX layouts hold plain ViTs only (no distillation/register tokens, "
                              "fc_norm, LayerScale, qk-norm, pre-norm)")
    if cfg.class_token and (style == "big_vision") == cfg.prefix_pos:
        need = "prefix_pos=False" if style == "big_vision" else "prefix_pos=True"
        raise CheckpointError(f"export_npz: style {style!r} needs a model with {need}")
    arrays = to_jax_arrays(model.state_dict(), cfg.num_heads, style, scan, pool_num_heads=cfg.pool_num_heads)
    path = Path(path)
    from ..._files import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return path
