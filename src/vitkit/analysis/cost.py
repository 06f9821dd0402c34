"""What a ViT costs, in closed form from its config: tokens, parameters, MACs, training activation memory.

Nothing is instantiated but on the meta device (no memory, no compute): a hybrid's CNN stem and each block's MLP
layer are counted there, on the layer itself (for the plain MLP that gives the formulas below), so ViT-H/14 or
ViT-g cost as little to analyse as a tiny model.

Parameters, split by part (they add up to `sum(p.numel() for p in model.parameters())` exactly):
  patch_embed  conv C*p*p*D (+ D bias)
  attention    qkv 3D*D (+ 3D bias), proj D*D + D, q/k LayerNorms (qk_norm), LayerScale ls1
  mlp          fc1 D*Hm + Hm, fc2 Hm*D + D, LayerScale ls2 (the plain MLP; other layers: their own parameters)
  norms        every other LayerNorm: norm1/norm2 per block, norm_pre, final norm / fc_norm
  pos_prefix   the position table (grid + prefix rows when prefix_pos) and class/distillation/register tokens
  head         head (+ head_dist for DeiT distilled) (+ pre_logits Linear)

Forward MACs (multiply-accumulates; FLOPs = 2 * MACs) per image, with T tokens, N patches, L layers:
  patch_embed   N * C*p*p * D
  attn_proj     L * T * 4D^2          (qkv and output projection)
  attn_scores   L * 2 * T^2 * D       (QK^T and the attention-weighted sum AV, over all heads)
  mlp           L * 2 * T * D * Hm      (the plain MLP; other layers: what FlopCounterMode counts on them)
  head          D' * K (+ D * R for pre_logits), twice for DeiT distilled
With token merging (`merge=R`, ToMe; layers/tome.py) block i's attention runs on its T_i tokens and its MLP on
the T_i - r_i left after the merge, and attn_scores adds the matching's similarity matmul, ceil(T_i/2) *
floor(T_i/2) * Dh per merging block (its gathers and scatters are not counted); activation memory is given
for the unmerged model.
Element-wise work (LayerNorm, softmax, GELU, residual adds) is not counted, as in torch's FlopCounterMode;
timm's published numbers count LayerNorms and come out about 0.1% higher.

Training activation memory = the tensors autograd saves for backward in one forward pass (the bulk of
activation memory at the peak; gradients, weights and optimizer state are separate). Per sample, in elements:
  image                       C * H * W                       (the patch conv keeps its input)
  per block                   8 T D + 2 T Hm + 4 T + A
      8 T D:   both LayerNorm inputs and outputs (4), the qkv output holding q, k, v (3), the attention output (1)
      2 T Hm:  the MLP hidden before and after the activation
      4 T:     LayerNorm mean / rstd
      A:       H T (softmax log-sum-exp) with fused attention; H T^2 (the probabilities) on the eager path
      qk_norm: + 3 T D + 4 H T (normalised q and k, their stats, and a copy of the attention output for proj)
      LayerScale: + 2 T D (the two branch outputs it scales)
  norm_pre (CLIP)             T D + 2 T
  tail                        final norm on tokens T D + 2 T; pooled input of the head: T D for the class token
                              (a view of all tokens), T D + D for max, D for avg; fc_norm D + 2; pre_logits R
                              per head (assumes a classifier head reads the pooled features)
Bytes = elements * bytes per element of `dtype` (fp32 4, bf16/fp16 2). Dropout / drop-path masks are not
counted (the registry models train without them by default). Under autocast, LayerNorm runs in fp32, so a
bf16 autocast run saves a little more than the pure-bf16 figure given here.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..api import load_model
from ..errors import CheckpointError, ConfigError
from ..layers.tome import tokens_per_block
from ..models import ViTConfig, decode_variant, get_entry, get_family
from ..models.cost import MAC_PARTS, PARAM_PARTS, activation_elements, mac_counts, param_counts
from ..weights.io import parse_vitkit_meta, read_safetensors_meta

__all__ = ["MAC_PARTS", "PARAM_PARTS", "CostReport", "activation_elements", "mac_counts", "model_cost", "param_counts"]
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
_TORCH_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_VARIANT = re.compile(r"\w+/\d+(?:@\d+)?")
_CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz", ".ckpt")


class _PerImage:
    """What both cost reports derive from their totals: GMACs per image and a JSON-ready dict."""

    macs_total: int
    batch: int
    img_size: tuple[int, int]

    @property
    def gmacs_per_image(self) -> float:
        return self.macs_total / self.batch / 1e9

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["img_size"] = list(self.img_size)
        d["gmacs_per_image"] = self.gmacs_per_image
        return d


@dataclass
class CostReport(_PerImage):
    name: str
    img_size: tuple[int, int]
    patch_size: int
    grid: tuple[int, int]
    patches: int
    prefix_tokens: int
    tokens: int
    layers: int
    heads: int
    width: int
    mlp_hidden: int
    attn_scores_per_head_layer: int  # T^2: entries of one head's attention matrix
    attn_scores_per_image: int  # L * H * T^2
    params: dict[str, int]  # by part, see PARAM_PARTS
    params_total: int
    batch: int
    macs: dict[str, int]  # by part for the whole batch, see MAC_PARTS
    macs_total: int
    dtype: str
    fused_attention: bool
    activation_bytes: int  # saved-for-backward activations of one training forward, whole batch
    weight_bytes: int  # the parameters stored in `dtype`
    train_state_bytes: int  # fp32 weights + grads + AdamW moments: 16 bytes per parameter
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    merge: int = 0  # tokens merged per block (ToMe); activation_bytes are the unmerged model's
    tokens_per_block: list[int] = field(default_factory=list)  # entering each block, then leaving the last

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {"grid": list(self.grid)}


@dataclass
class FamilyCostReport(_PerImage):
    """The closed-form cost of a model of another family (its `Family.cost`): parameters and MACs by part,
    and the family's own per-stage figures (Swin: tokens, windows, window vs global attention scores)."""

    name: str
    family: str
    img_size: tuple[int, int]
    params: dict[str, int]
    params_total: int
    batch: int
    macs: dict[str, int]  # by part for the whole batch
    macs_total: int
    dtype: str
    weight_bytes: int
    train_state_bytes: int
    stages: dict[str, dict[str, int]] = field(default_factory=dict)  # figure -> stage -> value, per image
    config: dict[str, Any] = field(default_factory=dict, repr=False)


