"""DINO's multi-crop on a batch of already-transformed images (Caron et al. 2021, `DataAugmentationDINO`).

The trainer's DataLoader yields normalised tensors at the model's input size, so the crops are made on the
batch, on the device, by the objective that needs them: each image gives 2 global crops (the model's input
size, area fraction `global_scale`) and N local crops (a smaller size, `local_scale`), each a random resized
crop (aspect ratio in [3/4, 4/3], bilinear resampling by `grid_sample`) with a horizontal flip (p 0.5) and
DINO's photometric changes in pixel space: colour jitter with p 0.8 (brightness 0.4, contrast 0.4,
saturation 0.2; hue is left out), grayscale p 0.2 (colour images only) and solarisation of the second
global crop (p 0.2). Gaussian blur is left out: DINO's sigma (0.1-2 px at 224 px) scaled to a 28 px image is
at most 0.25 px, a no-op. Any augmentation of the recipe (crop, flip, RandAugment) has already been applied
to the source image; for DINO the recipe's own crop is best `none` (the task's crops replace it).

Randomness comes from `generator` (default: torch's global CPU generator); the DINO task seeds its own per
optimiser step and micro-batch, and draws for the whole global batch when it is split across processes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MultiCrop:
    global_size: tuple[int, int]
    local_size: tuple[int, int]
    n_local: int = 6
    global_scale: tuple[float, float] = (0.4, 1.0)
    local_scale: tuple[float, float] = (0.05, 0.4)
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    grayscale_p: float = 0.2
    solarize_p: float = 0.2
    flip_p: float = 0.5
    photometric: bool = True

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None, *, total: int | None = None,
                 offset: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Images [B, C, H, W] (normalised) -> ([global 1, global 2], [local 1 .. N]), each [B, C, h, w].

        `total`, `offset`: the draws are made for `total` images and rows offset .. offset + B are used, so a
        batch split across processes gets the crops the whole batch would get in one process."""
        draw = _Draws(generator, total or len(x), offset, len(x))
        globals_ = [self.crop(x, self.global_size, self.global_scale, draw, solarize=(i == 1)) for i in range(2)]
        if not self.n_local:
            return globals_, []
        boxes = torch.cat([draw.boxes(*x.shape[-2:], self.local_scale) for _ in range(self.n_local)])
        flips = torch.cat([draw.flip(self.flip_p) for _ in range(self.n_local)])
        rep = x.repeat(self.n_local, 1, 1, 1)  # all local crops in one call: [N*B, C, H, W]
        out = resized_crop(rep, boxes.to(x.device), self.local_size, flips.to(x.device))
        if self.photometric:
            out = torch.cat([self._photometric(c, draw, False) for c in out.chunk(self.n_local)])
        return globals_, list(out.chunk(self.n_local))

    def crop(self, x: torch.Tensor, size: tuple[int, int], scale: tuple[float, float], draw: _Draws,
             solarize: bool = False) -> torch.Tensor:
        out = resized_crop(x, draw.boxes(*x.shape[-2:], scale).to(x.device), size, draw.flip(self.flip_p).to(x.device))
        return self._photometric(out, draw, solarize) if self.photometric else out

    def _photometric(self, x: torch.Tensor, draws: _Draws, solarize: bool) -> torch.Tensor:
        B, C = x.shape[:2]
        mean = torch.tensor(self.mean, device=x.device, dtype=x.dtype).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=x.device, dtype=x.dtype).view(1, -1, 1, 1)
        p = (x * std + mean).clamp(0, 1)  # pixels in [0, 1]

        def draw(lo: float, hi: float) -> torch.Tensor:
            return (lo + (hi - lo) * draws.uniform()).view(B, 1, 1, 1).to(x.device, x.dtype)

        def gray(t: torch.Tensor) -> torch.Tensor:
            if t.shape[1] == 3:
                w = torch.tensor([0.299, 0.587, 0.114], device=t.device, dtype=t.dtype).view(1, 3, 1, 1)
                return (t * w).sum(1, keepdim=True)
            return t.mean(1, keepdim=True)

        on = draw(0, 1) < self.jitter_p
        b = draw(1 - self.brightness, 1 + self.brightness)
        c = draw(1 - self.contrast, 1 + self.contrast)
        s = draw(1 - self.saturation, 1 + self.saturation)
        j = (p * b).clamp(0, 1)
        m = gray(j).mean(dim=(2, 3), keepdim=True)
        j = ((j - m) * c + m).clamp(0, 1)
        if C == 3:
            g = gray(j)
            j = ((j - g) * s + g).clamp(0, 1)
            p = torch.where(on, j, p)
            p = torch.where(draw(0, 1) < self.grayscale_p, gray(p).expand_as(p), p)
        else:
            p = torch.where(on, j, p)
        if solarize:
            p = torch.where((draw(0, 1) < self.solarize_p) & (p >= 0.5), 1 - p, p)
        return (p - mean) / std


