"""Patch embedding: one shared linear map per P×P patch, written as a stride-P convolution."""
from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError


def to_2tuple(x) -> tuple[int, int]:
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ConfigError(f"expected an int or a (height, width) pair, got {x!r}")
        return int(x[0]), int(x[1])
    return int(x), int(x)


class PatchGrid:
    """The grid an embedding that cuts `patch_size`-pixel patches makes of an image (patch and hybrid embeds)."""

    patch_size: tuple[int, int]
    patch_note = ""  # what a patch is made of, for the error (a hybrid: the backbone stride x patches on its map)

    def set_img_size(self, img_size) -> None:
        self.img_size = to_2tuple(img_size)
        self.grid_size = self.grid_for(*self.img_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]

    def grid_for(self, h: int, w: int) -> tuple[int, int]:
        ph, pw = self.patch_size
        if h % ph or w % pw:
            raise ConfigError(
                f"image size {h}x{w} is not divisible by the patch size {ph}x{pw}{self.patch_note}; "
                f"resize or crop to a multiple of {ph} (e.g. {h // ph * ph}x{w // pw * pw})"
            )
        return h // ph, w // pw


class PatchEmbed(PatchGrid, nn.Module):
    """[B, C, H, W] -> [B, H/P, W/P, D] (kept as a grid so the caller knows the shape; flattened later)."""

    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True, norm=False, eps=1e-6):
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.in_chans = in_chans
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)
        self.norm = nn.LayerNorm(embed_dim, eps=eps) if norm else nn.Identity()
        self.set_img_size(img_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ConfigError(
                f"expected input of shape [batch, {self.in_chans}, H, W], got {list(x.shape)}"
            )
        if not torch.jit.is_tracing() and not torch.compiler.is_compiling():
            self.grid_for(x.shape[-2], x.shape[-1])  # clear error for non-divisible sizes
        x = self.proj(x)  # [B, D, Gh, Gw]
        x = x.permute(0, 2, 3, 1)  # [B, Gh, Gw, D]
        return self.norm(x)


def adapt_in_chans(w: torch.Tensor, in_chans: int) -> torch.Tensor:
    """[D, C, p, p] patch filters -> [D, in_chans, p, p] so the response to a gray image is preserved."""
    c = w.shape[1]
    if c == in_chans:
        return w
    if in_chans == 1:
        return w.sum(dim=1, keepdim=True)
    if c == 1:
        return w.repeat(1, in_chans, 1, 1) / in_chans
    reps = -(-in_chans // c)  # ceil
    return w.repeat(1, reps, 1, 1)[:, :in_chans] * (c / in_chans)


# Patch-embedding layers by the name a config stores (ViTConfig.embed_layer). Each maps [B, C, H, W] to a
# [B, Gh, Gw, D] grid and has `grid_size`, `num_patches`, `grid_for(h, w)` and `set_img_size(size)`;
# a hybrid CNN stem is registered here under its own name.
EMBED_LAYERS: dict[str, type[nn.Module]] = {"patch": PatchEmbed}
