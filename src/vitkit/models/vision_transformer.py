"""The one VisionTransformer (Dosovitskiy et al. 2021) with the variants the field uses.

Key names follow timm's (`cls_token`, `pos_embed`, `patch_embed.proj`, `blocks.{i}.attn.qkv`, `norm`,
`fc_norm`, `head`, ...) so that importing any checkpoint is a small state-dict filter.
Token layout: [class] [distillation] [registers...] [patches in row-major order].
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import CheckpointError, ConfigError
from ..layers import (
    EMBED_LAYERS,
    MLP_LAYERS,
    AttentionPoolLatent,
    Block,
    RelPosMlp,
    Rope2d,
    layer_name,
    resample_pos_embed,
    sincos_2d_pos_embed,
)
from ..layers.mlp import mlp_needs_grid
from ..layers.naflex import PatchBatch, key_padding_mask
from ..layers.patch_embed import adapt_in_chans, kept_original, resample_patch_kernel, to_2tuple
from ..layers.tome import merge_schedule
from .config import ViTConfig, default_preprocess
from .features import check_output_fmt, feature_take_indices

log = logging.getLogger("vitkit")


class VisionTransformer(nn.Module):
    """The `vit` family. Layers can be handed in by name or class (`embed_layer`, `mlp_layer`, as timm and
    DINOv2 do); the config stores the names, so a checkpoint rebuilds the same model."""

    head_names = ("head", "head_dist")  # classifier modules (re-initialised for new classes, own LR)
    capabilities = frozenset({"attention_maps", "pos_resample", "patch_resample", "intermediates", "token_seam",
                              "native_aspect"})
    output_fmts = ("NCHW", "NLC")  # what forward_intermediates gives (models/features.py)

    def __init__(self, cfg: ViTConfig | None = None, *, embed_layer=None, mlp_layer=None, preprocess=None,
                 class_names=None, provenance=None, **kwargs):
        super().__init__()
        cfg = cfg or ViTConfig()
        if embed_layer is not None:
            kwargs["embed_layer"] = layer_name("embed", embed_layer)
        if mlp_layer is not None:
            kwargs["mlp_layer"] = layer_name("mlp", mlp_layer)
        cfg = cfg.replace(**kwargs) if kwargs else cfg
        self.cfg = cfg
        D = cfg.embed_dim
        self.num_classes = cfg.num_classes
        self.num_features = self.embed_dim = D
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.grad_checkpointing = False
        self.distilled_training = False  # DeiT: return (cls_logits, dist_logits) in train mode
        # what a checkpoint carries besides weights (torchvision's weight metadata)
        self.preprocess = preprocess or default_preprocess(cfg)
        self.class_names = list(class_names) if class_names else None
        self.provenance = dict(provenance or {})

        self.patch_embed = EMBED_LAYERS[cfg.embed_layer](cfg.img_size, cfg.patch_size, cfg.in_chans, D,
                                                         bias=cfg.patch_bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.num_reg_tokens, D)) if cfg.num_reg_tokens else None
        self.mask_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.mask_token else None
        n_pos = self.patch_embed.num_patches + self._pos_prefix
        if cfg.pos_embed == "none":
            self.pos_embed = None
        else:
            self.pos_embed = nn.Parameter(torch.zeros(1, n_pos, D), requires_grad=cfg.pos_embed == "learn")
        # the learned table other grids are resampled from (as loaded or trained, never a resampled one; not saved)
        self.register_buffer("original_pos", None, persistent=False)
        self._original_pos_grid, self._original_pos_how = None, None
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)
        self.norm_pre = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.pre_norm else nn.Identity()
        self.rope = None if cfg.rope == "none" else Rope2d(
            D // cfg.num_heads, cfg.rope, cfg.rope_temperature, cfg.rope_grid_offset, cfg.rope_xy, cfg.rope_ref_grid,
            cfg.rope_rotate_half, cfg.depth, cfg.num_heads)

        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]  # deeper blocks drop more
        mlp_cls = MLP_LAYERS[cfg.mlp_layer]
        self.shared_rel_pos = RelPosMlp(cfg.num_heads, cfg.rel_pos_dim) if cfg.rel_pos == "mlp_shared" else None
        self.blocks = nn.Sequential(*[
            Block(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, cfg.qk_norm, cfg.init_values, cfg.act,
                  cfg.proj_drop_rate, cfg.attn_drop_rate, dpr[i], cfg.norm_eps, mlp_layer=mlp_cls, k_bias=cfg.k_bias,
                  rope_half=cfg.rope_rotate_half, post_norm=cfg.post_norm,
                  rel_pos_dim=cfg.rel_pos_dim if cfg.rel_pos == "mlp" else None)
            for i in range(cfg.depth)
        ])
        use_fc_norm = cfg.use_fc_norm
        self.norm = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.final_norm and not use_fc_norm else nn.Identity()
        self.attn_pool = (AttentionPoolLatent(D, cfg.pool_num_heads or cfg.num_heads, cfg.pool_mlp_ratio or cfg.mlp_ratio,
                                              cfg.act, cfg.norm_eps, cfg.qkv_bias)
                          if cfg.global_pool == "map" else None)
        self.fc_norm = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.final_norm and use_fc_norm else nn.Identity()
        if cfg.representation_size:
            self.pre_logits = nn.Sequential()
            self.pre_logits.add_module("fc", nn.Linear(D, cfg.representation_size))
            self.pre_logits.add_module("act", nn.Tanh())
            self.num_features = cfg.representation_size
        else:
            self.pre_logits = nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.head_dist = None
        if cfg.distilled:
            self.head_dist = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.init_weights(cfg.weight_init)

    # ------------------------------------------------------------------ init
    def init_weights(self, scheme: str = "timm") -> None:
        """Named init schemes: `timm` (trunc-normal .02), `jax` (xavier/lecun, zero head),
        `moco` (xavier with qkv split), `zero_head` (timm + zero head; good for fine-tuning)."""
        if self.pos_embed is not None:
            if self.cfg.is_sincos:
                with torch.no_grad():
                    self.pos_embed.zero_()  # prefix rows (prefix_pos) stay zero
                    self.pos_embed[:, self._pos_prefix:] = self._sincos_table(self.patch_embed.grid_size)
            else:
                nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for tok in (self.cls_token, self.dist_token, self.reg_token, self.mask_token):
            if tok is not None:
                nn.init.normal_(tok, std=1e-6 if scheme == "jax" else 0.02)
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                if scheme == "jax":
                    if name.startswith("head"):
                        nn.init.zeros_(m.weight)
                    elif name.startswith("pre_logits"):
                        nn.init.trunc_normal_(m.weight, std=math.sqrt(1.0 / m.in_features))
                    else:
                        nn.init.xavier_uniform_(m.weight)
                        if m.bias is not None and "mlp" in name:
                            nn.init.normal_(m.bias, std=1e-6)
                            continue
                elif scheme == "moco" and name.endswith("qkv"):
                    bound = math.sqrt(6.0 / (m.weight.shape[0] // 3 + m.weight.shape[1]))
                    nn.init.uniform_(m.weight, -bound, bound)
                elif scheme == "moco":
                    nn.init.xavier_uniform_(m.weight)
                else:
                    nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Conv2d) and scheme in ("jax", "moco"):
                fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
                nn.init.trunc_normal_(m.weight, std=math.sqrt(1.0 / fan_in))  # lecun normal
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if scheme == "zero_head":
            for head in (self.head, self.head_dist):
                if isinstance(head, nn.Linear):
                    nn.init.zeros_(head.weight)
                    nn.init.zeros_(head.bias)

    # ------------------------------------------------------------------ contract
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameters that should not be weight-decayed (besides norms and biases)."""
        return {"pos_embed", "cls_token", "dist_token", "reg_token", "mask_token", "attn_pool.latent", "rope.freqs"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """timm-style grouping: the stem (embeddings) and one group per block (the final norm joins the last
        block, `(99999,)`); unmatched names (pooling, heads) form the last group. Drives layer-wise LR decay."""
        return {
            "stem": r"^cls_token|^pos_embed|^patch_embed|^reg_token|^dist_token|^mask_token|^norm_pre|^rope"
                    r"|^shared_rel_pos",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def set_distilled_training(self, enable: bool = True) -> None:
        self.distilled_training = enable

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New (freshly initialised) head(s) for `num_classes`; 0 gives pooled features."""
        if global_pool is not None:
            if global_pool == "token" and self.cls_token is None:
                raise ConfigError("this model has no class token; use global_pool='avg' or 'max'")
            if global_pool not in ("token", "avg", "max") and global_pool != self.cfg.global_pool:
                raise ConfigError(f"cannot switch pooling to {global_pool!r}; choose token, avg or max")
            self.cfg = self.cfg.replace(global_pool=global_pool)
            if global_pool != "map":
                self.attn_pool = None
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        device = self.patch_embed.proj.weight.device

        def new_head():
            if not num_classes:
                return nn.Identity()
            head = nn.Linear(self.num_features, num_classes, device=device)
            nn.init.trunc_normal_(head.weight, std=0.02)
            nn.init.zeros_(head.bias)
            return head

        self.head = new_head()
        if self.head_dist is not None:
            self.head_dist = new_head()
        if self.class_names is not None and len(self.class_names) != num_classes:
            self.class_names = None

    def timm_twin_kwargs(self) -> dict:
        """The keyword arguments of timm's plain `VisionTransformer` that build this architecture under the same
        key names (vitkit.peers builds the twin from them, for any model that has this method); ConfigError
        when the config uses a piece that class cannot express. Reads the config only (meta models will do)."""
        c = self.cfg
        arch = self.provenance.get("arch", "model")
        if c.embed_layer != "patch":
            raise ConfigError(f"{arch}: its {c.embed_layer!r} embedding (a CNN stem) has no twin in timm's plain "
                              "VisionTransformer; bench compares plain ViTs with timm only")
        if (c.mlp_layer != "mlp" or c.global_pool == "map" or c.qk_norm or c.act != "gelu" or c.pos_embed == "none"
                or c.representation_size or c.distilled):
            raise ConfigError(f"{arch}: bench compares plain ViTs with timm only")
        return dict(img_size=c.img_size, patch_size=c.patch_size, in_chans=c.in_chans, num_classes=c.num_classes,
                    embed_dim=c.embed_dim, depth=c.depth, num_heads=c.num_heads, mlp_ratio=c.mlp_ratio,
                    qkv_bias=c.qkv_bias, init_values=c.init_values, class_token=c.class_token,
                    global_pool=c.global_pool, fc_norm=c.fc_norm, no_embed_class=not c.prefix_pos,
                    reg_tokens=c.num_reg_tokens, pre_norm=c.pre_norm, final_norm=c.final_norm)

    def set_merge(self, r: int) -> None:
        """Token merging (ToMe, layers/tome.py) from now on: `r` tokens merged per block (0: the plain model);
        the config checks `r` against the patch count."""
        self.cfg = self.cfg.replace(merge=int(r))

    def set_max_tokens(self, n: int) -> None:
        """Inputs at their own aspect ratio from now on (NaFlex): the preprocessing resizes each image, keeping its
        aspect ratio, to the largest grid of patches with at most `n` (layers/naflex.py) and batches images of
        different grids padded (a PatchBatch, which `forward` masks); 0: square inputs at the input size again.
        The weights are untouched; the position table is resampled per grid as at any other resolution."""
        n = int(n)
        if n < 0:
            raise ConfigError(f"max tokens must be at least 1 (one {self.cfg.patch_size}x{self.cfg.patch_size} patch), "
                              f"got {n}")
        if n:
            self._check_native_aspect()
        self.preprocess = dataclasses.replace(self.preprocess, max_tokens=n, token_patch=self.cfg.patch_size if n else 0)

    def _check_native_aspect(self) -> None:
        """One line for a model a padded batch of different grids cannot run through."""
        arch = self.provenance.get("arch", "this model")
        why = ("its rotary positions" if self.rope is not None else
               "its relative position biases" if self.cfg.rel_pos != "none" else
               f"token merging (merge={self.cfg.merge})" if self.cfg.merge else
               f"its {self.cfg.embed_layer!r} embedding (a CNN stem)" if not hasattr(self.patch_embed, "set_patch_size")
               else None)
        if why:
            raise ConfigError(f"{arch}: native aspect ratio under a token budget (--max-tokens) is not supported with "
                              f"{why}; use square inputs (no --max-tokens)")

    def set_input_size(self, img_size=None, patch_size: int | None = None, interpolation: str | None = None,
                       antialias: bool | None = None) -> None:
        """Change the native resolution and/or the patch size. A new patch size resamples the patch kernel
        (FlexiViT's pseudo-inverse resize, layers.patch_embed); a learned position table is resampled to the new
        grid (prefix rows untouched), a sin-cos one regenerated: the same rule as a forward at another size.
        Both start from the model's original kernel and table (as loaded or trained), never from a resampled
        one, so 16 -> 8 -> 16 gives the original model back exactly."""
        if img_size is None and patch_size is None:
            return
        img_size = self.cfg.img_size if img_size is None else to_2tuple(img_size)
        changes = {"img_size": img_size}
        if patch_size is not None and patch_size != self.cfg.patch_size:
            if not hasattr(self.patch_embed, "set_patch_size"):
                raise self._fixed_patch_error(f"({self.cfg.patch_size} px: the backbone's stride sets it)")
            changes["patch_size"] = int(patch_size)
        cfg = self.cfg.replace(**changes)  # refuses a patch size the image does not divide, naming the valid ones
        new_grid = cfg.grid_size if "patch_size" in changes else self.patch_embed.grid_for(*img_size)
        with torch.no_grad():  # from the current grid: before the embedding changes
            table = None if self.pos_embed is None else self._pos_table_from_original(new_grid, interpolation,
                                                                                       antialias)
        if "patch_size" in changes:
            self.patch_embed.set_patch_size(cfg.patch_size, img_size)
            self._note_patch_origin(self.patch_embed.original_kernel)
        else:
            self.patch_embed.set_img_size(img_size)
        self.cfg = cfg
        self.preprocess = dataclasses.replace(self.preprocess, input_size=(self.cfg.in_chans, *img_size))
        if self.preprocess.max_tokens:  # the token budget counts patches of the new size
            self.preprocess = dataclasses.replace(self.preprocess, token_patch=self.cfg.patch_size)
        if table is not None:
            self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)

    def _pos_table_from_original(self, grid: tuple[int, int], interpolation: str | None,
                                 antialias: bool | None) -> torch.Tensor:
        """The table for `grid`, resampled from the original table (`kept_original`), which is remembered."""
        how = (interpolation or self.cfg.pos_interpolation, self.cfg.pos_antialias if antialias is None else antialias)
        if self.cfg.is_sincos:
            return self._pos_table(grid, *how)
        original, original_grid = self.original_pos, self._original_pos_grid
        if original is not None and self._original_pos_how != how:
            original = None  # made another way: the current table is the one to start from

        def derive(table):  # the original made into the current grid's table
            return resample_pos_embed(table, self.patch_embed.grid_size, original_grid, self._pos_prefix, *how)

        kept = kept_original(self.pos_embed, original, derive)
        if kept is not original:
            original_grid = self.patch_embed.grid_size
        self.keep_original_pos(kept, original_grid, how)
        return resample_pos_embed(kept, grid, original_grid, self._pos_prefix, *how)

    def keep_original_pos(self, table: torch.Tensor, grid: tuple[int, int], how: tuple[str, bool]) -> None:
        """Remember the table other grids are resampled from: its grid and how it is resampled."""
        self.original_pos = table.detach().to(self.pos_embed)
        self._original_pos_grid, self._original_pos_how = tuple(grid), tuple(how)

    def adapt_checkpoint(self, sd: dict[str, torch.Tensor], source: str = "checkpoint") -> dict[str, torch.Tensor]:
        """A state dict in this family's names -> one that fits this model's grid and channels: a learned
        position table is resampled to the model's grid, a sin-cos one regenerated; 1- or 3-channel patch
        filters are adapted to `in_chans`. Called by every load path before the strict key check."""
        sd = dict(sd)
        own = self.pos_embed
        src = sd.get("pos_embed")
        if src is not None and own is not None and src.shape != own.shape:
            if src.shape[-1] != own.shape[-1]:
                raise CheckpointError(
                    f"{source}: shape mismatch for pos_embed: checkpoint {tuple(src.shape)} vs model "
                    f"{tuple(own.shape)} (a different model width: check --model)")
            grid_rows = src.shape[1] - self._pos_prefix
            side = math.isqrt(max(grid_rows, 0))
            if side * side != grid_rows:
                raise CheckpointError(
                    f"{source}: pos_embed {tuple(src.shape)} cannot be resampled to {tuple(own.shape)}: "
                    f"{grid_rows} grid rows do not form a square grid "
                    "(does the checkpoint's prefix-token layout match the model's `prefix_pos`?)")
            if self.cfg.is_sincos:
                grid = self._sincos_table(self.patch_embed.grid_size).to(src.dtype)
                sd["pos_embed"] = torch.cat([src[:, : self._pos_prefix], grid], dim=1)
                how = "regenerated (sin-cos)"
            else:
                src = src.to(own)
                how = (self.cfg.pos_interpolation, self.cfg.pos_antialias)
                sd["pos_embed"] = resample_pos_embed(src, self.patch_embed.grid_size, (side, side), self._pos_prefix,
                                                     *how)
                self.keep_original_pos(src, (side, side), how)  # a later set_input_size starts from the file's
                how = "resampled"
            # said by default, as a re-initialised head is: the model now runs at another resolution
            log.warning("%s: position embeddings %s %dx%d -> %dx%d for %dx%d px", source, how, side, side,
                        *self.patch_embed.grid_size, *self.cfg.img_size)
        w = sd.get("patch_embed.proj.weight")
        own_w = self.patch_embed.proj.weight
        if (w is not None and w.ndim == 4 and w.shape[1] != own_w.shape[1] and w.shape[0] == own_w.shape[0]
                and w.shape[2:] == own_w.shape[2:]):
            log.info("%s: adapted %d-channel patch embedding to %d channels", source, w.shape[1], own_w.shape[1])
            sd["patch_embed.proj.weight"] = w = adapt_in_chans(w, own_w.shape[1])
        if w is not None and w.ndim == 4 and w.shape[:2] == own_w.shape[:2] and w.shape[2:] != own_w.shape[2:]:
            if not hasattr(self.patch_embed, "keep_original_kernel"):
                raise self._fixed_patch_error(f"(the checkpoint's is {w.shape[2]}x{w.shape[3]} on the stem's map: "
                                              "load it at its own patch size)", source)
            # another patch size (create/load with patch_size=P): FlexiViT's resample of the file's kernel
            w = w.to(own_w)
            sd["patch_embed.proj.weight"] = resample_patch_kernel(w, own_w.shape[2:])
            self.patch_embed.keep_original_kernel(w)
            self._note_patch_origin(w)
            log.warning("%s: patch kernel resampled %dx%d -> %dx%d (pseudo-inverse resize)", source, *w.shape[2:],
                        *own_w.shape[2:])
        if hasattr(self.patch_embed, "adapt_state_dict"):  # a hybrid's CNN stem: its first conv's channels
            sd = self.patch_embed.adapt_state_dict(sd, "patch_embed.")
        return sd

    def _note_patch_origin(self, original: torch.Tensor) -> None:
        """Provenance says which patch size the kernel was resampled from (none when it is the original's)."""
        size = tuple(original.shape[-2:])
        if size == tuple(self.patch_embed.proj.weight.shape[-2:]):
            self.provenance.pop("patch_resampled_from", None)
        else:
            self.provenance["patch_resampled_from"] = size[0] if size[0] == size[1] else list(size)

    def _fixed_patch_error(self, why: str, source: str | None = None) -> ConfigError:
        where = f"{source}: " if source else ""
        return ConfigError(f"{where}a model with the {self.cfg.embed_layer!r} embedding (a CNN stem) cannot change "
                           f"its patch size {why}")

    @property
    def _pos_prefix(self) -> int:
        """How many rows of the position table belong to prefix tokens (none without a table)."""
        return self.num_prefix_tokens if self.cfg.prefix_pos and self.cfg.pos_embed != "none" else 0

    def _sincos_table(self, grid: tuple[int, int]) -> torch.Tensor:
        """[1, Gh*Gw, D] fixed table for a grid (sincos: column first as MAE; sincos_hw: vitkit's old order)."""
        return sincos_2d_pos_embed(self.embed_dim, grid, w_first=self.cfg.pos_embed == "sincos")[None]

    def _pos_table(self, grid: tuple[int, int], interpolation: str | None = None,
                   antialias: bool | None = None) -> torch.Tensor:
        """The position table [1, P + Gh*Gw, D] for a grid: stored at the native grid; otherwise a sin-cos
        table is regenerated and a learned one resampled (bicubic + antialias by default)."""
        pos = self.pos_embed
        if tuple(grid) == self.patch_embed.grid_size:
            return pos
        if self.cfg.is_sincos:
            table = self._sincos_table(grid).to(device=pos.device, dtype=pos.dtype)
            return torch.cat([pos[:, : self._pos_prefix], table], dim=1)
        return resample_pos_embed(pos, grid, self.patch_embed.grid_size, self._pos_prefix,
                                  interpolation or self.cfg.pos_interpolation,
                                  self.cfg.pos_antialias if antialias is None else antialias)

    # ------------------------------------------------------------------ the token seam
    def add_pos(self, x: torch.Tensor, grid: tuple[int, int], pos: torch.Tensor | None = None) -> torch.Tensor:
        """Patch tokens [B, N, D] (row-major over `grid`) + their rows of the position table."""
        if pos is None:
            if self.pos_embed is None:
                return x
            pos = self._pos_table(grid)
        return x + pos[:, self._pos_prefix:]

    def add_prefix(self, x: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """[B, N, D] -> [B, P + N, D]: class, distillation and register tokens in front (with their position
        rows when `prefix_pos`)."""
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if not prefix:
            return x
        prefix = torch.cat(prefix, dim=1)  # [B, P, D]
        if self._pos_prefix:
            table = self.pos_embed if pos is None else pos
            prefix = prefix + table[:, : self._pos_prefix]
        return torch.cat([prefix, x], dim=1)

    def prepare_tokens(self, x: torch.Tensor, *, keep: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                       pos: torch.Tensor | None = None) -> torch.Tensor:
        """Image [B, C, H, W] -> input tokens of the first block [B, P + N', D].

        mask: [B, N] bool, True where a patch is replaced by the mask token before positions are added
            (DINOv2 / iBOT); needs `mask_token=True`.
        keep: [B, K] indices of the patches to keep after positions are added (MAE's visible subset);
            the tokens then are [B, P + K, D] in the order of `keep`.
        pos: a position table already sized for this input's grid [1, P? + N, D] (the ONNX export
            resamples it in-graph).
        """
        grid = self.patch_embed(x)  # [B, Gh, Gw, D]
        B, gh, gw, D = grid.shape
        x = grid.reshape(B, gh * gw, D)  # [B, N, D]
        if mask is not None:
            if self.mask_token is None:
                raise ConfigError("masking patches needs a mask token: build the model with mask_token=True")
            x = torch.where(mask[..., None], self.mask_token.to(x.dtype), x)
        x = self.add_pos(x, (gh, gw), pos)
        if keep is not None:
            x = torch.gather(x, 1, keep[..., None].expand(-1, -1, D))  # [B, K, D]
        x = self.add_prefix(x, pos)
        return self.norm_pre(self.pos_drop(x))

    def rope_table(self, grid: tuple[int, int], keep: torch.Tensor | None = None, device=None) -> torch.Tensor | None:
        """The rotary table of this grid's patches [N, 2 Dh] (with `keep`: of the kept ones, [B, 1, K, 2 Dh]), or
        None for a model without rotary positions. Learned per-block tables (`rope="mixed"`) have a leading
        [depth, heads] ([depth, B, heads] with `keep`); `block_rope` picks block i's."""
        if self.rope is None:
            return None
        table = self.rope.table(grid, device=device)  # [N, 2 Dh] or [L, H, N, 2 Dh]
        if keep is not None:
            if table.ndim == 2:
                table = table[keep][:, None]  # [B, 1, K, 2 Dh]: broadcast over heads
            else:
                table = table[:, :, keep].permute(0, 2, 1, 3, 4)  # [L, B, H, K, 2 Dh]
        return table

    def block_rope(self, rope: torch.Tensor | None, i: int) -> torch.Tensor | None:
        """Block i's rotary table: its own for learned per-block tables, else the shared one."""
        return rope[i] if rope is not None and self.cfg.rope == "mixed" else rope

    def rel_pos_bias(self, grid: tuple[int, int]) -> list[torch.Tensor | None]:
        """Each block's additive attention bias [1, H, P + N, P + N] for this grid (relative positions), or Nones."""
        if self.shared_rel_pos is not None:
            return [self.shared_rel_pos(grid, self.num_prefix_tokens)] * len(self.blocks)
        return [None if blk.attn.rel_pos is None else blk.attn.rel_pos(grid, self.num_prefix_tokens)
                for blk in self.blocks]

    @property
    def _grid_aware(self) -> bool:
        """Whether blocks need the input's patch grid (rotary positions, relative position biases, a conv MLP)."""
        return self.rope is not None or self.cfg.rel_pos != "none" \
            or mlp_needs_grid(MLP_LAYERS[self.cfg.mlp_layer])

    def _block_biases(self, grid: tuple[int, int] | None, keep: torch.Tensor | None = None) -> list:
        if self.cfg.rel_pos == "none":
            return [None] * len(self.blocks)
        if keep is not None:
            raise ConfigError("keeping a subset of patches (MAE) is not supported with relative position biases")
        return self.rel_pos_bias(grid)

    def embed_patches(self, batch: PatchBatch) -> torch.Tensor:
        """A PatchBatch (layers/naflex.py) -> input tokens of the first block [B, P + L, D]: the patch kernel as one
        matmul on the flattened patches, each image's own grid of the position table (resampled per grid as
        `_pos_table` does for a square input), then the prefix tokens. Padding rows get no position."""
        self._check_native_aspect()
        pe = self.patch_embed
        patch = pe.cut_size or pe.patch_size
        if (batch.patch_size, batch.patch_size) != tuple(patch):
            raise ConfigError(f"the batch was cut into {batch.patch_size}x{batch.patch_size} patches, the model cuts "
                              f"{patch[0]}x{patch[1]}: build the batch with patch size {patch[0]}")
        kernel = pe.proj.weight if pe.cut_size is None else resample_patch_kernel(pe.proj.weight, pe.cut_size)
        if batch.patches.shape[-1] != kernel[0].numel():
            raise ConfigError(f"patches of {batch.patches.shape[-1]} values do not fit the model's "
                              f"{kernel.shape[1]}x{patch[0]}x{patch[1]} patch kernel (channels?)")
        x = F.linear(batch.patches.to(kernel.dtype), kernel.flatten(1), pe.proj.bias)  # [B, L, D]
        x = pe.norm(x)
        if self.pos_embed is not None:
            L, tables, rows = x.shape[1], {}, []
            for gh, gw in batch.grids.tolist():
                if (gh, gw) not in tables:
                    tables[gh, gw] = self._pos_table((gh, gw))[0, self._pos_prefix:]  # [Gh*Gw, D]
                rows.append(F.pad(tables[gh, gw], (0, 0, 0, L - gh * gw)))
            x = x + torch.stack(rows).to(x.dtype)  # [B, L, D]
        x = self.add_prefix(x)
        return self.norm_pre(self.pos_drop(x))

    def _forward_patch_batch(self, batch: PatchBatch, return_attn: bool, return_sizes: bool):
        """forward_features for a PatchBatch: every block attends over each image's own tokens only."""
        x = self.embed_patches(batch)
        # [B, 1, 1, T], or None where nothing is padding
        mask = key_padding_mask(batch.token_mask(self.num_prefix_tokens).to(x.device))
        attns = []
        for blk in self.blocks:
            if return_attn:
                x, a = blk(x, return_attn=True, mask=mask)
                attns.append(a)
            elif self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = checkpoint(blk, x, mask=mask, use_reentrant=False)
            else:
                x = blk(x, mask=mask)
        x = self.norm(x)
        out = (x, attns) if return_attn else (x,)
        return (*out, None) if return_sizes else (out if return_attn else x)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Image [B, C, H, W] -> input tokens of the first block [B, P + N, D]."""
        return self.prepare_tokens(x)

    # ------------------------------------------------------------------ forward
    def forward_features(self, x: torch.Tensor, return_attn: bool = False, *, keep: torch.Tensor | None = None,
                         mask: torch.Tensor | None = None, pos: torch.Tensor | None = None,
                         return_sizes: bool = False):
        """Image -> normalised tokens [B, P + N, D] (`keep`, `mask`, `pos`: see `prepare_tokens`). With
        `return_attn`, also the list of per-block attention probabilities [B, H, T, T] (computed on the
        eager path for this call only). With token merging (`cfg.merge`, layers/tome.py) fewer tokens come out;
        `return_sizes` also returns how many patches each stands for [B, T, 1] (None without merging).
        A PatchBatch (images of their own grids, padded; layers/naflex.py) gives [B, P + L, D] with padding rows
        that mean nothing: pool them with `forward_head(..., valid=batch.token_mask(num_prefix_tokens))`."""
        if isinstance(x, PatchBatch):
            if keep is not None or mask is not None or pos is not None:
                raise ConfigError("keep / mask / pos take a square image batch, not a PatchBatch")
            return self._forward_patch_batch(x, return_attn, return_sizes)
        grid = self.patch_embed.grid_for(x.shape[-2], x.shape[-1]) if self._grid_aware else None
        rope = None if self.rope is None else self.rope_table(grid, keep, x.device)
        biases = self._block_biases(grid, keep)
        x = self.prepare_tokens(x, keep=keep, mask=mask, pos=pos)
        tokens_grid = grid if keep is None else None  # kept patches (even all of them, reordered) are no grid
        attns, sizes = [], None
        merged = merge_schedule(x.shape[1], self.num_prefix_tokens, self.cfg.merge, len(self.blocks)) \
            if self.cfg.merge else None  # tokens each block merges (ToMe); the config refuses rope / rel_pos
        for i, blk in enumerate(self.blocks):
            r, b = self.block_rope(rope, i), biases[i]
            if merged is not None:
                args = (x, sizes, merged[i], self.num_prefix_tokens, return_attn)
                if self.grad_checkpointing and torch.is_grad_enabled() and not return_attn:
                    x, sizes, a = checkpoint(blk.forward_merging, *args, use_reentrant=False)
                else:
                    x, sizes, a = blk.forward_merging(*args)
                attns.append(a)
            elif return_attn:
                x, a = blk(x, return_attn=True, rope=r, bias=b, grid=tokens_grid)
                attns.append(a)
            elif self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = checkpoint(blk, x, rope=r, bias=b, grid=tokens_grid, use_reentrant=False)
            else:
                x = blk(x, rope=r, bias=b, grid=tokens_grid)
        x = self.norm(x)
        out = (x, attns) if return_attn else (x,)
        return (*out, sizes) if return_sizes else (out if return_attn else x)

    def pool(self, x: torch.Tensor, sizes: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, D] -> [B, D] by the configured pooling: the class token, or mean / max / MAP over the patch tokens
        (over all tokens with `pool_include_prefix`, as timm's EVA-family models pool). `sizes` [B, T, 1] of merged
        tokens weight the mean (ToMe's MAE pooling: each token counts for the patches it stands for)."""
        if self.cfg.global_pool == "token":
            return x[:, 0]
        start = 0 if self.cfg.pool_include_prefix else self.num_prefix_tokens
        tokens = x[:, start:]
        valid = None if valid is None else valid[:, start:]  # [B, T'] False for padding (a PatchBatch's)
        if self.attn_pool is not None:
            return self.attn_pool(tokens, valid)
        if valid is not None:
            if self.cfg.global_pool == "avg":
                weights = valid[..., None].to(tokens.dtype)  # [B, T', 1]
                return (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
            return tokens.masked_fill(~valid[..., None], float("-inf")).amax(dim=1)
        if self.cfg.global_pool == "avg" and sizes is not None:
            weights = sizes[:, start:]  # [B, T', 1]
            return (tokens * weights).sum(dim=1) / weights.sum(dim=1)
        return tokens.mean(dim=1) if self.cfg.global_pool == "avg" else tokens.amax(dim=1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, sizes: torch.Tensor | None = None,
                     valid: torch.Tensor | None = None):
        """Tokens [B, T, D] -> logits [B, K] (or pooled features [B, D'] with `pre_logits=True`); `sizes`: of merged
        tokens (`forward_features(..., return_sizes=True)`), for mean pooling; `valid` [B, T]: False for the padding
        of a PatchBatch (`batch.token_mask(num_prefix_tokens)`), left out of pooling."""
        feats = self.pre_logits(self.fc_norm(self.pool(x, sizes, valid)))
        if self.head_dist is None:
            return feats if pre_logits else self.head(self.head_drop(feats))
        dist = self.pre_logits(self.fc_norm(x[:, 1]))  # the distillation token's features
        if pre_logits:
            return (feats + dist) / 2
        logits, dist = self.head(self.head_drop(feats)), self.head_dist(self.head_drop(dist))
        if self.distilled_training and self.training:
            return logits, dist
        return (logits + dist) / 2  # DeiT inference: average the class and distillation heads

    def forward(self, x: torch.Tensor, return_attn: bool = False, *, keep: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, pos: torch.Tensor | None = None, features: bool = False):
        """Logits (with `return_attn`, also the attention maps). `features=True` returns the normalised tokens
        of `forward_features` instead: objectives that train on tokens (MAE, DINOv2) call the model this way,
        so a DDP-wrapped or compiled model works the same. `keep`, `mask`, `pos`: see `prepare_tokens`. `x` may be
        a PatchBatch (layers/naflex.py): its padding is masked out of attention and pooling."""
        valid = x.token_mask(self.num_prefix_tokens) if isinstance(x, PatchBatch) else None
        if return_attn:
            feats, attns, sizes = self.forward_features(x, return_attn=True, keep=keep, mask=mask, pos=pos,
                                                        return_sizes=True)
            return (feats if features else self.forward_head(feats, sizes=sizes, valid=valid)), attns
        feats, sizes = self.forward_features(x, keep=keep, mask=mask, pos=pos, return_sizes=True)
        return feats if features else self.forward_head(feats, sizes=sizes, valid=valid)

    @property
    def feature_info(self) -> list[dict]:
        """One entry per block (timm's): every block's map has the width and the patch stride (a hybrid's
        patch_size is in image pixels, so it is the stride too)."""
        return [dict(module=f"blocks.{i}", num_chs=self.embed_dim, reduction=self.cfg.patch_size)
                for i in range(len(self.blocks))]

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Iterable[int] | None = None,
        *,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        return_prefix_tokens: bool = False,
    ):
        """Outputs of chosen blocks for dense tasks (timm's, keyword arguments only; see models/features.py).

        indices: an int n takes the last n blocks; a list takes those block indices (negatives allowed).
        Each intermediate is [B, D, Gh, Gw] (NCHW) or [B, Gh*Gw, D] (NLC), with the final norm when `norm`;
        with `return_prefix_tokens` each item is a (spatial, prefix [B, P, D]) pair. Returns (final tokens
        [B, P + N, D], intermediates) unless `intermediates_only`; `stop_early` stops after the last block
        taken (the final tokens are then that block's, normed, as timm's).
        """
        check_output_fmt(output_fmt, self.output_fmts)
        if isinstance(x, PatchBatch):
            raise ConfigError("dense features (forward_intermediates) take a square image batch, not a PatchBatch "
                              "(no --max-tokens)")
        if self.cfg.merge:
            raise ConfigError(f"merge={self.cfg.merge}: dense features (forward_intermediates) need every patch token; "
                              "build or load the model with merge=0 for them")
        take, last = feature_take_indices(len(self.blocks), indices)
        grid = gh, gw = self.patch_embed.grid_for(x.shape[-2], x.shape[-1])
        rope = self.rope_table(grid, device=x.device)
        biases = self._block_biases(grid)
        x = self.embed(x)
        outs = []
        for i, blk in enumerate(self.blocks):
            if (stop_early or intermediates_only) and i > last:  # nothing later is returned
                break
            r, b = self.block_rope(rope, i), biases[i]
            if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = checkpoint(blk, x, rope=r, bias=b, grid=grid, use_reentrant=False)
            else:
                x = blk(x, rope=r, bias=b, grid=grid)
            if i in take:
                y = self.norm(x) if norm else x
                prefix, spatial = y[:, : self.num_prefix_tokens], y[:, self.num_prefix_tokens:]  # [B, P, D], [B, N, D]
                if output_fmt == "NCHW":
                    spatial = spatial.reshape(y.shape[0], gh, gw, -1).permute(0, 3, 1, 2).contiguous()  # [B, D, Gh, Gw]
                outs.append((spatial, prefix) if return_prefix_tokens else spatial)
        if intermediates_only:
            return outs
        return self.norm(x), outs

def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[B, C, H, W] -> [B, N, P*P*C] flattened patches in (C, P, P) order (the paper's x_p)."""
    B, C, H, W = images.shape
    p = patch_size
    x = images.reshape(B, C, H // p, p, W // p, p)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)




# ---------------------------------------------------------------------------- the vit family's registry entry
# (models/registry.py Family; vit_variants registers the family with these)

# reads a ViTConfig off a timm-named state dict; a name, not an import: it lives in the weights layer
VIT_CONFIG_READER = "vitkit.weights.infer:infer_config"

# what a ViT state dict's shapes do not show: the head count splits the width, it is no tensor's shape
VIT_UNRECORDED_FIELDS = ("num_heads",)

# ViTConfig fields that make two models the same architecture for preprocessing purposes (the head count is
# not among them: a foreign file does not record it, see weights.infer)
VIT_SHAPE_FIELDS = ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "mlp_ratio", "class_token",
                    "distilled", "num_reg_tokens", "prefix_pos", "global_pool", "pre_norm", "patch_bias",
                    "embed_layer")


def vit_shape_key(cfg: ViTConfig) -> tuple:
    """The shape fields, and whether blocks have LayerScale: its init value is not the architecture (a file's
    trained gammas are loaded over it; weights.infer can only say that there are some)."""
    return (*(getattr(cfg, f) for f in VIT_SHAPE_FIELDS), cfg.init_values is not None)


def describe_vit_shape(cfg: ViTConfig) -> str:
    """'384/12/6 patch 16': width / depth / heads and the patch, as `vitkit models` lists them."""
    return f"{cfg.embed_dim}/{cfg.depth}/{cfg.num_heads} patch {cfg.patch_size}"


def check_vit_hints(cfg: ViTConfig, hints: dict, source: str) -> None:
    """What a foreign source says about the architecture vs the config it is loaded into: a different head
    count scrambles attention (an error); activation / LayerNorm eps differ only slightly (logged)."""
    heads = hints.get("num_heads")
    if heads is not None and heads != cfg.num_heads:
        raise CheckpointError(f"{source}: the checkpoint has {heads} attention heads, the model "
                              f"{cfg.num_heads} (pass num_heads={heads} or pick the matching --model)")
    for name in ("act", "norm_eps"):
        if name in hints and hints[name] != getattr(cfg, name):
            log.info("%s: the checkpoint was trained with %s=%r, the model uses %r (outputs differ slightly; "
                     "pass %s=%r to match)", source, name, hints[name], getattr(cfg, name), name, hints[name])