class _Draws:
    """Random numbers for `total` images of which rows offset .. offset + n are used."""

    def __init__(self, generator: torch.Generator | None, total: int, offset: int, n: int):
        self.g, self.total, self.rows = generator, total, slice(offset, offset + n)

    def uniform(self) -> torch.Tensor:
        return torch.rand(self.total, generator=self.g)[self.rows]

    def flip(self, p: float) -> torch.Tensor:
        return (self.uniform() < p).float() * -2 + 1

    def boxes(self, h: int, w: int, scale: tuple[float, float]) -> torch.Tensor:
        return random_boxes(self.total, h, w, scale, generator=self.g)[self.rows]


def random_boxes(n: int, h: int, w: int, scale: tuple[float, float], ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 generator: torch.Generator | None = None, attempts: int = 10) -> torch.Tensor:
    """RandomResizedCrop's boxes for n images of h x w, vectorised: area fraction uniform in `scale`, log aspect
    ratio uniform in `ratio`, up to `attempts` draws until the box fits, else the whole image. Returns [n, 4]:
    centre y, centre x, height, width (pixels, not rounded)."""
    area = h * w
    out = torch.empty(n, 4)
    todo = torch.ones(n, dtype=torch.bool)
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(attempts):
        a = area * (scale[0] + (scale[1] - scale[0]) * torch.rand(n, generator=generator))
        r = torch.exp(log_r[0] + (log_r[1] - log_r[0]) * torch.rand(n, generator=generator))
        bw, bh = torch.sqrt(a * r), torch.sqrt(a / r)
        u, v = torch.rand(n, generator=generator), torch.rand(n, generator=generator)
        ok = todo & (bw <= w) & (bh <= h)
        cy, cx = bh / 2 + u * (h - bh), bw / 2 + v * (w - bw)
        out[ok] = torch.stack([cy, cx, bh, bw], dim=1)[ok]
        todo &= ~ok
        if not todo.any():
            break
    out[todo] = torch.tensor([h / 2, w / 2, float(h), float(w)])
    return out


def resized_crop(x: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int],
                 flip: torch.Tensor | None = None) -> torch.Tensor:
    """Crop each image [B, C, H, W] to its box (centre y, centre x, h, w in pixels) and resize to `size`
    (bilinear); `flip` [B] of +1 / -1 mirrors horizontally."""
    B, _, H, W = x.shape
    cy, cx, bh, bw = boxes.to(x.dtype).unbind(1)
    sx = bw / W * (flip.to(x.dtype) if flip is not None else 1)
    theta = torch.zeros(B, 2, 3, device=x.device, dtype=x.dtype)
    theta[:, 0, 0], theta[:, 0, 2] = sx, 2 * cx / W - 1
    theta[:, 1, 1], theta[:, 1, 2] = bh / H, 2 * cy / H - 1
    grid = F.affine_grid(theta, [B, x.shape[1], *size], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
