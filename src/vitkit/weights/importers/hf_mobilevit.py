"""MobileViT checkpoints: timm's layout (vitkit's `mobilevit` family keeps its keys) and Hugging Face transformers'
MobileViT / MobileViTV2 (`mobilevit.conv_stem.convolution`, `mobilevit.encoder.layer.{i}...`, `classifier`),
both by key signature.

transformers keeps each MobileViT block's downsampling inverted residual inside the block
(`encoder.layer.{i}.downsampling_layer`, timm's `stages.{i}.0`; the block itself is `stages.{i}.1`), names the
conv-norm pairs `convolution` / `normalization` and splits v1's attention into query / key / value, which are
packed into timm's `qkv` (rows q | k | v). The architecture is read off the shapes (`read_mobilevit_config`);
what they do not show (v1's head count, the patch side, the image size) comes from config.json, else timm's values.
"""
from __future__ import annotations

import re

import torch

from ...errors import CheckpointError, ConfigError
from ...models.config import Preprocess
from ...models.mobilevit import TRANSFORMER_STAGES, MobileViTConfig
from ..layouts import Imported, StateDict, layout
from ..notes import note_once
from .hf_transformers import _preprocess as hf_preprocess
from .timm_native import timm_hub_metadata

_STEM = "conv_stem.convolution.weight"  # transformers' stem conv, after the base model's prefix


def _is_timm_mobilevit(sd: StateDict) -> bool:
    return "stem.conv.weight" in sd and "stages.2.1.conv_1x1.weight" in sd and "stages.2.1.conv_kxk.conv.weight" in sd


def _blocks(sd: StateDict, prefix: str) -> int:
    """How many numbered children `prefix` has in the keys (`stages.1.` -> its blocks)."""
    found = {int(m.group(1)) for k in sd if (m := re.match(rf"{re.escape(prefix)}(\d+)\.", k))}
    if not found or found != set(range(max(found) + 1)):
        raise CheckpointError(f"MobileViT checkpoint: {prefix}* is not numbered 0..n-1 ({sorted(found)})")
    return max(found) + 1


def read_mobilevit_config(sd: StateDict, stated: dict | None = None, source: str = "checkpoint") -> MobileViTConfig:
    """A MobileViTConfig from timm-named weights; `stated` gives the fields the shapes do not show (num_heads,
    patch_size, img_size), timm's values otherwise. Weights that form no MobileViT are one CheckpointError line."""
    try:
        stem = sd["stem.conv.weight"]  # [stem, C, 3, 3]
        stages = _blocks(sd, "stages.")
        if stages != 2 + TRANSFORMER_STAGES:
            raise CheckpointError(f"{stages} stages, a MobileViT has {2 + TRANSFORMER_STAGES}")
        stage_chs = tuple(int(sd[f"stages.{i}.0.conv3_1x1.conv.weight"].shape[0]) for i in range(stages))
        v1 = "stages.2.1.conv_fusion.conv.weight" in sd  # v2's block has no fusion conv
        dims, depths = [], []
        for i in range(2, stages):
            if _blocks(sd, f"stages.{i}.") != 2:
                raise CheckpointError(f"stage {i} is not one inverted residual and one MobileViT block")
            dim = int(sd[f"stages.{i}.1.conv_1x1.weight"].shape[0])
            if v1 and tuple(sd[f"stages.{i}.1.transformer.0.attn.qkv.weight"].shape) != (3 * dim, dim):
                raise CheckpointError(f"stages.{i}.1.transformer.0.attn.qkv.weight is not a [3 x {dim}, {dim}] packed "
                                      "projection")
            dims.append(dim)
            depths.append(_blocks(sd, f"stages.{i}.1.transformer."))
        fc1 = sd["stages.2.1.transformer.0.mlp.fc1.weight"]  # [hidden, D] (v2: [hidden, D, 1, 1])
        head, final = sd.get("head.fc.weight"), sd.get("final_conv.conv.weight")
        cfg = MobileViTConfig(
            block="mobilevit" if v1 else "mobilevit2", in_chans=int(stem.shape[1]), stem_chs=int(stem.shape[0]),
            stage_chs=stage_chs, conv_depths=(_blocks(sd, "stages.0."), _blocks(sd, "stages.1.")),
            transformer_dims=tuple(dims), transformer_depths=tuple(depths),
            expand_ratio=sd["stages.0.0.conv1_1x1.conv.weight"].shape[0] / stem.shape[0],
            mlp_ratio=fc1.shape[0] / dims[0], num_features=int(final.shape[0]) if final is not None else 0,
            num_classes=int(head.shape[0]) if head is not None else 0)
        return cfg.replace(**(stated or {}))
    except CheckpointError as e:
        raise CheckpointError(f"{source}: not a MobileViT checkpoint: {e}") from None
    except KeyError as e:
        raise CheckpointError(f"{source}: not a MobileViT checkpoint: it has no {e.args[0]}") from None
    except (IndexError, ConfigError) as e:
        raise CheckpointError(f"{source}: cannot read a MobileViT architecture from the weights ({e})") from None