def family_cost(cfg: Any, name: str, batch: int, dtype: str) -> FamilyCostReport:
    from ..models import FAMILIES

    fam = next(f for f in FAMILIES.values() if isinstance(cfg, f.config))
    _need_closed_form(fam.name, name)
    cost = fam.cost(cfg)
    params, macs = cost["params"], {k: v * batch for k, v in cost["macs"].items()}
    total, nbytes = sum(params.values()), DTYPE_BYTES[dtype]
    return FamilyCostReport(name, fam.name, tuple(cfg.img_size), params, total, batch, macs, sum(macs.values()),
                            dtype, total * nbytes, total * 16,
                            {k: v for k, v in cost.items() if k not in ("params", "macs")}, cfg.to_dict())


# ---------------------------------------------------------------------------- resolving what to cost
def config_from_file(path: str | os.PathLike) -> tuple[ViTConfig, str]:
    """A checkpoint's architecture: vitkit safetensors carry it in their header (no tensors are read);
    other layouts are imported with `load_model` and read off the weights."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".safetensors":
        vk = parse_vitkit_meta(read_safetensors_meta(path), path)
        if vk is not None:
            name = (vk.get("provenance") or {}).get("arch") or path.name
            _need_closed_form(vk["family"], name)
            return get_family(vk["family"]).config.from_dict(vk["config"]), name
    return load_model(path).cfg, path.name


def _need_closed_form(family: str, what: str) -> None:
    if get_family(family).cost is None:
        raise ConfigError(f"{what}: the {family} family has no closed-form cost (it is computed for ViTs); "
                          "count parameters with sum(p.numel() for p in model.parameters())")


def resolve_config(spec: Any) -> tuple[ViTConfig, str]:
    """A model, a ViTConfig, a registered name, a big_vision variant ('B/16', 'S/14@518') or a checkpoint path."""
    if isinstance(spec, ViTConfig):
        return spec, "config"
    cfg = getattr(spec, "cfg", None)
    if isinstance(cfg, ViTConfig):  # a VisionTransformer (its cfg follows set_input_size / reset_classifier)
        return cfg, (getattr(spec, "provenance", None) or {}).get("arch", type(spec).__name__)
    if hasattr(spec, "family"):  # a model of another family
        _need_closed_form(spec.family, type(spec).__name__)
        return spec.cfg, (getattr(spec, "provenance", None) or {}).get("arch", type(spec).__name__)
    if not isinstance(spec, (str, os.PathLike)):
        raise ConfigError(f"cannot cost a {type(spec).__name__}; give a model, a ViTConfig, a name or a path")
    text = os.fspath(spec)
    if os.path.exists(text):
        return config_from_file(text)
    if _VARIANT.fullmatch(text):
        return decode_variant(text), text
    if text.lower().endswith(_CHECKPOINT_SUFFIXES) or os.sep in text:
        raise CheckpointError(f"{text}: no such file or directory")
    entry = get_entry(text)
    _need_closed_form(entry.family, entry.name)
    return entry.cfg, entry.name


def _dtype_name(dtype: str | torch.dtype) -> str:
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_DTYPES:
            raise ConfigError(f"dtype {dtype} is not supported; use float32, bfloat16 or float16")
        return _TORCH_DTYPES[dtype]
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype must be one of fp32, bf16, fp16, got {dtype!r}")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def model_cost(
    model_or_name_or_cfg: Any,
    img_size: int | tuple[int, int] | None = None,
    batch: int = 1,
    dtype: str | torch.dtype = "fp32",
    fused_attention: bool = True,
    **overrides: Any,
) -> CostReport | FamilyCostReport:
    """Tokens, parameters, MACs and training activation memory of a ViT, computed from its config alone
    (another family with a closed form, e.g. Swin: its FamilyCostReport).

    `img_size` (and any ViTConfig `overrides`, e.g. num_classes=10) rebuild the config as `create_model`
    would: the position table is sized for the new grid. MACs and activation bytes are for `batch` images.
    """
    cfg, name = resolve_config(model_or_name_or_cfg)
    if img_size is not None:
        overrides["img_size"] = img_size
    if overrides:
        cfg = cfg.replace(**overrides)
    if not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch must be a positive whole number, got {batch!r}")
    dt = _dtype_name(dtype)
    if not isinstance(cfg, ViTConfig):
        return family_cost(cfg, name, batch, dt)
    gh, gw = cfg.grid_size
    T = gh * gw + cfg.num_prefix_tokens
    counts = tokens_per_block(T, cfg.num_prefix_tokens, cfg.merge, cfg.depth)  # constant without merging
    params, macs = param_counts(cfg), {k: v * batch for k, v in _merged_macs(cfg, counts).items()}
    total = sum(params.values())
    nbytes = DTYPE_BYTES[dt]
    return CostReport(
        name=name, img_size=cfg.img_size, patch_size=cfg.patch_size, grid=(gh, gw), patches=gh * gw,
        prefix_tokens=cfg.num_prefix_tokens, tokens=T, layers=cfg.depth, heads=cfg.num_heads,
        width=cfg.embed_dim, mlp_hidden=int(cfg.embed_dim * cfg.mlp_ratio),
        attn_scores_per_head_layer=T * T, attn_scores_per_image=cfg.depth * cfg.num_heads * T * T,
        params=params, params_total=total, batch=batch, macs=macs, macs_total=sum(macs.values()),
        dtype=dt, fused_attention=fused_attention,
        activation_bytes=activation_elements(cfg, fused_attention) * batch * nbytes,
        weight_bytes=total * nbytes, train_state_bytes=total * 16, config=cfg.to_dict(),
        merge=cfg.merge, tokens_per_block=counts,
    )


def _merged_macs(cfg: ViTConfig, counts: list[int]) -> dict[str, int]:
    """MACs per image by part when block i's attention sees counts[i] tokens and its MLP counts[i + 1] (token
    merging; see the module docstring), from the per-token costs of the unmerged closed form."""
    macs = mac_counts(cfg)
    L, T = cfg.depth, counts[0]
    if not cfg.merge or not L:
        return macs
    Dh = cfg.embed_dim // cfg.num_heads
    proj_per_token, mlp_per_token = macs["attn_proj"] // (L * T), macs["mlp"] // (L * T)
    scores_per_pair = macs["attn_scores"] // (L * T * T)  # QK^T and AV over all heads: 2 D per token pair
    matching = sum((t + 1) // 2 * (t // 2) * Dh for t, after in zip(counts, counts[1:]) if after < t)
    merged = dict(macs, attn_proj=proj_per_token * sum(counts[:-1]), mlp=mlp_per_token * sum(counts[1:]),
                  attn_scores=scores_per_pair * sum(t * t for t in counts[:-1]) + matching)
    if cfg.global_pool == "map":  # the pooling query attends over the patch tokens left after the last block
        D, fewer = cfg.embed_dim, T - counts[-1]
        merged["head"] -= fewer * (2 * D * D + 2 * D)
    return merged


def model_summary(name: str) -> dict[str, Any]:
    """One row of `vitkit models`: family, group, size, parameters and GMACs (closed form for ViTs; other
    families are built on the meta device to count parameters, and have no GMACs)."""
    entry = get_entry(name)
    cfg = entry.cfg
    row: dict[str, Any] = {"name": name, "family": entry.family, "group": entry.group,
                           "img_size": list(cfg.img_size), "num_classes": cfg.num_classes,
                           "pretrained": sorted(entry.pretrained), "notes": entry.notes}
    if get_family(entry.family).cost is None:
        with torch.device("meta"):
            params = sum(p.numel() for p in entry.build().parameters())
        return row | {"params": params, "params_m": round(params / 1e6, 2), "gmacs": None}
    r = model_cost(name)
    if isinstance(r, FamilyCostReport):
        return row | {"params": r.params_total, "params_m": round(r.params_total / 1e6, 2),
                      "gmacs": round(r.gmacs_per_image, 2)} | ({"patch_size": cfg.patch_size}
                                                               if hasattr(cfg, "patch_size") else {})
    return row | {"params": r.params_total, "params_m": round(r.params_total / 1e6, 2),
                  "gmacs": round(r.gmacs_per_image, 2), "patch_size": cfg.patch_size, "embed_dim": cfg.embed_dim,
                  "depth": cfg.depth, "num_heads": cfg.num_heads, "tokens": r.tokens}


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{int(n)} B"


def format_count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:,.2f}{unit}"
    return f"{int(n)}"


# ---------------------------------------------------------------------------- training memory per device
@dataclass
class TrainMemory:
    """Per-device training memory, in bytes, of one strategy (see `train_memory`)."""

    strategy: str  # "ddp" or "fsdp"
    devices: int
    params: int  # the parameters each device holds (fp32 master weights)
    grads: int
    optimizer: int  # AdamW's two moments
    working: int  # FSDP: full-size parameters and gradients of the units being computed; DDP: 0
    activations: int
    total: int


def train_memory(spec: Any, devices: int, batch: int = 1, dtype: str = "bf16", img_size=None,
                 fused_attention: bool = True) -> list[TrainMemory]:
    """Per-device memory of AdamW training with DDP and with FSDP (full sharding, one unit per block, then the
    root) on `devices` devices, for a per-device `batch` with activations in `dtype`.

    Both keep fp32 master weights, fp32 gradients and AdamW's two fp32 moments: 16 bytes per parameter. DDP
    holds all of it on every device; FSDP holds 1/N of it, plus a working set: the full parameters of the
    unit being computed and of the next one (prefetched), in `dtype`, and that unit's full gradients (fp32)
    before they are reduce-scattered; the root unit (patch embedding, position table, tokens, final norm,
    head) counts as a unit. Activations do not shard: each device keeps its own batch's. Not counted: DDP's
    gradient buckets (up to one more fp32 copy of the gradients unless `gradient_as_bucket_view`), the
    allocator's fragmentation, and temporary buffers of the kernels."""
    if not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"devices must be a positive whole number, got {devices!r}")
    c = model_cost(spec, img_size=img_size, batch=batch, dtype=dtype, fused_attention=fused_attention)
    if not hasattr(c, "layers"):  # another family's report (Swin): no per-block split to shard by
        raise ConfigError(f"{getattr(c, 'name', spec)}: training memory per device is computed for ViTs only")
    P, nbytes = c.params_total, DTYPE_BYTES[c.dtype]
    D = c.width
    block = (c.params["attention"] + c.params["mlp"]) // c.layers + 4 * D  # + norm1 and norm2
    unit = max(block, P - c.layers * block)  # the largest FSDP unit: a block or the root
    out = []
    for strategy, n in (("ddp", 1), ("fsdp", devices)):
        params, grads, optim = -(-4 * P // n), -(-4 * P // n), -(-8 * P // n)  # ceil: shards are padded
        working = 0 if strategy == "ddp" or devices == 1 else 2 * unit * nbytes + unit * 4
        total = params + grads + optim + working + c.activation_bytes
        out.append(TrainMemory(strategy, devices, params, grads, optim, working, c.activation_bytes, total))
    return out
