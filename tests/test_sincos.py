"""The fixed 2D sin-cos table against transcriptions of the two reference implementations.

- MAE, util/pos_embed.py (facebookresearch/mae): `get_2d_sincos_pos_embed` builds
  `grid = np.meshgrid(grid_w, grid_h)` ("here w goes first") and feeds `grid[0]`, the column, to the
  first half of the channels. Frequencies: omega = 1 / 10000 ** (arange(D/4) / (D/4)).
  MAE only takes a square `grid_size`; the transcription below takes (h, w) and is otherwise line by line.
- big_vision, big_vision/models/vit.py: `posemb_sincos_2d(h, w, width)` uses `y, x = mgrid[:h, :w]` and
  concatenates [sin x, cos x, sin y, cos y], the same channel order as MAE, but its frequencies are
  omega = 1 / 10000 ** (arange(D/4) / (D/4 - 1)): the last frequency is exactly 1/10000, where MAE's stops
  one step short. So big_vision's table is vitkit's with temperature 10000 ** (q / (q - 1)), q = D/4.
Both are transcribed in numpy, in float32 as the originals compute.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vitkit.layers import sincos_2d_pos_embed


# ------------------------------------------------------------------ MAE, util/pos_embed.py (transcribed)
def _mae_1d(embed_dim, pos):
    omega = np.arange(embed_dim // 2, dtype=np.float32)
    omega /= embed_dim / 2.0
    omega = 1.0 / 10000**omega  # (D/2,)
    pos = pos.reshape(-1)  # (M,)
    out = np.einsum("m,d->md", pos, omega)  # (M, D/2), outer product
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)  # (M, D)


def _mae_2d_from_grid(embed_dim, grid):
    emb_h = _mae_1d(embed_dim // 2, grid[0])  # (H*W, D/2); grid[0] is the column index
    emb_w = _mae_1d(embed_dim // 2, grid[1])  # (H*W, D/2)
    return np.concatenate([emb_h, emb_w], axis=1)  # (H*W, D)


def mae_get_2d_sincos_pos_embed(embed_dim, grid_hw):
    gh, gw = grid_hw
    grid_h = np.arange(gh, dtype=np.float32)
    grid_w = np.arange(gw, dtype=np.float32)
    grid = np.meshgrid(grid_w, grid_h)  # here w goes first
    grid = np.stack(grid, axis=0)
    grid = grid.reshape([2, 1, gh, gw])
    return _mae_2d_from_grid(embed_dim, grid)


# ------------------------------------------------------------------ big_vision, models/vit.py (transcribed)
def big_vision_posemb_sincos_2d(h, w, width, temperature=10_000.0):
    y, x = np.mgrid[:h, :w]
    assert width % 4 == 0
    omega = np.arange(width // 4, dtype=np.float32) / (width // 4 - 1)
    omega = (1.0 / (temperature**omega)).astype(np.float32)
    y = np.einsum("m,d->md", y.flatten().astype(np.float32), omega)
    x = np.einsum("m,d->md", x.flatten().astype(np.float32), omega)
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)  # big_vision adds [None]


GRIDS = [(3, 5), (5, 3), (4, 4), (2, 7)]


@pytest.mark.parametrize("dim", [16, 64])
@pytest.mark.parametrize("grid", GRIDS)
def test_equals_mae_table(dim, grid):
    ours = sincos_2d_pos_embed(dim, grid).numpy()
    ref = mae_get_2d_sincos_pos_embed(dim, grid)
    assert ours.shape == ref.shape == (grid[0] * grid[1], dim)
    np.testing.assert_allclose(ours, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dim", [16, 64])
@pytest.mark.parametrize("grid", GRIDS)
def test_equals_big_vision_table_with_its_frequency_spacing(dim, grid):
    q = dim // 4
    ours = sincos_2d_pos_embed(dim, grid, temperature=10000.0 ** (q / (q - 1))).numpy()
    ref = big_vision_posemb_sincos_2d(*grid, dim)
    np.testing.assert_allclose(ours, ref, atol=1e-6, rtol=0)
    # and with the same temperature the two differ only in frequencies, not in layout:
    # the first half depends on the column only, the second on the row only, in both
    for table in (sincos_2d_pos_embed(dim, grid).numpy(), ref):
        t = table.reshape(grid[0], grid[1], dim)
        np.testing.assert_array_equal(t[:, :, : dim // 2], np.broadcast_to(t[:1, :, : dim // 2], t[:, :, : dim // 2].shape))
        np.testing.assert_array_equal(t[:, :, dim // 2:], np.broadcast_to(t[:, :1, dim // 2:], t[:, :, dim // 2:].shape))


def test_legacy_row_first_table_is_the_halves_swapped():
    """`w_first=False`: the table vitkit generated before, kept for models trained with it."""
    new = sincos_2d_pos_embed(16, (3, 5))
    old = sincos_2d_pos_embed(16, (3, 5), w_first=False)
    assert not torch.equal(new, old)
    torch.testing.assert_close(old, torch.cat([new[:, 8:], new[:, :8]], dim=1), atol=0, rtol=0)
    rows = old[:, :8].reshape(3, 5, 8)  # the legacy first half encodes the row
    assert torch.equal(rows, rows[:, :1].expand(-1, 5, -1))


def test_sincos_model_generates_mae_table():
    """A `pos_embed="sincos"` model built at a non-square grid holds MAE's table (prefix row zero)."""
    from vitkit import VisionTransformer, ViTConfig

    m = VisionTransformer(ViTConfig(embed_dim=64, depth=1, num_heads=4, img_size=(24, 40), patch_size=8,
                                    num_classes=0, pos_embed="sincos"))
    pe = m.pos_embed.detach()[0]
    assert torch.all(pe[0] == 0)
    np.testing.assert_allclose(pe[1:].numpy(), mae_get_2d_sincos_pos_embed(64, (3, 5)), atol=1e-6, rtol=0)


def test_width_not_divisible_by_four():
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d_pos_embed(10, (2, 2))
