"""MAE (He et al. 2022): the ViT encoder sees a random subset of the patches (25% by default) through the
token seam (`keep=`); a light decoder fills in mask tokens and predicts the pixels of the hidden patches.

Key names are MAE's own (`decoder_embed`, `mask_token`, `decoder_pos_embed`, `decoder_blocks.{i}`,
`decoder_norm`, `decoder_pred`), so the original checkpoints' decoders load as they are; the encoder is a
plain VisionTransformer and is what the trainer saves for fine-tuning.

The `mae` family is the whole pretraining model (`MaeModel`: `encoder.*` + `decoder.*`, the names transformers'
ViTMAEForPreTraining gives its decoder too), what `vitkit.load_model` gives for an MAE pretraining checkpoint
(original or transformers'). As a VitkitModel it is its encoder (models/towers.py); `model(x, noise=...)` or
`model(x, mask_ratio=...)` is the MAE step, with the decoder settings and the loss of the file's config.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import ConfigError
from ..layers import Block, sincos_2d_pos_embed
from . import vit_variants  # noqa: F401  (registers the MAE encoders the names below are built on)
from .config import ACTS, Preprocess, ViTConfig
from .registry import get_entry, register_family, register_model
from .towers import ImageTowerModel, TowerConfig
from .vision_transformer import VisionTransformer


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[B, C, H, W] -> [B, N, P*P*C] in MAE's order (row of pixels, then column, channel last)."""
    B, C, H, W = images.shape
    p = patch_size
    x = images.reshape(B, C, H // p, p, W // p, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p * C)


def unpatchify(patches: torch.Tensor, patch_size: int, grid: tuple[int, int], channels: int) -> torch.Tensor:
    """The inverse of `patchify`: [B, N, P*P*C] -> [B, C, Gh*P, Gw*P]."""
    B, p, (gh, gw) = patches.shape[0], patch_size, grid
    x = patches.reshape(B, gh, gw, p, p, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(B, channels, gh * p, gw * p)


def random_masking(batch: int, length: int, mask_ratio: float, noise: torch.Tensor | None = None,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample random masking by sorting noise (MAE, and transformers' ViTMAE with the same `noise`).

    Returns ids_keep [B, K] (the patches the encoder sees, K = int(L * (1 - ratio))), mask [B, L] (1 =
    hidden, in the original patch order) and ids_restore [B, L] (the inverse of the shuffle).
    """
    if noise is None:
        noise = torch.rand(batch, length, device=device)
    keep = int(length * (1 - mask_ratio))
    ids_shuffle = torch.argsort(noise, dim=1)  # ascending: the smallest noise is kept
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    mask = torch.ones(batch, length, device=noise.device)
    mask[:, :keep] = 0
    return ids_shuffle[:, :keep], torch.gather(mask, 1, ids_restore), ids_restore


class MaeDecoder(nn.Module):
    """Encoder tokens [B, P + K, D] -> predicted pixels of every patch [B, L, P*P*C]."""

    def __init__(self, embed_dim: int, grid: tuple[int, int], patch_size: int, in_chans: int,
                 num_prefix_tokens: int = 1, decoder_dim: int = 512, depth: int = 8, num_heads: int = 16,
                 mlp_ratio: float = 4.0, eps: float = 1e-6, act: str = "gelu"):
        super().__init__()
        self.num_prefix_tokens, self.patch_size, self.in_chans = num_prefix_tokens, patch_size, in_chans
        self.decoder_embed = nn.Linear(embed_dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        # fixed sin-cos positions (column first, as MAE); prefix rows zero
        table = torch.zeros(1, num_prefix_tokens + grid[0] * grid[1], decoder_dim)
        table[0, num_prefix_tokens:] = sincos_2d_pos_embed(decoder_dim, grid)
        self.decoder_pos_embed = nn.Parameter(table, requires_grad=False)
        self.decoder_blocks = nn.ModuleList(
            Block(decoder_dim, num_heads, mlp_ratio, qkv_bias=True, act=act, eps=eps) for _ in range(depth))
        self.decoder_norm = nn.LayerNorm(decoder_dim, eps=eps)
        self.decoder_pred = nn.Linear(decoder_dim, patch_size * patch_size * in_chans)
        for m in self.modules():  # MAE's init: xavier Linear, zero biases, LayerNorm ones/zeros
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, tokens: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        P = self.num_prefix_tokens
        x = self.decoder_embed(tokens)  # [B, P + K, Dd]
        B, _, Dd = x.shape
        L = ids_restore.shape[1]
        fill = self.mask_token.to(x.dtype).expand(B, L - (x.shape[1] - P), -1)
        patches = torch.cat([x[:, P:], fill], dim=1)  # [B, L, Dd] in shuffled order
        patches = torch.gather(patches, 1, ids_restore[..., None].expand(-1, -1, Dd))  # original order
        x = torch.cat([x[:, :P], patches], dim=1) + self.decoder_pos_embed.to(x.dtype)
        for blk in self.decoder_blocks:
            x = blk(x)
        return self.decoder_pred(self.decoder_norm(x))[:, P:]  # [B, L, P*P*C]


def reconstruction_loss(pred: torch.Tensor, images: torch.Tensor, mask: torch.Tensor, patch_size: int,
                        norm_pix: bool = True) -> torch.Tensor:
    """Mean squared error per patch, averaged over the hidden patches only. With `norm_pix`, each target
    patch is normalised by its own mean and (unbiased) variance, eps 1e-6 (MAE's norm_pix_loss)."""
    target = patchify(images, patch_size)  # [B, L, P*P*C]
    if norm_pix:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1e-6) ** 0.5
    per_patch = ((pred.float() - target) ** 2).mean(dim=-1)  # [B, L]
    return (per_patch * mask).sum() / mask.sum()


def mae_forward(encoder: nn.Module, decoder: MaeDecoder, images: torch.Tensor, mask_ratio: float = 0.75,
                noise: torch.Tensor | None = None, norm_pix: bool = True) -> dict[str, torch.Tensor]:
    """One MAE step's forward: {"loss", "pred" [B, L, P*P*C], "mask" [B, L], "ids_restore" [B, L]}.
    `encoder` is called as `encoder(images, keep=ids_keep, features=True)`, so a DDP-wrapped or compiled
    ViT works; `noise` [B, L] fixes the masking (tests, figures)."""
    p = decoder.patch_size
    gh, gw = images.shape[-2] // p, images.shape[-1] // p
    ids_keep, mask, ids_restore = random_masking(images.shape[0], gh * gw, mask_ratio, noise, images.device)
    tokens = encoder(images, keep=ids_keep, features=True)  # [B, P + K, D]
    pred = decoder(tokens, ids_restore)
    loss = reconstruction_loss(pred, images, mask, p, norm_pix)
    return {"loss": loss, "pred": pred, "mask": mask, "ids_restore": ids_restore}


def reconstruct(pred: torch.Tensor, images: torch.Tensor, mask: torch.Tensor,
                patch_size: int, norm_pix: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """For looking at: (the images with hidden patches zeroed, the images with hidden patches replaced by the
    prediction), both [B, C, H, W] in the input's space. A norm-pix prediction is mapped back with each patch's
    own mean and variance (without that it looks like noise)."""
    B, C, H, W = images.shape
    target = patchify(images, patch_size)  # [B, L, P*P*C]
    pred = pred.float()
    if norm_pix:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        pred = pred * (var + 1e-6) ** 0.5 + mean
    hidden = mask[..., None].bool()  # [B, L, 1]
    grid = (H // patch_size, W // patch_size)
    masked = unpatchify(target.masked_fill(hidden, 0.0), patch_size, grid, C)
    filled = unpatchify(torch.where(hidden, pred, target), patch_size, grid, C)
    return masked, filled


# ---------------------------------------------------------------------------- the whole pretraining model
def _mae_encoder(size: str = "base", patch_size: int = 16) -> ViTConfig:
    return get_entry(f"vit_{size}_patch{patch_size}_mae").cfg


@dataclass
class MaeConfig(TowerConfig):
    _what = "MAE config"
    tower_field = "encoder"

    encoder: ViTConfig = field(default_factory=_mae_encoder)
    decoder_dim: int = 512  # MAE's decoder for every encoder size: 512 wide, 8 blocks, 16 heads
    decoder_depth: int = 8
    decoder_heads: int = 16
    decoder_mlp_ratio: float = 4.0
    decoder_eps: float = 1e-6  # MAE: LayerNorm eps 1e-6; transformers' ViTMAE: its layer_norm_eps (1e-12)
    decoder_act: str = "gelu"
    mask_ratio: float = 0.75
    norm_pix_loss: bool = True  # MAE's recommended target (its released decoders were trained with it)

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.mask_ratio < 1:
            raise ConfigError(f"mask_ratio must be in (0, 1), got {self.mask_ratio}")
        if self.decoder_dim <= 0 or self.decoder_heads <= 0 or self.decoder_dim % self.decoder_heads:
            raise ConfigError(f"decoder_dim {self.decoder_dim} must be a positive multiple of decoder_heads "
                              f"{self.decoder_heads}")
        if self.decoder_dim % 4:
            raise ConfigError(f"decoder_dim {self.decoder_dim} must be divisible by 4 (its 2-D sin-cos table)")
        if self.decoder_depth < 0:
            raise ConfigError(f"decoder_depth must be >= 0, got {self.decoder_depth}")
        if self.decoder_act not in ACTS:
            raise ConfigError(f"decoder_act must be one of {ACTS}")


class MaeModel(ImageTowerModel):
    """MAE's pretraining model: `encoder` (a VisionTransformer) and `decoder` (MaeDecoder).

    `model(images)`: the encoder's output, as every VitkitModel (logits, or its pooled features without a head).
    `model(images, noise=noise)` ([B, L], the masking of transformers' ViTMAE `noise=`) or `model(images,
    mask_ratio=r)` (random masking): MAE's step, {"loss", "pred" [B, L, P*P*C], "mask" [B, L], "ids_restore"}.
    """

    image_attr = "encoder"
    towers = {"image": ("encoder", "encoder")}  # name -> (module, config field): load_model(path, tower="image")
    head_names = ("encoder.head", "encoder.head_dist")
    # the encoder's feature maps; its attention maps and token seam are reached through `model.encoder`
    capabilities = frozenset({"intermediates"})

    def __init__(self, cfg: MaeConfig | None = None, *, preprocess: Preprocess | None = None, class_names=None,
                 provenance=None, **overrides):
        super().__init__()
        cfg = cfg or MaeConfig()
        cfg = cfg.replace(**overrides) if overrides else cfg
        self.cfg = cfg
        self.encoder = VisionTransformer(cfg.encoder, preprocess=preprocess)
        self.preprocess = self.encoder.preprocess
        self.num_classes = cfg.num_classes
        self.num_features = self.embed_dim = self.encoder.num_features
        self.class_names = list(class_names) if class_names else None
        self.provenance = dict(provenance or {})
        e = self.encoder
        self.decoder = MaeDecoder(e.embed_dim, e.patch_embed.grid_size, cfg.encoder.patch_size, cfg.in_chans,
                                  e.num_prefix_tokens, cfg.decoder_dim, cfg.decoder_depth, cfg.decoder_heads,
                                  cfg.decoder_mlp_ratio, cfg.decoder_eps, cfg.decoder_act)

    def forward(self, images: torch.Tensor, noise: torch.Tensor | None = None, *, mask_ratio: float | None = None):
        if noise is None and mask_ratio is None:
            return self.encoder(images)
        ratio = self.cfg.mask_ratio if mask_ratio is None else mask_ratio
        return mae_forward(self.encoder, self.decoder, images, ratio, noise, self.cfg.norm_pix_loss)


register_family("mae", MaeConfig, MaeModel)

# MAE's three pretraining models (facebookresearch/mae models_mae.py: mae_vit_{base,large}_patch16_dec512d8b,
# mae_vit_huge_patch14_dec512d8b); the released files are MAE's own (.pth), read by `vitkit.load_model`.
for _size, _patch in (("base", 16), ("large", 16), ("huge", 14)):
    register_model(f"mae_vit_{_size}_patch{_patch}", "mae", MaeConfig(encoder=_mae_encoder(_size, _patch)),
                   group="mae", crop_pct=0.875,
                   notes=f"MAE pretraining model: the ViT-{_size[0].upper()}/{_patch} encoder and a 512-wide, "
                         "8-block decoder")