def _timm_stated(hf_config: dict | None) -> dict:
    """What a timm hub folder's config.json states beyond the shapes: the image size."""
    size = ((hf_config or {}).get("pretrained_cfg") or {}).get("input_size")  # [C, H, W]
    return {"img_size": tuple(size[1:])} if size else {}


@layout("timm-mobilevit", _is_timm_mobilevit, priority=10, family="mobilevit")
def convert_timm_mobilevit(sd: StateDict, hf_config=None) -> Imported:
    _, preprocess, class_names = timm_hub_metadata(hf_config)  # a ViT's hints do not apply
    cfg = read_mobilevit_config(sd, _timm_stated(hf_config), source="timm MobileViT checkpoint")
    return Imported(dict(sd), "timm-mobilevit", {}, [], preprocess, class_names, family="mobilevit", config=cfg)


# ---------------------------------------------------------------------------- Hugging Face transformers
def _hf_prefix(sd: StateDict) -> str | None:
    return next((k[: -len(_STEM)] for k in sd if k.endswith(_STEM)), None)


def _is_hf_mobilevit(sd: StateDict) -> bool:
    base = _hf_prefix(sd)
    return base is not None and f"{base}encoder.layer.2.conv_1x1.convolution.weight" in sd


# transformers' names -> timm's, in order, on a key without the base model's prefix
_HF_RENAMES = [
    (r"^conv_1x1_exp\.", "final_conv."),  # v1's last 1x1 conv
    (r"^conv_stem\.", "stem."),
    (r"^encoder\.layer\.([01])\.layer\.(\d+)\.", r"stages.\1.\2."),  # the inverted-residual stages
    (r"^encoder\.layer\.(\d+)\.downsampling_layer\.", r"stages.\1.0."),
    (r"^encoder\.layer\.(\d+)\.", r"stages.\1.1."),  # the MobileViT block itself
    (r"\.transformer\.layer\.(\d+)\.", r".transformer.\1."),
    (r"\.expand_1x1\.", ".conv1_1x1."), (r"\.conv_3x3\.", ".conv2_kxk."), (r"\.reduce_1x1\.", ".conv3_1x1."),
    (r"\.conv_projection\.", ".conv_proj."), (r"\.fusion\.", ".conv_fusion."),
    (r"\.layernorm_before\.", ".norm1."), (r"\.layernorm_after\.", ".norm2."), (r"\.layernorm\.", ".norm."),
    (r"\.attention\.output\.dense\.", ".attn.proj."), (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"\.output\.dense\.", ".mlp.fc2."),  # v1's MLP
    (r"\.attention\.(qkv_proj|out_proj)\.", r".attn.\1."), (r"\.ffn\.conv([12])\.", r".mlp.fc\1."),  # v2's
    (r"\.convolution\.", ".conv."), (r"\.normalization\.", ".bn."),
    # the convs timm holds bare (no norm after them): conv_1x1, v2's attention and MLP projections
    (r"\.(conv_1x1|qkv_proj|out_proj|fc1|fc2)\.conv\.", r".\1."),
    (r"^classifier\.", "head.fc."),
]
_QKV = re.compile(r"^(.*)\.attention\.attention\.(query|key|value)\.(weight|bias)$")


