"""The `swin` family: Swin Transformer (Liu et al. 2021), hierarchical stages of shifted-window attention.

State-dict keys and layout are timm's (`timm/models/swin_transformer.py`): the whole model runs NHWC;
`patch_embed.proj/norm`; patch merging sits at the *start* of stages 1..3 (`layers.{i}.downsample`, the
original repository puts it at the end of stage i-1); `layers.{i}.blocks.{j}.{norm1,attn.qkv,attn.proj,
attn.relative_position_bias_table,norm2,mlp.fc1,mlp.fc2}`; final `norm`; classifier `head.fc`.
`relative_position_index` and the shift mask are not in the state dict (timm: non-persistent).

Window and shift per block are fixed from `img_size` as timm does (a stage whose map is no larger than the
window uses the whole map as one window, unshifted). Other input sizes run: maps that are not a multiple of
the window are padded (timm's order: roll, then pad on the bottom/right) and the mask is built for the size.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..layers.block import DropPath
from ..layers.mlp import Linear, Mlp
from ..layers.pooling import AvgPoolClassifier
from ..layers.window_attention import (
    WindowAttention,
    resize_rel_pos_bias_table,
    shifted_window_mask,
    window_partition,
    window_reverse,
)
from .config import IMAGENET_MEAN, IMAGENET_STD, ModelConfig, Preprocess
from .features import check_output_fmt, feature_take_indices
from .registry import Pretrained, register_family, register_model


@dataclass
class SwinConfig(ModelConfig):
    _what = "Swin config"

    img_size: tuple[int, int] = (224, 224)
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 96  # stage i has embed_dim * 2**i channels
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 7
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    drop_rate: float = 0.0  # before the head
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.1  # timm's default for every swin name

    def __post_init__(self):
        if isinstance(self.img_size, int):
            self.img_size = (self.img_size, self.img_size)
        self.img_size = (int(self.img_size[0]), int(self.img_size[1]))
        self.depths = tuple(int(d) for d in self.depths)
        self.num_heads = tuple(int(h) for h in self.num_heads)
        if len(self.depths) != len(self.num_heads) or not self.depths:
            raise ConfigError(f"depths {self.depths} and num_heads {self.num_heads} need one entry per stage")
        if any(d < 1 for d in self.depths):
            raise ConfigError("every Swin stage needs depth >= 1")
        for i, h in enumerate(self.num_heads):
            dim = self.embed_dim * 2 ** i
            if h < 1 or dim % h:
                raise ConfigError(f"stage {i}: width {dim} is not divisible by {h} heads")
        if self.patch_size < 1 or self.window_size < 1:
            raise ConfigError("patch_size and window_size must be >= 1")
        if min(self.img_size) < self.patch_size:
            raise ConfigError(f"img_size {self.img_size} is smaller than one {self.patch_size}px patch")
        if self.num_classes < 0 or self.in_chans < 1:
            raise ConfigError("num_classes must be >= 0 and in_chans >= 1")

    def stage_resolutions(self) -> list[tuple[int, int]]:
        """Token grid of each stage at `img_size` (after its patch merging)."""
        res = (self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size)
        out = []
        for i in range(len(self.depths)):
            if i > 0:
                res = ((res[0] + 1) // 2, (res[1] + 1) // 2)
            out.append(res)
        return out


class PatchEmbed(nn.Module):
    """Conv patchify + LayerNorm, NHWC out (timm `PatchEmbed(output_fmt='NHWC', norm_layer=LayerNorm)`)."""

    def __init__(self, patch_size: int, in_chans: int, dim: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, dim, patch_size, patch_size)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1))  # [B, H/p, W/p, D]


class PatchMerging(nn.Module):
    """2x2 neighbours concatenated (x00, x10, x01, x11) -> LayerNorm(4C) -> Linear(4C -> 2C, no bias)."""

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = Linear(4 * dim, out_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))  # odd maps: pad one row / column
        H, W = x.shape[1], x.shape[2]
        x = x.reshape(B, H // 2, 2, W // 2, 2, C).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return self.reduction(self.norm(x))


class SwinBlock(nn.Module):
    """LN -> (shifted) window attention -> residual; LN -> MLP -> residual. NHWC in and out."""

    def __init__(self, dim: int, resolution: tuple[int, int], num_heads: int, window_size: int, shift: bool,
                 cfg: SwinConfig, drop_path: float):
        super().__init__()
        # a map no larger than the window is one window, unshifted (timm's _calc_window_shift)
        self.window_size = tuple(min(r, window_size) for r in resolution)
        self.shift_size = tuple(0 if r <= w or not shift else window_size // 2
                                for r, w in zip(resolution, self.window_size))
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, self.window_size, qkv_bias=cfg.qkv_bias,
                                    attn_drop=cfg.attn_drop_rate, proj_drop=cfg.proj_drop_rate)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * cfg.mlp_ratio), drop=cfg.proj_drop_rate)
        self.drop_path2 = DropPath(drop_path)
        self._masks: dict = {}  # (Hp, Wp, device, dtype) -> mask; not state

    def _mask(self, Hp: int, Wp: int, x: torch.Tensor) -> torch.Tensor | None:
        if not any(self.shift_size):
            return None
        key = (Hp, Wp, x.device, x.dtype)
        if key not in self._masks:
            self._masks[key] = shifted_window_mask(Hp, Wp, self.window_size, self.shift_size, x.device, x.dtype)
        return self._masks[key]

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        ws, shift = self.window_size, self.shift_size
        if any(shift):
            x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        pad_h, pad_w = (ws[0] - H % ws[0]) % ws[0], (ws[1] - W % ws[1]) % ws[1]
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
        Hp, Wp = x.shape[1], x.shape[2]
        windows = window_partition(x, ws).view(-1, ws[0] * ws[1], C)
        windows = self.attn(windows, mask=self._mask(Hp, Wp, x))
        x = window_reverse(windows.view(-1, ws[0], ws[1], C), ws, Hp, Wp)[:, :H, :W, :]
        if any(shift):
            x = torch.roll(x, shifts=shift, dims=(1, 2))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self._attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class SwinStage(nn.Module):
    def __init__(self, in_dim: int, dim: int, resolution: tuple[int, int], depth: int, num_heads: int,
                 cfg: SwinConfig, drop_path: list[float], downsample: bool):
        super().__init__()
        self.downsample = PatchMerging(in_dim, dim) if downsample else nn.Identity()
        self.blocks = nn.Sequential(*[
            SwinBlock(dim, resolution, num_heads, cfg.window_size, shift=j % 2 == 1, cfg=cfg, drop_path=drop_path[j])
            for j in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))




class SwinTransformer(nn.Module):
    head_names = ("head",)
    capabilities = frozenset({"intermediates"})
    output_fmts = ("NCHW", "NHWC")  # what forward_intermediates gives (models/features.py)

    def __init__(self, cfg: SwinConfig | None = None, *, preprocess: Preprocess | None = None,
                 class_names=None, provenance=None, **overrides):
        super().__init__()
        cfg = (cfg or SwinConfig()).replace(**overrides) if overrides else (cfg or SwinConfig())
        self.cfg = cfg
        n = len(cfg.depths)
        dims = [cfg.embed_dim * 2 ** i for i in range(n)]
        self.num_features = dims[-1]
        self.num_classes = cfg.num_classes
        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, dims[0])
        dpr = torch.linspace(0, cfg.drop_path_rate, sum(cfg.depths), device="cpu").split(list(cfg.depths))
        res = cfg.stage_resolutions()
        self.layers = nn.Sequential(*[
            SwinStage(dims[max(i - 1, 0)], dims[i], res[i], cfg.depths[i], cfg.num_heads[i], cfg,
                      dpr[i].tolist(), downsample=i > 0)
            for i in range(n)])
        self.norm = nn.LayerNorm(self.num_features)
        self.head = AvgPoolClassifier(self.num_features, cfg.num_classes, cfg.drop_rate, spatial_dims=(1, 2))
        self.apply(self._init_weights)
        pre = preprocess or Preprocess(IMAGENET_MEAN, IMAGENET_STD, "bicubic", 0.9)
        self.preprocess = dataclasses.replace(pre, input_size=(cfg.in_chans, *cfg.img_size)).for_channels(cfg.in_chans)
        self.class_names = list(class_names) if class_names else None
        self.provenance = dict(provenance or {"arch": "swin"})

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):  # timm's default ('' mode): trunc_normal .02, zero bias
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> the last stage's normed map, NHWC [B, H/32, W/32, F] (timm's layout)."""
        return self.norm(self.layers(self.patch_embed(x)))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    @property
    def feature_info(self) -> list[dict]:
        """One entry per stage (timm's): stage i has embed_dim * 2**i channels at stride patch_size * 2**i."""
        return [dict(num_chs=self.cfg.embed_dim * 2 ** i, reduction=self.cfg.patch_size * 2 ** i, module=f"layers.{i}")
                for i in range(len(self.layers))]

    def forward_intermediates(self, x: torch.Tensor, indices=None, *, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False):
        """Per-stage maps (the feature pyramid, strides 4, 8, 16, 32 for patch 4), NCHW (timm's) or NHWC (the
        layout the stages run in); see models/features.py for the contract.

        indices: an int n takes the last n stages; a list takes those stage indices (negatives allowed).
        `norm` applies the final norm to the last stage's map (the only one it is sized for). Returns (final
        NHWC features, maps) unless `intermediates_only`; after `stop_early` before the last stage the final
        features are that stage's, un-normed (timm's)."""
        check_output_fmt(output_fmt, self.output_fmts)
        n = len(self.layers)
        take, last = feature_take_indices(n, indices)
        x = self.patch_embed(x)  # [B, H/p, W/p, C]
        outs = []
        deepest = -1  # the last stage run
        for i, stage in enumerate(self.layers):
            if (stop_early or intermediates_only) and i > last:  # nothing later is returned
                break
            x = stage(x)  # [B, h, w, C_i]
            deepest = i
            if i in take:
                y = self.norm(x) if norm and i == n - 1 else x
                outs.append(y.permute(0, 3, 1, 2).contiguous() if output_fmt == "NCHW" else y)  # [B, C_i, h, w]
        if intermediates_only:
            return outs
        return (self.norm(x) if deepest == n - 1 else x), outs

    def adapt_checkpoint(self, sd: dict, source: str = "checkpoint") -> dict[str, torch.Tensor]:
        """Called by weights.load: bias tables saved for another window (or resolution) are resampled."""
        return resize_bias_tables(sd, self)

    def no_weight_decay(self) -> set[str]:
        return {n for n, _ in self.named_parameters() if "relative_position_bias_table" in n}

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's: the stem, then one group per block (per stage when coarse); the head last."""
        return {"stem": r"^patch_embed",
                "blocks": r"^layers\.(\d+)" if coarse else [
                    (r"^layers\.(\d+)\.downsample", (0,)),
                    (r"^layers\.(\d+)\.\w+\.(\d+)", None),
                    (r"^norm", (99999,)),
                ]}

    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool not in (None, "avg"):
            raise ConfigError("Swin pools by average only")
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        device = self.norm.weight.device
        self.head.fc = nn.Linear(self.num_features, num_classes, device=device) if num_classes else nn.Identity()
        if self.class_names is not None and len(self.class_names) != num_classes:
            self.class_names = None


