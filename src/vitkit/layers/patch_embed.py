"""Patch embedding: one shared linear map per P×P patch, written as a stride-P convolution."""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError


def to_2tuple(x) -> tuple[int, int]:
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ConfigError(f"expected an int or a (height, width) pair, got {x!r}")
        return int(x[0]), int(x[1])
    return int(x), int(x)


@functools.lru_cache(maxsize=32)
def _kernel_resize_pinv(old: tuple[int, int], new: tuple[int, int], interpolation: str,
                        antialias: bool) -> torch.Tensor:
    """pinv(R) [oh*ow, nh*nw] of the resize matrix R [nh*nw, oh*ow] that maps a flattened old-size patch to the
    image resize of it. Cached: a few sizes at most are asked for, and training asks again every step."""
    n_old = old[0] * old[1]
    basis = torch.eye(n_old).reshape(n_old, 1, *old)  # each old pixel alone: the columns of R
    resized = F.interpolate(basis, size=new, mode=interpolation, antialias=antialias, align_corners=False)
    resize = resized.reshape(n_old, new[0] * new[1]).T  # [nh*nw, oh*ow]
    return torch.linalg.pinv(resize.double()).float()  # float64: the least-squares solve is better conditioned


def resample_patch_kernel(kernel: torch.Tensor, new_size, interpolation: str = "bicubic",
                          antialias: bool = True) -> torch.Tensor:
    """[D, C, ph, pw] patch filters -> [D, C, ph', pw'] that give a patch resized to the new size (as the image
    is) the response the old filters gave the original patch: FlexiViT's pseudo-inverse resize (Beyer et al.
    2023). With R the resize matrix, w' = argmin |R^T w' - w| (min-norm): <R x, w'> = <x, w> exactly when
    upsampling, as near as it can be when downsampling. bicubic + antialias is timm's default for this."""
    new = to_2tuple(new_size)
    old = (int(kernel.shape[-2]), int(kernel.shape[-1]))
    if old == new:
        return kernel
    pinv = _kernel_resize_pinv(old, new, interpolation, antialias).to(kernel.device)  # [oh*ow, nh*nw]
    flat = kernel.reshape(*kernel.shape[:2], old[0] * old[1]).float()  # [D, C, oh*ow]
    return (flat @ pinv).reshape(*kernel.shape[:2], *new).to(kernel.dtype)  # [D, C, nh, nw]


def kept_original(current: torch.Tensor, original: torch.Tensor | None, derive) -> torch.Tensor:
    """The tensor a resize starts from: `original` while `current` is still what `derive(original)` makes of it
    (so resizing never compounds: 16 -> 8 -> 16 gives the original back), else `current` (it was trained or
    loaded since, and is now the model's own)."""
    if original is not None and original.dtype == current.dtype:
        with torch.no_grad():
            made = derive(original)
        if made.shape == current.shape and torch.equal(made, current):
            return original
    return current.detach()


class PatchGrid:
    """The grid an embedding that cuts `patch_size`-pixel patches makes of an image (patch and hybrid embeds)."""

    patch_size: tuple[int, int]
    patch_note = ""  # what a patch is made of, for the error (a hybrid: the backbone stride x patches on its map)

    def set_img_size(self, img_size) -> None:
        self.img_size = to_2tuple(img_size)
        self.grid_size = self.grid_for(*self.img_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]

    def grid_for(self, h: int, w: int) -> tuple[int, int]:
        ph, pw = getattr(self, "cut_size", None) or self.patch_size
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
        # the kernel other patch sizes are resampled from (a loaded or trained one, never a resampled one);
        # not saved: a file holds the kernel at its own patch size
        self.register_buffer("original_kernel", None, persistent=False)
        self.cut_size: tuple[int, int] | None = None  # inside `cutting`: the patch size this forward cuts
        self.set_img_size(img_size)

    @contextlib.contextmanager
    def cutting(self, patch_size):
        """Inside the block, forwards cut `patch_size`-pixel patches with the kernel resampled from the current
        one in the forward itself (differentiable: the gradient reaches the one kernel), as FlexiViT trains;
        the model's patch size and weights stay as they are."""
        held, new = self.cut_size, to_2tuple(patch_size)
        self.cut_size = None if new == self.patch_size else new
        try:
            yield
        finally:
            self.cut_size = held

    def set_patch_size(self, patch_size, img_size=None) -> None:
        """Cut `patch_size`-pixel patches from now on: the kernel is resampled (`resample_patch_kernel`) from the
        original one; the grid follows, at `img_size` (default: the current one; the caller checks it divides)."""
        new = to_2tuple(patch_size)
        weight = self.proj.weight
        original = kept_original(weight, self.original_kernel, lambda w: resample_patch_kernel(w, self.patch_size))
        with torch.no_grad():
            proj = nn.Conv2d(self.in_chans, weight.shape[0], kernel_size=new, stride=new,
                             bias=self.proj.bias is not None, device=weight.device, dtype=weight.dtype)
            proj.weight.copy_(resample_patch_kernel(original, new))
            if self.proj.bias is not None:
                proj.bias.copy_(self.proj.bias)
        proj.weight.requires_grad_(weight.requires_grad)
        if proj.bias is not None:
            proj.bias.requires_grad_(self.proj.bias.requires_grad)
        self.proj, self.patch_size, self.original_kernel = proj, new, original
        self.set_img_size(self.img_size if img_size is None else img_size)

    def keep_original_kernel(self, kernel: torch.Tensor) -> None:
        """A checkpoint's kernel at another patch size, being loaded resampled: remembered as the original."""
        self.original_kernel = kernel.detach().to(self.proj.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ConfigError(
                f"expected input of shape [batch, {self.in_chans}, H, W], got {list(x.shape)}"
            )
        if not torch.jit.is_tracing() and not torch.compiler.is_compiling():
            self.grid_for(x.shape[-2], x.shape[-1])  # clear error for non-divisible sizes
        if self.cut_size is None:
            x = self.proj(x)  # [B, D, Gh, Gw]
        else:  # FlexiViT training: [D, C, P, P] -> [D, C, P', P'] in the graph
            kernel = resample_patch_kernel(self.proj.weight, self.cut_size)
            x = F.conv2d(x, kernel, self.proj.bias, stride=self.cut_size)
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
