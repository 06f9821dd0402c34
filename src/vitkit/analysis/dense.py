"""Looking at dense patch features, for every family with the feature contract (`vitkit explain --method pca`,
`--method match`).

PCA map (DINOv2's recipe, its README and paper figure 1): the last feature map's patch vectors are projected
on their principal components; the first component separates object from background (patches on the side of
its threshold where the image's border patches are not are kept), then the first three components of the
kept patches, each scaled to [0, 1], are drawn as RGB. Larger inputs give finer maps (more patches).

Matching: the patches of two images whose features are mutual nearest neighbours by cosine similarity (each is
the other's best match), strongest first: what DINOv2's "dense matching" figure draws.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError


def feature_map(model, x: torch.Tensor) -> torch.Tensor:
    """The last feature map [B, D, h, w] of images x [B, C, H, W], through the feature contract (normalised
    where the family has a final norm)."""
    if not callable(getattr(model, "forward_intermediates", None)):
        raise ConfigError(f"{type(model).__name__} has no feature maps (no forward_intermediates)")
    with torch.no_grad():
        maps = model.forward_intermediates(x, indices=1, norm=True, output_fmt="NCHW", intermediates_only=True)
    return maps[-1].float()


def _components(v: torch.Tensor, k: int) -> torch.Tensor:
    """v [N, D] -> the projections [N, k] of the centred rows on their first k principal components, each sign
    fixed so that its largest-magnitude projection is positive (a deterministic picture)."""
    v = v - v.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(v, full_matrices=False)  # rows of vh: components, by explained variance
    p = v @ vh[:k].T  # [N, k]
    flip = torch.sign(p.gather(0, p.abs().argmax(0, keepdim=True)))  # [1, k]
    return p * torch.where(flip == 0, torch.ones_like(flip), flip)


def pca_rgb(fmap: torch.Tensor, remove_background: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """fmap [D, h, w] -> (RGB [h, w, 3] in [0, 1], foreground mask [h, w]): see the module docstring."""
    d, h, w = fmap.shape
    if h * w < 4:
        raise ConfigError(f"a PCA map needs at least 4 patches, got a {h}x{w} grid: use a larger --img-size")
    v = fmap.reshape(d, h * w).T  # [N, D]
    keep = torch.ones(h * w, dtype=torch.bool)
    if remove_background:
        first = _components(v, 1)[:, 0].reshape(h, w)
        border = torch.cat([first[0], first[-1], first[:, 0], first[:, -1]])
        fg = first > 0 if (border > 0).float().mean() < 0.5 else first <= 0  # the side the border is not on
        if 0 < fg.sum() < h * w - 1:
            keep = fg.flatten()
    comps = _components(v[keep], min(3, int(keep.sum()) - 1, d))
    lo, hi = comps.min(0).values, comps.max(0).values
    rgb = torch.zeros(h * w, 3)
    rgb[keep, : comps.shape[1]] = (comps - lo) / (hi - lo).clamp(min=1e-8)
    return rgb.reshape(h, w, 3), keep.reshape(h, w)


def mutual_matches(map_a: torch.Tensor, map_b: torch.Tensor, top: int = 20) -> list[dict[str, Any]]:
    """Mutual nearest-neighbour patches between feature maps [D, ha, wa] and [D, hb, wb] by cosine similarity,
    strongest first (at most `top`): [{"a": (row, col), "b": (row, col), "similarity": s}, ...]."""
    fa = torch.nn.functional.normalize(map_a.flatten(1).T, dim=1)  # [Na, D]
    fb = torch.nn.functional.normalize(map_b.flatten(1).T, dim=1)  # [Nb, D]
    sim = fa @ fb.T  # [Na, Nb]
    best_b, best_a = sim.argmax(1), sim.argmax(0)
    mutual = [i for i in range(len(fa)) if best_a[best_b[i]] == i]
    mutual.sort(key=lambda i: -float(sim[i, best_b[i]]))
    wa, wb = map_a.shape[-1], map_b.shape[-1]
    return [{"a": (i // wa, i % wa), "b": (int(best_b[i]) // wb, int(best_b[i]) % wb),
             "similarity": round(float(sim[i, best_b[i]]), 4)} for i in mutual[:top]]


def _display(raw: torch.Tensor):
    img = raw.permute(1, 2, 0).numpy()  # [H, W, C] in [0, 1]
    return (img[..., 0], "gray") if img.shape[-1] == 1 else (img, None)


def explain_pca(model, image, out: str | os.PathLike, size=None, label: str | None = None) -> dict[str, Any]:
    """The image and its PCA map side by side (PNG at `out`)."""
    from matplotlib.figure import Figure

    from .inputs import load_image, prepare

    name = str(image) if isinstance(image, (str, os.PathLike)) else "image"
    if isinstance(image, (str, os.PathLike)):
        image = load_image(image, model.cfg.in_chans)
    x, raw = prepare(model, image, (size, size) if isinstance(size, int) else size)
    fmap = feature_map(model, x)[0]
    rgb, fg = pca_rgb(fmap)
    fig = Figure(figsize=(7, 3.6))
    left, right = fig.subplots(1, 2)
    pixels, cmap = _display(raw)
    left.imshow(pixels, cmap=cmap)
    right.imshow(rgb.numpy(), interpolation="nearest")
    left.set_title(Path(name).name, fontsize=9)
    right.set_title(f"PCA of {fmap.shape[1]}x{fmap.shape[2]} patch features", fontsize=9)
    fig.suptitle(label or type(model).__name__, fontsize=8)
    for ax in (left, right):
        ax.set_axis_off()
    fig.tight_layout()
    out = Path(out)
    from .._files import save_figure

    save_figure(fig, out, dpi=110)
    return {"image": name, "out": str(out), "grid": list(fmap.shape[1:]), "foreground_patches": int(fg.sum()),
            "input_size": list(x.shape[-2:])}


def explain_match(model, image_a, image_b, out: str | os.PathLike, size=None, top: int = 20) -> dict[str, Any]:
    """Two images side by side with lines between their `top` mutual best-matching patches (PNG at `out`)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import ConnectionPatch

    from .inputs import load_image, prepare

    size = (size, size) if isinstance(size, int) else size
    xs, raws, names = [], [], []
    for image in (image_a, image_b):
        names.append(str(image))
        x, raw = prepare(model, load_image(image, model.cfg.in_chans), size)
        xs.append(x)
        raws.append(raw)
    maps = [feature_map(model, x)[0] for x in xs]
    pairs = mutual_matches(maps[0], maps[1], top)
    fig = Figure(figsize=(8, 4))
    axes = fig.subplots(1, 2)
    for ax, raw, name in zip(axes, raws, names):
        pixels, cmap = _display(raw)
        ax.imshow(pixels, cmap=cmap)
        ax.set_title(Path(name).name, fontsize=9)
        ax.set_axis_off()

    def centre(rc, fmap, raw):  # patch (row, col) -> pixel (x, y) of its centre
        sh, sw = raw.shape[1] / fmap.shape[1], raw.shape[2] / fmap.shape[2]
        return (rc[1] + 0.5) * sw, (rc[0] + 0.5) * sh

    for p in pairs:
        fig.add_artist(ConnectionPatch(centre(p["a"], maps[0], raws[0]), centre(p["b"], maps[1], raws[1]),
                                       "data", "data", axesA=axes[0], axesB=axes[1], color="yellow", lw=0.8))
    fig.tight_layout()
    from .._files import save_figure

    out = Path(out)
    save_figure(fig, out, dpi=110)
    return {"images": names, "out": str(out), "matches": pairs}