def _rename(name: str) -> str:
    for pattern, repl in _HF_RENAMES:
        name = re.sub(pattern, repl, name)
    return name


def _flips_channels(proc: dict | None) -> bool:
    """transformers' MobileViT image processor feeds BGR (`do_flip_channel_order`, its default)."""
    return bool(proc) and bool(proc.get("do_flip_channel_order", True))


@layout("hf-mobilevit", _is_hf_mobilevit, priority=10, family="mobilevit")
def convert_hf_mobilevit(sd: StateDict, hf_config: dict | None = None) -> Imported:
    cfg = hf_config or {}
    base = _hf_prefix(sd)
    out: StateDict = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    dropped: list[str] = []
    for k, v in sd.items():
        if not k.startswith(base) and not k.startswith("classifier."):
            dropped.append(k)  # the segmentation model's DeepLabV3 head: no place in a classifier
            continue
        name = k[len(base):] if k.startswith(base) else k
        if m := _QKV.match(name):
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = v
            continue
        out[_rename(name)] = v
    for (block, kind), parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            raise CheckpointError(f"HF MobileViT checkpoint: {block} lacks one of query/key/value {kind}")
        packed = torch.cat([parts["query"], parts["key"], parts["value"]])  # [3D, D] | [3D]: rows q | k | v
        out[f"{_rename(block + '.')}attn.qkv.{kind}"] = packed
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # transformers' two names for x * sigmoid(x)
        raise CheckpointError(f"HF MobileViT config hidden_act={act!r}: vitkit's MobileViT blocks use SiLU")
    if int(cfg.get("output_stride", 32)) != 32:  # the segmentation models dilate stages 3 and 4 instead
        note_once(f"HF MobileViT config output_stride={cfg['output_stride']}: its last stages were dilated; vitkit's "
                  "MobileViT runs them strided, at output stride 32")
    stated: dict = {}
    if "num_attention_heads" in cfg:
        stated["num_heads"] = int(cfg["num_attention_heads"])
    if "patch_size" in cfg:
        stated["patch_size"] = int(cfg["patch_size"])
    if "image_size" in cfg:
        side = cfg["image_size"]
        stated["img_size"] = tuple(side) if isinstance(side, (list, tuple)) else (side, side)
    v2 = "stages.2.1.conv_fusion.conv.weight" not in out
    source = "HF MobileViTV2 checkpoint" if v2 else "HF MobileViT checkpoint"
    config = read_mobilevit_config(out, stated, source=source)
    proc = cfg.get("_preprocessor_config")
    preprocess = None
    if proc:  # the processor's resize and crop; it rescales to [0, 1] and normalises only if it says so
        pre = hf_preprocess("mobilevit", proc)
        preprocess = pre if proc.get("do_normalize") else Preprocess((0.0,) * 3, (1.0,) * 3, pre.interpolation,
                                                                     pre.crop_pct)
    if _flips_channels(proc) and config.in_chans == 3:
        # the processor hands the model BGR; vitkit feeds RGB, so the stem's input channels are flipped instead
        out["stem.conv.weight"] = out["stem.conv.weight"].flip(1)
    labels = cfg.get("id2label") or {}
    names = [labels[str(j)] if str(j) in labels else labels.get(j) for j in range(len(labels))]
    if not (names and config.num_classes == len(names) and not all(n == f"LABEL_{j}" for j, n in enumerate(names))):
        names = None  # no head, another head, or transformers' placeholder names
    return Imported(out, "hf-mobilevitv2" if v2 else "hf-mobilevit", {}, dropped, preprocess, names,
                    family="mobilevit", config=config)
