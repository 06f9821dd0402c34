"""The analysis figures, as PNG files (nothing is shown on screen).

Drawn with matplotlib's object API (a `Figure` on its own Agg canvas), never pyplot: the process's
backend, and any figures a notebook or script has open, are left alone.

Figures are saved at DPI 100 without tight bounding boxes, so a figure of W x H inches is exactly
100W x 100H pixels. Every figure carries a title saying which model and which sample it came from.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

DPI = 100


def _figure(figsize: tuple[float, float], layout: str = "constrained"):
    """A Figure on its own Agg canvas, outside pyplot's figure manager."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def model_label(model, checkpoint) -> str:
    """'file.safetensors (arch)' for figure titles: the file is what the user has, the arch what it is."""
    arch = (getattr(model, "provenance", None) or {}).get("arch")
    name = Path(str(checkpoint)).name
    return f"{name} ({arch})" if arch and arch not in name else name


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def _unit(a: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1] for display (a constant map becomes all zeros)."""
    a = np.asarray(a, dtype=np.float64)
    lo, hi = np.nanmin(a), np.nanmax(a)
    return (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)


def display_image(image) -> np.ndarray:
    """PIL image, uint8 array [H, W(, C)] or tensor [C, H, W] in [0, 1] -> float array for imshow."""
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu().float().numpy()
        image = image.transpose(1, 2, 0) if image.ndim == 3 else image
    a = np.asarray(image)
    a = a.astype(np.float64) / 255.0 if a.dtype == np.uint8 else a.astype(np.float64)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    return np.clip(a, 0.0, 1.0)


def upsample(amap: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """[Gh, Gw] map -> [H, W] (bilinear) as a numpy array."""
    m = torch.as_tensor(amap).detach().cpu().float()[None, None]
    return F.interpolate(m, size=size, mode="bilinear", align_corners=False)[0, 0].numpy()


HEAT_LABEL = "attention (min-max scaled per map)"


def _show_overlay(ax, img: np.ndarray, amap, alpha: float = 0.5):
    """The image with the min-max scaled map over it in 'jet'; returns the map's image artist (for a
    colour bar)."""
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1)
    heat = ax.imshow(_unit(upsample(amap, img.shape[:2])), cmap="jet", alpha=alpha, vmin=0, vmax=1)
    ax.set_axis_off()
    return heat


def _heat_colorbar(fig, heat, ax, **kw):
    """An opaque colour bar for an overlay: 0 = the map's minimum, 1 = its maximum."""
    from matplotlib.cm import ScalarMappable

    bar = fig.colorbar(ScalarMappable(norm=heat.norm, cmap=heat.cmap), ax=ax, **kw)
    bar.set_label(HEAT_LABEL, fontsize=8)
    bar.ax.tick_params(labelsize=7)
    return bar


def overlay_figure(image, amap, path, title: str, caption: str = "") -> Path:
    """Input image and the heat map over it, side by side, with a colour bar for the map: 8 x 4.5 inches
    (800 x 450 px)."""
    img = display_image(image)
    fig = _figure((8, 4.5))
    a0, a1 = fig.subplots(1, 2)
    a0.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1)
    a0.set_axis_off()
    a0.set_title("input", fontsize=9)
    heat = _show_overlay(a1, img, amap)
    a1.set_title(caption, fontsize=9)
    _heat_colorbar(fig, heat, a1, fraction=0.046, pad=0.03)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def _tile_grid(n: int, cols: int, inches: float, title_inches: float):
    """A rows x cols grid of square tiles for n images, plus room for the title: (figure, axes)."""
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    fig = _figure((inches * cols, inches * rows + title_inches))
    return fig, fig.subplots(rows, cols, squeeze=False)


def head_grid_figure(image, head_maps, path, title: str, cols: int = 4) -> Path:
    """One overlay per head ([H, Gh, Gw]) and a shared colour bar; 2.5 inches per column, 2.5 per row plus
    0.6 for the titles."""
    img = display_image(image)
    n = len(head_maps)
    fig, axes = _tile_grid(n, cols, inches=2.5, title_inches=0.6)
    heat = None
    for i, ax in enumerate(axes.flat):
        if i < n:
            heat = _show_overlay(ax, img, head_maps[i], alpha=0.6)
            ax.set_title(f"head {i}", fontsize=8)
        else:
            ax.set_axis_off()
    if heat is not None:  # one bar for the grid: each head's map is scaled to its own min..max
        _heat_colorbar(fig, heat, axes, fraction=0.02, pad=0.01)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def distance_figure(distances, path, title: str, patch_size: int | None = None,
                    image_extent: float | None = None) -> Path:
    """Mean attention distance [L, H]: one dot per head at its layer (7 x 4.5 inches)."""
    d = np.asarray(torch.as_tensor(distances).cpu())
    L, H = d.shape
    fig = _figure((7, 4.5))
    ax = fig.subplots()
    layers = np.repeat(np.arange(1, L + 1), H)
    ax.scatter(layers, d.reshape(-1), s=22, alpha=0.8)
    if image_extent:
        ax.axhline(image_extent, color="gray", lw=0.8, ls="--", label="image side")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(range(1, L + 1))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def pos_similarity_figure(similarity, path, title: str) -> Path:
    """Grid of grids ([Gh, Gw, Gh, Gw]): tile (r, c) shows the cosine similarity of patch (r, c)'s
    position embedding with every patch's. One image with 1-pixel gaps (7 x 6.5 inches)."""
    s = np.asarray(torch.as_tensor(similarity).cpu(), dtype=np.float64)
    gh, gw = s.shape[:2]
    canvas = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
    for r in range(gh):
        for c in range(gw):
            canvas[r * (gh + 1): r * (gh + 1) + gh, c * (gw + 1): c * (gw + 1) + gw] = s[r, c]
    fig = _figure((7, 6.5))
    ax = fig.subplots()
    im = ax.imshow(canvas, cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([(gw + 1) * c + gw / 2 - 0.5 for c in range(gw)], [str(c + 1) for c in range(gw)], fontsize=6)
    ax.set_yticks([(gh + 1) * r + gh / 2 - 0.5 for r in range(gh)], [str(r + 1) for r in range(gh)], fontsize=6)
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    fig.colorbar(im, ax=ax, fraction=0.046, label="cosine similarity")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def filter_components_figure(components, explained, path, title: str, cols: int = 7) -> Path:
    """Principal components [k, C, Ph, Pw] of the patch filters, each min-max normalised for display;
    1.2 inches per tile plus 0.8 for the title."""
    comps = np.asarray(torch.as_tensor(components).cpu(), dtype=np.float64)
    k = len(comps)
    fig, axes = _tile_grid(k, cols, inches=1.2, title_inches=0.8)
    for i, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if i >= k:
            continue
        c = comps[i]
        tile = c.transpose(1, 2, 0) if c.shape[0] == 3 else c.mean(axis=0)  # RGB, else gray
        ax.imshow(_unit(tile), cmap=None if tile.ndim == 3 else "gray", interpolation="nearest")
        ax.set_title(f"{i + 1} ({100 * float(explained[i]):.0f}%)", fontsize=6)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)
