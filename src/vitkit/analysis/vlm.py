"""What an image costs a language model, in tokens, for any registered patch encoder (`vitkit cost MODEL --vlm`).

A vision-language model feeds the encoder's patch tokens (the class token dropped) through a projector into
the LLM, so the image's price is counted in the LLM's context, not in encoder MACs. How the projectors count:

- one token per patch: LLaVA-1.5's MLP projector (CLIP ViT-L/14 at 336 px: 24 x 24 = 576 tokens);
- a 2x2 merge: Qwen2-VL's merger concatenates each 2x2 block of patches into one token (4D wide), as LLaVA-style
  2x2 pooling does: ceil(gh / 2) x ceil(gw / 2) tokens;
- pixel shuffle 0.5: InternVL folds each 2x2 block into the channels (InternViT-300M/14 at 448 px: 1024 patches
  -> 256 tokens per tile); the same count as a 2x2 merge;
- dynamic tiling: InternVL cuts the image into tiles of the encoder's size on the grid (rows x cols, at most
  `max_tiles`) whose aspect ratio is nearest the image's, plus a thumbnail of the whole image when there is
  more than one tile; each tile costs its pixel-shuffled tokens;
- anyres: LLaVA-NeXT picks the best of its grid resolutions (1x2, 2x1, 2x2, 3x1, 1x3 tiles of the encoder's
  size) for the image and adds the base image resized to one tile: (tiles + 1) x patch tokens, at most
  5 x 576 = 2,880 for ViT-L/14 at 336 (the newline and unpadding tokens it adds are not counted).

Checked against the published figures in tests/test_vlm_tokens.py.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import ConfigError

# LLaVA-NeXT's image_grid_pinpoints in tiles, (width, height) in its order ([336, 672], [672, 336], ... at 336 px)
ANYRES_PINPOINTS = ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))


@dataclass(frozen=True)
class VlmRow:
    scheme: str
    example: str  # the model family that counts this way
    tiles: int  # encoder passes (tiles, thumbnail or base image included)
    tokens_per_tile: int
    tokens: int  # what the LLM sees
    token_width: int  # channels per token before the projector (a 2x2 merge concatenates 4 patches)


def merged(grid: tuple[int, int], factor: int) -> int:
    """Tokens after merging each factor x factor block of a [gh, gw] patch grid (edge blocks padded)."""
    return math.ceil(grid[0] / factor) * math.ceil(grid[1] / factor)


def internvl_tiles(image_hw: tuple[int, int], tile: int, max_tiles: int, min_tiles: int = 1) -> tuple[int, int]:
    """InternVL's dynamic tiling grid (rows, cols), as its `dynamic_preprocess` chooses it: among cols x rows
    with min_tiles <= cols * rows <= max_tiles (ordered by their product), the aspect ratio cols / rows nearest
    the image's width / height; on a tie, the later grid when the image has more than half its pixels."""
    h, w = image_hw
    if max_tiles < min_tiles or min_tiles < 1:
        raise ConfigError(f"max tiles must be >= {max(min_tiles, 1)}, got {max_tiles}")
    grids = sorted({(c, r) for n in range(min_tiles, max_tiles + 1) for c in range(1, n + 1) for r in range(1, n + 1)
                    if min_tiles <= c * r <= max_tiles}, key=lambda cr: cr[0] * cr[1])
    best, best_diff = (1, 1), math.inf
    for c, r in grids:
        diff = abs(w / h - c / r)
        if diff < best_diff:
            best, best_diff = (c, r), diff
        elif diff == best_diff and w * h > 0.5 * tile * tile * c * r:
            best = (c, r)
    return best[1], best[0]


def anyres_tiles(image_hw: tuple[int, int], tile: int) -> tuple[int, int]:
    """LLaVA-NeXT's `select_best_resolution` over ANYRES_PINPOINTS -> (rows, cols): the grid whose resolution
    keeps the most of the image's pixels after a fit-inside resize, then the one wasting the least area."""
    h, w = image_hw
    best, best_key = (1, 1), None
    for c, r in ANYRES_PINPOINTS:
        H, W = r * tile, c * tile
        scale = min(W / w, H / h)
        kept = min(int(w * scale) * int(h * scale), w * h)
        key = (kept, -(W * H - kept))
        if best_key is None or key > best_key:
            best, best_key = (r, c), key
    return best


def vlm_tokens(grid: tuple[int, int], width: int, tile: tuple[int, int], image_hw: tuple[int, int] | None = None,
               max_tiles: int = 12) -> list[VlmRow]:
    """The image's token count under each scheme, for an encoder with a [gh, gw] patch grid of `width`-wide
    tokens at its input size `tile` (h, w); `image_hw`: the image the tiling schemes cut (default: one tile)."""
    image_hw = image_hw or tile
    if min(image_hw) < 1:
        raise ConfigError(f"the image size must be positive, got {image_hw}")
    patches, shuffled = grid[0] * grid[1], merged(grid, 2)
    rows, cols = internvl_tiles(image_hw, tile[0], max_tiles)
    n = rows * cols + (1 if rows * cols > 1 else 0)  # + the thumbnail
    ar, ac = anyres_tiles(image_hw, tile[0])
    return [
        VlmRow("one token per patch", "LLaVA-1.5 (MLP projector)", 1, patches, patches, width),
        VlmRow("2x2 merge", "Qwen2-VL merger, 2x2 pooling", 1, shuffled, shuffled, 4 * width),
        VlmRow("pixel shuffle 0.5", "InternVL", 1, shuffled, shuffled, 4 * width),
        VlmRow(f"dynamic tiling ({rows}x{cols} tiles{' + thumbnail' if n > 1 else ''}, max {max_tiles})",
               "InternVL 1.5/2", n, shuffled, n * shuffled, 4 * width),
        VlmRow(f"anyres ({ar}x{ac} tiles + base image)", "LLaVA-NeXT", ar * ac + 1, patches,
               (ar * ac + 1) * patches, width),
    ]


def vlm_report(model: str, img_size=None, image_hw: tuple[int, int] | None = None, max_tiles: int = 12) -> dict:
    """`vitkit cost MODEL --vlm`: the encoder's grid and the token count of each scheme."""
    from .cost import model_cost

    r = model_cost(model, img_size=img_size)
    if not hasattr(r, "grid"):
        raise ConfigError(f"{model}: --vlm counts patch tokens; this family ({getattr(r, 'family', '?')}) has none")
    rows = vlm_tokens(tuple(r.grid), r.width, tuple(r.img_size), image_hw, max_tiles)
    return {"model": r.name, "img_size": list(r.img_size), "patch_size": r.patch_size, "grid": list(r.grid),
            "image_size": list(image_hw or r.img_size), "schemes": [asdict(row) for row in rows]}