def checkpoint_filter(state_dict: dict, model: SwinTransformer | None = None) -> dict[str, torch.Tensor]:
    """A timm or original-repository (microsoft/Swin-Transformer) state dict -> this model's keys.

    As timm's `checkpoint_filter_fn`: unwraps {'model': ...}, drops the `relative_position_index` / `attn_mask`
    buffers, and moves the original layout (patch merging at the end of stage i, `head`) to timm's
    (`layers.{i+1}.downsample`, `head.fc`). With a `model`, a bias table saved for another window is resampled
    bicubically to the model's window (the authors' method; timm uses BEiT's geometric grid here)."""
    state_dict = state_dict.get("model", state_dict)
    state_dict = state_dict.get("state_dict", state_dict)
    original = "layers.0.downsample.reduction.weight" in state_dict
    out = {}
    for k, v in state_dict.items():
        if "relative_position_index" in k or "attn_mask" in k:
            continue
        if original:
            k = re.sub(r"^layers\.(\d+)\.downsample", lambda m: f"layers.{int(m.group(1)) + 1}.downsample", k)
            k = re.sub(r"^head\.", "head.fc.", k)
        out[k] = v
    return resize_bias_tables(out, model) if model is not None else out


def resize_bias_tables(sd: dict, model: SwinTransformer) -> dict[str, torch.Tensor]:
    """Every relative position bias table whose shape differs from the model's (another window size, or a
    stage clamped to a smaller map at another resolution) resampled to the model's window."""
    out = dict(sd)
    for name, attn in model.named_modules():
        if isinstance(attn, WindowAttention):
            key = f"{name}.relative_position_bias_table"
            if key in out and out[key].shape != attn.relative_position_bias_table.shape:
                out[key] = resize_rel_pos_bias_table(out[key], attn.window_size)
    return out


