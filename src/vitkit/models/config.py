"""The typed architecture config. Everything needed to rebuild a model travels in this one dataclass."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..typed_config import JsonConfig

POOLS = ("token", "avg", "max", "map")  # map: attention pooling with a learned query (SigLIP)
# sincos: fixed 2D table, column (w) encoding first as MAE and big_vision; sincos_hw: vitkit's first
# checkpoints (format 1), which put the row first; both are regenerated for a new grid, never stretched
POS_EMBEDS = ("learn", "sincos", "sincos_hw", "none")
ACTS = ("gelu", "gelu_tanh", "quick_gelu")
INITS = ("jax", "timm", "moco", "zero_head")


class ModelConfig(JsonConfig):
    """What every family's config has: `img_size`, `in_chans`, `num_classes` fields and a validated `replace`."""

    def replace(self, **overrides: Any):
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if "merge" in unknown:  # the option exists, on the models that have tokens to merge
            raise ConfigError(f"merge={overrides['merge']!r}: token merging (ToMe) needs a ViT's patch tokens; a "
                              f"{self._what} has no merge option (valid: merge=0 to half the patches, on a ViT)")
        if unknown:
            raise ConfigError(f"unknown model option(s) {unknown} for a {self._what}; valid options: "
                              f"{', '.join(sorted(known))}")
        return dataclasses.replace(self, **overrides)  # __post_init__ validates the result


