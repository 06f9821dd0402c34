"""Native aspect ratio under a token budget (NaFlex, as timm's NaFlexViT; NaViT and FlexiViT's ideas): each image
is resized, keeping its aspect ratio, to the largest grid of P-pixel patches with at most N of them, cut into
patches, and images of different grids share a batch padded to one sequence length. The model masks the padding
out of attention and pooling (models/vision_transformer.py)."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..errors import ConfigError


def grid_for_budget(h: int, w: int, patch: int, max_tokens: int) -> tuple[int, int]:
    """The largest (Gh, Gw) patch grid of an h x w image scaled by one factor s (each side rounded up to whole
    patches, at least one) with Gh * Gw <= max_tokens: timm's `get_image_size_for_seq`, solved exactly.

    The patch count only steps where s * h / P or s * w / P crosses an integer, so the largest feasible s is
    one of those steps: k * P / h (Gh = k) or k * P / w (Gw = k)."""
    if max_tokens < 1:
        raise ConfigError(f"max tokens must be at least 1 (one {patch}x{patch} patch), got {max_tokens}")
    if h < 1 or w < 1:
        raise ConfigError(f"an image of {h}x{w} pixels has no patches")
    best, best_scale = (1, 1), 0.0
    for k in range(1, max_tokens + 1):
        for scale, grid in ((k / h, (k, max(1, -(-w * k // h)))), (k / w, (max(1, -(-h * k // w)), k))):
            if grid[0] * grid[1] <= max_tokens and scale > best_scale:
                best, best_scale = grid, scale
    return best


def image_patches(image: torch.Tensor, patch: int) -> ImagePatches:
    """An image [C, Gh*P, Gw*P] -> its ImagePatches."""
    return ImagePatches(patchify(image, patch), (image.shape[-2] // patch, image.shape[-1] // patch), patch)


def patchify(image: torch.Tensor, patch: int) -> torch.Tensor:
    """[..., C, H, W] with H, W multiples of `patch` -> [..., N, C*P*P], patches in row-major order, each flattened
    in (C, P, P) order: the order of a conv kernel's weight [D, C, P, P], so the patch embedding is one matmul."""
    *lead, C, H, W = image.shape
    gh, gw = H // patch, W // patch
    x = image.reshape(*lead, C, gh, patch, gw, patch)
    n = len(lead)
    x = x.permute(*range(n), n + 1, n + 3, n, n + 2, n + 4)  # [..., Gh, Gw, C, P, P]
    return x.reshape(*lead, gh * gw, C * patch * patch)


@dataclasses.dataclass
class ImagePatches:
    """One image as a NaFlex input: its patches [Gh*Gw, C*P*P] (row-major), its grid (Gh, Gw) and the patch side P."""

    patches: torch.Tensor
    grid: tuple[int, int]
    patch_size: int


@dataclasses.dataclass
class PatchBatch:
    """Images of different patch grids as one batch: patches [B, L, C*P*P], image b's first Gh*Gw rows its own
    (row-major over its grid), the rest zeros; grids [B, 2] each image's (Gh, Gw). Models that take it
    (`VisionTransformer`) mask the padding out of attention and pooling."""

    patches: torch.Tensor
    grids: torch.Tensor
    patch_size: int

    def __len__(self) -> int:
        return self.patches.shape[0]

    def __getitem__(self, index) -> PatchBatch:
        """Some of the images (an index, slice or boolean mask over the batch), padded as before."""
        return PatchBatch(self.patches[index], self.grids[index.to(self.grids.device)
                                                          if isinstance(index, torch.Tensor) else index], self.patch_size)

    @property
    def lengths(self) -> torch.Tensor:
        """[B] each image's patch count."""
        return self.grids[:, 0] * self.grids[:, 1]

    @property
    def valid(self) -> torch.Tensor:
        """[B, L] True for an image's own patches, False for padding."""
        L = self.patches.shape[1]
        return torch.arange(L, device=self.patches.device)[None] < self.lengths.to(self.patches.device)[:, None]

    def token_mask(self, num_prefix_tokens: int) -> torch.Tensor:
        """[B, P + L] validity of the model's tokens: prefix tokens (class, registers) always valid."""
        valid = self.valid
        return torch.cat([valid.new_ones(len(self), num_prefix_tokens), valid], dim=1)

    @property
    def padded_fraction(self) -> float:
        """The share of patch slots that are padding."""
        return 1.0 - float(self.lengths.sum()) / max(self.patches.shape[0] * self.patches.shape[1], 1)

    def to(self, *args, **kwargs) -> PatchBatch:
        """Patches moved / cast as `Tensor.to` does; grids only moved (they stay integers)."""
        patches = self.patches.to(*args, **kwargs)
        return PatchBatch(patches, self.grids.to(patches.device), self.patch_size)

    def pin_memory(self) -> PatchBatch:
        return PatchBatch(self.patches.pin_memory(), self.grids.pin_memory(), self.patch_size)


def pad_patches(items: list[ImagePatches], length: int | None = None) -> PatchBatch:
    """Images' patches -> one PatchBatch padded to the longest (or to `length`, for a fixed sequence length)."""
    if not items:
        raise ConfigError("no images to batch")
    patch_size = items[0].patch_size
    if any(it.patch_size != patch_size for it in items):
        raise ConfigError(f"images cut into patches of different sizes ({sorted({it.patch_size for it in items})}) "
                          "cannot share a batch")
    longest = max(it.patches.shape[0] for it in items)
    L = longest if length is None else length
    if L < longest:
        raise ConfigError(f"an image has {longest} patches, more than the sequence length {L}")
    patches = torch.stack([F.pad(it.patches, (0, 0, 0, L - it.patches.shape[0])) for it in items])  # [B, L, CPP]
    grids = torch.tensor([it.grid for it in items], dtype=torch.long)  # [B, 2]
    return PatchBatch(patches, grids, patch_size)


def key_padding_mask(valid: torch.Tensor | None) -> torch.Tensor | None:
    """Token validity [B, T] -> the boolean attention mask [B, 1, 1, T] (True: attend) SDPA broadcasts over heads
    and queries: no token attends to padding; padded queries attend to the valid keys and are never read.
    None where nothing is padding, so such a batch takes the unmasked kernels (the fused encoder layer among them:
    with a mask it measured 0.67x the module path in bf16, benchmarks/naflex_padding.py)."""
    if valid is None or bool(valid.all()):
        return None
    return valid[:, None, None, :]