def stage_windows(cfg: SwinConfig) -> list[tuple[int, int]]:
    """The window of each stage at `img_size` (a map no larger than the window is one window)."""
    return [(min(h, cfg.window_size), min(w, cfg.window_size)) for h, w in cfg.stage_resolutions()]


def swin_cost(cfg: SwinConfig) -> dict[str, dict[str, int]]:
    """The `swin` family's closed-form cost at `cfg.img_size`: {"params", "macs"} by part (as the ViT's), plus
    per stage "tokens", "windows" (per image), "attn_scores" (attention entries of all blocks and heads
    of one image, window attention on the padded map) and "global_attn_scores" (the same tokens under
    global attention: T^2 per head and block, what windows avoid).

    MACs count matmuls and convs only (as the ViT's cost): patch conv; per block qkv + proj 4 d^2 and QK^T +
    AV 2 N d per padded token (N tokens per window), MLP 2 d Hm per token; patch merging 4 d_in d_out per
    merged token; the head."""
    C, p, K = cfg.in_chans, cfg.patch_size, cfg.num_classes
    n = len(cfg.depths)
    dims = [cfg.embed_dim * 2 ** i for i in range(n)]
    params = dict.fromkeys(("patch_embed", "attention", "mlp", "norms", "patch_merging", "head"), 0)
    macs = dict.fromkeys(("patch_embed", "attn_proj", "attn_scores", "mlp", "patch_merging", "head"), 0)
    stats: dict[str, dict[str, int]] = {"tokens": {}, "windows": {}, "attn_scores": {}, "global_attn_scores": {}}
    params["patch_embed"] = C * p * p * dims[0] + dims[0] + 2 * dims[0]  # conv + bias, LayerNorm
    res, wins = cfg.stage_resolutions(), stage_windows(cfg)
    macs["patch_embed"] = res[0][0] * res[0][1] * C * p * p * dims[0]
    for i, (d, depth, heads) in enumerate(zip(dims, cfg.depths, cfg.num_heads)):
        (h, w), (wh, ww) = res[i], wins[i]
        T, N = h * w, wh * ww
        Tp = -(-h // wh) * wh * (-(-w // ww) * ww)  # tokens after padding to whole windows
        hidden = int(d * cfg.mlp_ratio)
        if i > 0:  # LayerNorm(4 d_in) + Linear(4 d_in -> d), no bias, on the merged tokens
            params["patch_merging"] += 2 * 4 * dims[i - 1] + 4 * dims[i - 1] * d
            macs["patch_merging"] += T * 4 * dims[i - 1] * d
        params["attention"] += depth * (4 * d * d + (3 * d if cfg.qkv_bias else 0) + d
                                        + (2 * wh - 1) * (2 * ww - 1) * heads)
        params["mlp"] += depth * (2 * d * hidden + hidden + d)
        params["norms"] += depth * 4 * d
        macs["attn_proj"] += depth * Tp * 4 * d * d
        macs["attn_scores"] += depth * 2 * Tp * N * d
        macs["mlp"] += depth * T * 2 * d * hidden
        stats["tokens"][f"stage{i}"] = T
        stats["windows"][f"stage{i}"] = Tp // N
        stats["attn_scores"][f"stage{i}"] = depth * heads * Tp * N
        stats["global_attn_scores"][f"stage{i}"] = depth * heads * T * T
    params["norms"] += 2 * dims[-1]
    params["head"] = dims[-1] * K + K if K else 0
    macs["head"] = dims[-1] * K
    return {"params": params, "macs": macs} | stats


register_family("swin", SwinConfig, SwinTransformer, cost=swin_cost)
_SIZES = {  # timm's configs and published weights (timm/<name>.<tag> on the hub; the first tag is timm's default)
    "swin_tiny_patch4_window7_224": (dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
                                     ("ms_in1k", "ms_in22k_ft_in1k", "ms_in22k")),
    "swin_small_patch4_window7_224": (dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
                                      ("ms_in22k_ft_in1k", "ms_in1k", "ms_in22k")),
    "swin_base_patch4_window7_224": (dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
                                     ("ms_in22k_ft_in1k", "ms_in1k", "ms_in22k")),
    "swin_base_patch4_window12_384": (dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32),
                                           img_size=384, window_size=12), ("ms_in22k_ft_in1k", "ms_in1k", "ms_in22k")),
    "swin_large_patch4_window7_224": (dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
                                      ("ms_in22k_ft_in1k", "ms_in22k")),
    "swin_large_patch4_window12_384": (dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48),
                                            img_size=384, window_size=12), ("ms_in22k_ft_in1k", "ms_in22k")),
}
for _name, (_kw, _tags) in _SIZES.items():
    _kw = {"window_size": 7, **_kw}
    register_model(_name, "swin", SwinConfig(patch_size=4, **_kw), group="swin",
                   mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=1.0 if _kw.get("img_size") == 384 else 0.9,
                   interpolation="bicubic",
                   pretrained={t: Pretrained(hub=f"timm/{_name}.{t}", license="mit") for t in _tags},
                   notes="Swin Transformer (shifted windows), timm's key names and layout")
