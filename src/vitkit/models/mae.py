"""MAE (He et al. 2022): the ViT encoder sees a random subset of the patches (25% by default) through the
token seam (`keep=`); a light decoder fills in mask tokens and predicts the pixels of the hidden patches.

Key names are MAE's own (`decoder_embed`, `mask_token`, `decoder_pos_embed`, `decoder_blocks.{i}`,
`decoder_norm`, `decoder_pred`), so the original checkpoints' decoders load as they are; the encoder is a
plain VisionTransformer and is what the trainer saves for fine-tuning.
"""
from __future__ import annotations

import torch
from torch import nn

from ..layers import Block, sincos_2d_pos_embed


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
                 mlp_ratio: float = 4.0, eps: float = 1e-6):
        super().__init__()
        self.num_prefix_tokens, self.patch_size, self.in_chans = num_prefix_tokens, patch_size, in_chans
        self.decoder_embed = nn.Linear(embed_dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        # fixed sin-cos positions (column first, as MAE); prefix rows zero
        table = torch.zeros(1, num_prefix_tokens + grid[0] * grid[1], decoder_dim)
        table[0, num_prefix_tokens:] = sincos_2d_pos_embed(decoder_dim, grid)
        self.decoder_pos_embed = nn.Parameter(table, requires_grad=False)
        self.decoder_blocks = nn.ModuleList(
            Block(decoder_dim, num_heads, mlp_ratio, qkv_bias=True, eps=eps) for _ in range(depth))
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