@dataclass
class ViTConfig(ModelConfig):
    _what = "ViT config"

    img_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    k_bias: bool = True  # False: EVA-style q and v biases only (timm's attn.q_bias / attn.v_bias)
    qk_norm: bool = False
    init_values: float | None = None  # LayerScale init; None = no LayerScale
    class_token: bool = True
    distilled: bool = False  # DeiT distillation token + second head
    num_reg_tokens: int = 0  # "registers" (Darcet et al.)
    pos_embed: str = "learn"  # learn | sincos (fixed 2D) | sincos_hw (legacy order) | none
    # Position-embedding layout: do the prefix tokens (class, distillation, registers) get a row of the
    # position table? True: concatenate prefix tokens, then add positions (ViT, DeiT, timm default).
    # False: add positions to patches only, then concatenate (DeiT III, big_vision, DINOv2 with registers).
    prefix_pos: bool = True
    # rotary position embeddings in attention (layers/rope.py), alone (pos_embed="none") or with a table:
    # none | axial (timm RotaryEmbeddingCat: RoPE-ViT, EVA, PE) | dinov3 (timm RotaryEmbeddingDinoV3)
    rope: str = "none"
    rope_temperature: float = 10000.0
    rope_grid_offset: float = 0.0
    rope_xy: bool = False  # column frequencies first (timm's rope_grid_indexing='xy')
    rope_ref_grid: tuple[int, int] | None = None  # axial: positions rescaled onto this grid (timm's ref_feat_shape)
    rope_rotate_half: bool = False  # pairs channel i with i + head_dim/2 instead of adjacent channels
    # relative position bias from an MLP over log offsets (layers/rel_pos.py; timm's vit_relpos_*): none | mlp (one
    # per block) | mlp_shared (one for all blocks), with `rel_pos_dim` hidden units
    rel_pos: str = "none"
    rel_pos_dim: int = 128
    post_norm: bool = False  # blocks normalise each branch's output (timm's ResPostBlock) instead of its input
    global_pool: str = "token"  # token | avg | max | map
    pool_include_prefix: bool = False  # avg/max/map pooling also over the prefix tokens (timm's EVA models' MAP)
    pool_num_heads: int | None = None  # MAP head's heads and MLP ratio when not the blocks' (Perception Encoder)
    pool_mlp_ratio: float | None = None
    fc_norm: bool | None = None  # norm after pooling instead of before; None = True for avg/max pooling
    final_norm: bool = True
    pre_norm: bool = False  # LayerNorm before the blocks (CLIP's ln_pre)
    patch_bias: bool = True  # CLIP's patch conv has no bias
    act: str = "gelu"
    # layers by name (layers.EMBED_LAYERS / MLP_LAYERS): the hybrid CNN stem is another embed layer
    embed_layer: str = "patch"
    mlp_layer: str = "mlp"  # mlp (fc1-act-fc2) | swiglu | swiglu_packed | mlp_dwconv (fc1-3x3 depthwise conv-act-fc2)
    mask_token: bool = False  # a learned token that replaces masked patches (DINOv2 / iBOT)
    norm_eps: float = 1e-6
    representation_size: int | None = None  # pre-logits Linear+tanh (original i21k checkpoints)
    drop_rate: float = 0.0  # before the head
    pos_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    weight_init: str = "timm"
    # how the stored position table is resized to a new grid (load time and run time)
    pos_interpolation: str = "bicubic"
    pos_antialias: bool = True
    # token merging (ToMe, layers/tome.py): each block merges this many tokens after its attention (0: none;
    # a run-time setting on any checkpoint, not an architecture: no weight depends on it)
    merge: int = 0

    def __post_init__(self):
        if isinstance(self.img_size, int):
            self.img_size = (self.img_size, self.img_size)
        self.img_size = (int(self.img_size[0]), int(self.img_size[1]))
        if self.rope_ref_grid is not None:
            self.rope_ref_grid = (int(self.rope_ref_grid[0]), int(self.rope_ref_grid[1]))
        self.validate()

    def validate(self) -> None:
        def need(cond: bool, msg: str):
            if not cond:
                raise ConfigError(msg)

        from ..layers import EMBED_LAYERS, MLP_LAYERS, ROPES
        from ..layers.mlp import mlp_needs_grid

        need(self.embed_layer in EMBED_LAYERS, f"embed_layer must be one of {sorted(EMBED_LAYERS)}, got {self.embed_layer!r}")
        need(self.mlp_layer in MLP_LAYERS, f"mlp_layer must be one of {sorted(MLP_LAYERS)}, got {self.mlp_layer!r}")
        need(self.global_pool in POOLS, f"global_pool must be one of {POOLS}, got {self.global_pool!r}")
        need(self.pos_embed in POS_EMBEDS, f"pos_embed must be one of {POS_EMBEDS}, got {self.pos_embed!r}")
        need(self.act in ACTS, f"act must be one of {ACTS}, got {self.act!r}")
        need(self.rope in ROPES, f"rope must be one of {ROPES}, got {self.rope!r}")
        need(self.rel_pos in ("none", "mlp", "mlp_shared"), f"rel_pos must be none, mlp or mlp_shared, got {self.rel_pos!r}")
        need(self.rope == "none" or (self.embed_dim // self.num_heads) % 4 == 0,
             f"rotary position embeddings need a head width divisible by 4, got {self.embed_dim // self.num_heads}")
        need(self.weight_init in INITS, f"weight_init must be one of {INITS}, got {self.weight_init!r}")
        need(self.pos_interpolation in ("bicubic", "bilinear", "nearest"), "pos_interpolation: bicubic|bilinear|nearest")
        need(self.patch_size > 0, f"patch_size must be positive, got {self.patch_size}")
        need(self.in_chans > 0, f"in_chans must be positive, got {self.in_chans}")
        need(self.num_classes >= 0, f"num_classes must be >= 0, got {self.num_classes}")
        need(self.depth >= 0 and self.embed_dim > 0 and self.num_heads > 0, "depth, embed_dim, num_heads must be positive")
        need(self.embed_dim % self.num_heads == 0, f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        pool_heads = self.pool_num_heads or self.num_heads
        need(self.global_pool != "map" or self.embed_dim % pool_heads == 0,
             f"embed_dim {self.embed_dim} is not divisible by the attention pool's {pool_heads} heads")
        for side in self.img_size:
            need(side > 0 and side % self.patch_size == 0,
                 f"img_size {self.img_size[0]}x{self.img_size[1]} is not divisible by patch size {self.patch_size}; "
                 "patch sizes that divide it: " + ", ".join(str(d) for d in range(1, min(self.img_size) + 1)
                                                            if not self.img_size[0] % d and not self.img_size[1] % d))
        need(not (self.global_pool == "token" and not self.class_token),
             "global_pool='token' needs a class token; use global_pool='avg' or class_token=True")
        need(not (self.distilled and not self.class_token), "a distilled model needs a class token")
        need(not (self.is_sincos and self.embed_dim % 4), "sincos position embedding needs embed_dim % 4 == 0")
        if self.merge != 0:
            from ..layers.tome import check_merge

            check_merge(self.merge, self.grid_size[0] * self.grid_size[1])
            # merged tokens have no single position: rotary and relative-position terms need one per token
            need(not mlp_needs_grid(MLP_LAYERS[self.mlp_layer]), f"merge={self.merge}: token merging "
                 f"leaves no patch grid for mlp_layer={self.mlp_layer!r} to convolve (valid: merge=0, or another "
                 "mlp_layer)")
            need(self.rope == "none" and self.rel_pos == "none",
                 f"merge={self.merge}: token merging needs positions added once (a position table); a model with "
                 "rotary or relative position terms cannot merge tokens (valid: merge=0)")

    @property
    def is_sincos(self) -> bool:
        return self.pos_embed in ("sincos", "sincos_hw")

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + int(self.distilled) + self.num_reg_tokens

    @property
    def use_fc_norm(self) -> bool:
        return self.global_pool in ("avg", "max") if self.fc_norm is None else self.fc_norm

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size


@dataclass
class Preprocess(JsonConfig):
    """How inputs must be prepared for a set of weights (torchvision weight-enum style)."""

    _strict = False  # extra keys written by other tools are ignored

    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    interpolation: str = "bicubic"
    crop_pct: float = 0.9
    input_size: tuple[int, int, int] = (3, 224, 224)
    # native aspect ratio (NaFlex, layers/naflex.py): each image resized, aspect kept, to the largest grid of
    # `token_patch`-pixel patches with at most `max_tokens`, instead of a crop at input_size; 0: off
    max_tokens: int = 0
    token_patch: int = 0

    def for_channels(self, c: int) -> Preprocess:
        """The same preprocessing for a `c`-channel input: mean/std averaged when the count changes
        (3-channel statistics for a gray model, or the reverse)."""
        mean, std = self.mean, self.std
        if len(mean) != c:
            mean, std = (sum(mean) / len(mean),) * c, (sum(std) / len(std),) * c
        return dataclasses.replace(self, mean=tuple(mean), std=tuple(std), input_size=(c, *self.input_size[1:]))


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
INCEPTION_MEAN, INCEPTION_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def default_preprocess(cfg, mean=IMAGENET_MEAN, std=IMAGENET_STD, **kw) -> Preprocess:
    """ImageNet statistics (or the given ones) at the config's input size and channel count."""
    pre = Preprocess(mean=tuple(mean), std=tuple(std), input_size=(cfg.in_chans, *cfg.img_size), **kw)
    return pre.for_channels(cfg.in_chans)

