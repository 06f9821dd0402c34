"""The one VisionTransformer (Dosovitskiy et al. 2021) with the variants the field uses.

Key names follow timm's (`cls_token`, `pos_embed`, `patch_embed.proj`, `blocks.{i}.attn.qkv`, `norm`,
`fc_norm`, `head`, ...) so that importing any checkpoint is a small state-dict filter.
Token layout: [class] [distillation] [registers...] [patches in row-major order].
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError
from ..layers import Block, PatchEmbed, resample_pos_embed, sincos_2d_pos_embed
from ..layers.patch_embed import to_2tuple
from .config import ViTConfig


class VisionTransformer(nn.Module):
    def __init__(self, cfg: ViTConfig | None = None, **kwargs):
        super().__init__()
        cfg = (cfg or ViTConfig()).replace(**kwargs) if kwargs else (cfg or ViTConfig())
        self.cfg = cfg
        D = cfg.embed_dim
        self.num_classes = cfg.num_classes
        self.num_features = self.embed_dim = D
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.grad_checkpointing = False
        self.distilled_training = False  # DeiT: return (cls_logits, dist_logits) in train mode

        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D, bias=cfg.patch_bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.num_reg_tokens, D)) if cfg.num_reg_tokens else None
        n_pos = self.patch_embed.num_patches + (self.num_prefix_tokens if cfg.prefix_pos else 0)
        if cfg.pos_embed == "none":
            self.pos_embed = None
        else:
            self.pos_embed = nn.Parameter(torch.zeros(1, n_pos, D), requires_grad=cfg.pos_embed == "learn")
        self.pos_drop = nn.Dropout(cfg.pos_drop_rate)
        self.norm_pre = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.pre_norm else nn.Identity()

        dpr = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]  # deeper blocks drop more
        self.blocks = nn.Sequential(*[
            Block(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, cfg.qk_norm, cfg.init_values, cfg.act,
                  cfg.proj_drop_rate, cfg.attn_drop_rate, dpr[i], cfg.norm_eps)
            for i in range(cfg.depth)
        ])
        use_fc_norm = cfg.use_fc_norm
        self.norm = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.final_norm and not use_fc_norm else nn.Identity()
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
            if self.cfg.pos_embed == "sincos":
                table = sincos_2d_pos_embed(self.embed_dim, self.patch_embed.grid_size)
                if self.cfg.prefix_pos and self.num_prefix_tokens:
                    table = torch.cat([torch.zeros(self.num_prefix_tokens, self.embed_dim), table])
                with torch.no_grad():
                    self.pos_embed.copy_(table[None])
            else:
                nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for tok in (self.cls_token, self.dist_token, self.reg_token):
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
        return {"pos_embed", "cls_token", "dist_token", "reg_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """timm-style grouping: the stem (embeddings) and one group per block, for layer-wise LR decay."""
        return {
            "stem": r"^cls_token|^pos_embed|^patch_embed|^reg_token|^dist_token|^norm_pre",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    def layer_id(self, param_name: str) -> int:
        """0 for embeddings, i+1 for block i, depth+1 for final norm and heads (layer-wise LR decay)."""
        if re.match(self.group_matcher()["stem"], param_name):
            return 0
        m = re.match(r"^blocks\.(\d+)\.", param_name)
        return int(m.group(1)) + 1 if m else len(self.blocks) + 1

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
            if global_pool not in ("token", "avg", "max"):
                raise ConfigError(f"unknown pooling {global_pool!r}")
            self.cfg = self.cfg.replace(global_pool=global_pool)
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        device = self.pos_embed.device if self.pos_embed is not None else None

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

    def set_input_size(self, img_size=None, interpolation: str | None = None, antialias: bool | None = None) -> None:
        """Change the native resolution: resamples the stored position table (prefix rows untouched)."""
        if img_size is None:
            return
        img_size = to_2tuple(img_size)
        old_grid = self.patch_embed.grid_size
        new_grid = self.patch_embed.grid_for(*img_size)
        self.patch_embed.set_img_size(img_size)
        self.cfg = self.cfg.replace(img_size=img_size)
        if self.pos_embed is None:
            return
        with torch.no_grad():
            if self.cfg.pos_embed == "sincos":
                table = sincos_2d_pos_embed(self.embed_dim, new_grid).to(self.pos_embed)[None]
                if self.cfg.prefix_pos and self.num_prefix_tokens:
                    table = torch.cat([self.pos_embed[:, : self.num_prefix_tokens], table], dim=1)
            else:
                table = resample_pos_embed(
                    self.pos_embed.data, new_grid, old_grid, self._pos_prefix,
                    interpolation or self.cfg.pos_interpolation,
                    self.cfg.pos_antialias if antialias is None else antialias,
                )
        self.pos_embed = nn.Parameter(table, requires_grad=self.pos_embed.requires_grad)

    @property
    def _pos_prefix(self) -> int:
        """How many rows of the position table belong to prefix tokens."""
        return self.num_prefix_tokens if self.cfg.prefix_pos else 0

    # ------------------------------------------------------------------ forward
    def _pos_embed(self, x: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """[B, Gh, Gw, D] patch grid -> [B, P + Gh*Gw, D] tokens with positions added.

        `pos`: a position table already sized for this grid (the ONNX export resamples it in-graph)."""
        B, gh, gw, D = x.shape
        if pos is None and self.pos_embed is not None:
            pos = self.pos_embed
            if (gh, gw) != self.patch_embed.grid_size:
                pos = resample_pos_embed(pos, (gh, gw), self.patch_embed.grid_size, self._pos_prefix,
                                         self.cfg.pos_interpolation, self.cfg.pos_antialias)
        x = x.reshape(B, gh * gw, D)  # [B, N, D]
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if pos is None:
            x = torch.cat(prefix + [x], dim=1) if prefix else x
        elif self.cfg.prefix_pos:
            x = torch.cat(prefix + [x], dim=1) if prefix else x
            x = x + pos
        else:
            x = x + pos
            x = torch.cat(prefix + [x], dim=1) if prefix else x
        return self.pos_drop(x)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Image [B, C, H, W] -> input tokens of the first block [B, P + N, D]."""
        return self.norm_pre(self._pos_embed(self.patch_embed(x)))

    def forward_features(self, x: torch.Tensor, return_attn: bool = False):
        """Image -> normalised tokens [B, P + N, D]. With `return_attn`, also the list of per-block
        attention probabilities [B, H, T, T] (computed on the eager path for this call only)."""
        x = self.embed(x)
        attns = []
        for blk in self.blocks:
            if return_attn:
                x, a = blk(x, return_attn=True)
                attns.append(a)
            elif self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        x = self.norm(x)
        return (x, attns) if return_attn else x

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, D] -> [B, D] by the configured pooling (class token, or mean/max of patch tokens)."""
        if self.cfg.global_pool == "avg":
            return x[:, self.num_prefix_tokens:].mean(dim=1)
        if self.cfg.global_pool == "max":
            return x[:, self.num_prefix_tokens:].amax(dim=1)
        return x[:, 0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False):
        """Tokens [B, T, D] -> logits [B, K] (or pooled features [B, D'] with `pre_logits=True`)."""
        feats = self.pre_logits(self.fc_norm(self.pool(x)))
        if self.head_dist is None:
            return feats if pre_logits else self.head(self.head_drop(feats))
        dist = self.pre_logits(self.fc_norm(x[:, 1]))  # the distillation token's features
        if pre_logits:
            return (feats + dist) / 2
        logits, dist = self.head(self.head_drop(feats)), self.head_dist(self.head_drop(dist))
        if self.distilled_training and self.training:
            return logits, dist
        return (logits + dist) / 2  # DeiT inference: average the class and distillation heads

    def forward(self, x: torch.Tensor, return_attn: bool = False):
        if return_attn:
            feats, attns = self.forward_features(x, return_attn=True)
            return self.forward_head(feats), attns
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Iterable[int] | None = None,
        norm: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        return_prefix_tokens: bool = False,
    ):
        """Outputs of chosen blocks for dense tasks.

        indices: an int n takes the last n blocks; a list takes those block indices (negatives allowed).
        Each intermediate is [B, D, Gh, Gw] (NCHW) or [B, Gh*Gw, D] (NLC); with `return_prefix_tokens`
        each item is a (spatial, prefix [B, P, D]) pair. Returns (final_tokens, intermediates) unless
        `intermediates_only`.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ConfigError("output_fmt must be 'NCHW' or 'NLC'")
        depth = len(self.blocks)
        if indices is None:
            take = list(range(depth))
        elif isinstance(indices, int):
            take = list(range(depth - indices, depth))
        else:
            take = [i if i >= 0 else depth + i for i in indices]
        if any(i < 0 or i >= depth for i in take):
            raise ConfigError(f"block indices {indices} out of range for depth {depth}")
        gh, gw = self.patch_embed.grid_for(x.shape[-2], x.shape[-1])
        x = self.embed(x)
        outs = []
        last = max(take) if take else -1
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            if i in take:
                y = self.norm(x) if norm else x
                prefix, spatial = y[:, : self.num_prefix_tokens], y[:, self.num_prefix_tokens:]
                if output_fmt == "NCHW":
                    spatial = spatial.reshape(y.shape[0], gh, gw, -1).permute(0, 3, 1, 2)  # [B, D, Gh, Gw]
                outs.append((spatial, prefix) if return_prefix_tokens else spatial)
            if intermediates_only and i == last:
                break
        if intermediates_only:
            return outs
        return self.norm(x), outs

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[B, C, H, W] -> [B, N, P*P*C] flattened patches in (C, P, P) order (the paper's x_p)."""
    B, C, H, W = images.shape
    p = patch_size
    x = images.reshape(B, C, H // p, p, W // p, p)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)


