"""Dense probes on frozen patch features, for every family with the feature contract: `vitkit eval --protocol
seg-linear | seg-knn` on a segmentation set (canvas-digits, canvas-fashion), reported as mIoU.

Features: the last feature map of the contract (analysis.dense.feature_map: `forward_intermediates`, after the
final norm where the family has one: a ViT's last-block patch tokens, a Swin's or a ResNet's last stage) of
the eval transform, computed once per split, [N, D, h, w]. Masks follow the eval geometry the segment task
evaluates with (nearest), [N, H, W] at the model's input size; mIoU (background included), `miou_fg` (without
it) and pixel accuracy are the segment task's (`iou_metrics` of the pixel confusion matrix), at that size.

- seg-linear, DINOv2's linear head (its one-layer BNHead): BatchNorm and a 1x1 convolution on the patch
  tokens (vitkit.probe.LinearProbe applied to every patch is exactly that), its logits upsampled bilinearly
  to the mask size and trained by per-pixel cross-entropy on the train split's masks: the logits go up to
  the pixels, the masks are never pooled down to the patch grid. AdamW, lr 1e-3, weight decay 1e-4, decayed
  linearly to 0 (DINOv2's linear configs: mmseg's poly schedule of power 1), on the cached features (no
  augmentation); the initialisation and the order follow the probe seed alone.
- seg-knn, label transfer: every train patch is a bank row labelled with the majority pixel label of its
  cell; each eval patch takes the votes of its k most similar bank patches by cosine similarity of the
  L2-normalised tokens, weighted exp(sim / T) (vitkit.probe.knn_scores: DINO's k-NN); the votes, as shares
  per patch, are upsampled bilinearly to the mask size and the largest wins at each pixel.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, DataError
from ..probe import KNN_K, KNN_T, LinearProbe, fit_minibatches, knn_scores

# the segment task and the dense-feature tools are imported where used: `vitkit eval` reads DENSE_PROTOCOLS
# to parse --protocol, and pays for them only when it runs a dense probe

DENSE_PROTOCOLS = ("seg-linear", "seg-knn")
SEG_LR, SEG_WEIGHT_DECAY, SEG_BATCH = 1e-3, 1e-4, 32  # canvases per step of the linear head
SIMILARITY_BUDGET = 1 << 24  # similarities [queries, bank] per block of the k-NN search (64 MiB of float32)


@torch.no_grad()
def extract_patch_features(model: nn.Module, loader) -> tuple[torch.Tensor, torch.Tensor]:
    """(feature maps [N, D, h, w] float32, masks [N, H, W] int64 in the eval geometry at the model's input size)
    of every (images, masks) batch the loader yields (data.datasets.eval_loader), on the CPU."""
    from ..analysis.dense import feature_map
    from .tasks.segment import SegmentTask

    was = model.training
    model.eval()
    maps, masks = [], []
    try:
        for x, m in loader:
            maps.append(feature_map(model, x).cpu())
            masks.append(SegmentTask._eval_masks(m, model.preprocess))  # the segment task's own mask geometry
    finally:
        model.train(was)
    return torch.cat(maps), torch.cat(masks)


def patch_labels(masks: torch.Tensor, grid: tuple[int, int], num_classes: int, chunk: int = 256) -> torch.Tensor:
    """masks [N, H, W] -> the majority pixel label of each cell of the h x w patch grid [N, h, w] (a tie: the
    lower class). Cells are adaptive pooling's: exact blocks when the grid divides the mask."""
    out = []
    for i in range(0, len(masks), chunk):  # one-hot masks are K times the masks: a block at a time
        one_hot = F.one_hot(masks[i:i + chunk], num_classes).permute(0, 3, 1, 2).float()  # [n, K, H, W]
        share = F.adaptive_avg_pool2d(one_hot, grid)  # [n, K, h, w]: each class's share of the cell's pixels
        out.append(share.argmax(1))  # the first maximum: the lower class on a tie
    return torch.cat(out)


def _rows(maps: torch.Tensor) -> torch.Tensor:
    """[N, D, h, w] -> [N * h * w, D], one row per patch (image-major, then row, then column)."""
    return maps.permute(0, 2, 3, 1).reshape(-1, maps.shape[1])


def _pixel_logits(probe: LinearProbe, maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """The linear head's logits [B, K, H, W] of maps [B, D, h, w], upsampled bilinearly to `size`."""
    b, _, h, w = maps.shape
    logits = probe(_rows(maps)).reshape(b, h, w, -1).permute(0, 3, 1, 2)  # [B, K, h, w]: a 1x1 convolution
    return F.interpolate(logits, size=size, mode="bilinear", align_corners=False)


def _scored(pred: torch.Tensor, masks: torch.Tensor, num_classes: int) -> dict[str, Any]:
    """The segment task's metrics of predictions [M, H, W] against masks [M, H, W], with the predictions."""
    from .tasks.segment import confusion_matrix, iou_metrics

    return iou_metrics(confusion_matrix(pred, masks, num_classes)) | {"pred": pred}


def seg_linear_probe(train_x: torch.Tensor, train_masks: torch.Tensor, test_x: torch.Tensor, test_masks: torch.Tensor,
                     num_classes: int, *, epochs: int = 90, batch_size: int = SEG_BATCH, lr: float = SEG_LR,
                     weight_decay: float = SEG_WEIGHT_DECAY, seed: int = 0) -> dict[str, Any]:
    """Train the linear head on maps train_x [N, D, h, w] against masks [N, H, W], predict test_x: the segment
    task's metrics with "pred" [M, H, W], "train_loss", "epochs", "lr", "seed" (see the module docstring)."""
    n, d, h, w = train_x.shape
    if n * h * w < 2:
        raise ConfigError(f"seg-linear needs at least two train patches for its BatchNorm, got {n} image(s) of "
                          f"{h}x{w}: raise --limit or the input size")
    size = tuple(train_masks.shape[-2:])
    g = torch.Generator().manual_seed(seed)
    probe = LinearProbe(d, num_classes, g)
    opt = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=weight_decay)
    loss = fit_minibatches(opt, n, batch_size, epochs, g, lambda it, total: lr * (1 - it / total),  # poly decay, power 1
                           lambda idx: F.cross_entropy(_pixel_logits(probe, train_x[idx], size), train_masks[idx]))
    probe.eval()
    with torch.no_grad():
        pred = torch.cat([_pixel_logits(probe, test_x[i:i + 256], size).argmax(1) for i in range(0, len(test_x), 256)])
    return _scored(pred, test_masks, num_classes) | {"train_loss": loss.item(), "epochs": epochs, "lr": lr,
                                                     "weight_decay": weight_decay, "seed": seed}


@torch.no_grad()
def seg_knn(train_x: torch.Tensor, train_masks: torch.Tensor, test_x: torch.Tensor, test_masks: torch.Tensor,
            num_classes: int, *, k: int = KNN_K, T: float = KNN_T, chunk: int | None = None) -> dict[str, Any]:
    """Label transfer from the k nearest train patches (see the module docstring): the segment task's metrics
    with "pred" [M, H, W], "k", "T", "bank_patches". `chunk`: query patches per similarity block (default:
    SIMILARITY_BUDGET similarities)."""
    n, d, h, w = train_x.shape
    if tuple(test_x.shape[-2:]) != (h, w):
        raise ConfigError(f"seg-knn compares patch grids of one size: train {h}x{w}, eval "
                          f"{test_x.shape[-2]}x{test_x.shape[-1]}")
    size = tuple(test_masks.shape[-2:])
    bank = F.normalize(_rows(train_x), dim=1)  # [N*h*w, D], cosine = dot product
    bank_labels = patch_labels(train_masks, (h, w), num_classes).flatten()  # [N*h*w], same order as the rows
    chunk = chunk or max(1, SIMILARITY_BUDGET // len(bank))
    images = max(1, chunk // (h * w))  # eval images whose patches are voted on together
    preds = []
    for i in range(0, len(test_x), images):
        queries = F.normalize(_rows(test_x[i:i + images]), dim=1)  # [m*h*w, D]
        votes = knn_scores(bank, bank_labels, queries, k, T, num_classes, normalize=False, chunk=chunk)  # [m*h*w, K]
        share = (votes / votes.sum(1, keepdim=True)).reshape(-1, h, w, num_classes).permute(0, 3, 1, 2)  # [m, K, h, w]
        preds.append(F.interpolate(share, size=size, mode="bilinear", align_corners=False).argmax(1))  # [m, H, W]
    return _scored(torch.cat(preds), test_masks, num_classes) | {"k": min(k, len(bank)), "T": T,
                                                                  "bank_patches": len(bank)}


def check_dense_data(data: str, protocols) -> None:
    """Refuse, in one line, data without per-pixel masks (a classification set, a detection set)."""
    from ..data.builtin import BUILTIN_SETS, DETECTION, SEGMENTATION, dataset_task

    task = dataset_task(data)
    if task == SEGMENTATION:
        return
    sets = ", ".join(name for name, entry in BUILTIN_SETS.items() if entry.task == SEGMENTATION)
    what = ("a detection dataset (boxes, not per-pixel masks)" if task == DETECTION
            else "a classification dataset (one label per image, no masks)")
    raise ConfigError(f"--protocol {','.join(protocols)} scores per-pixel masks and {data} is {what}: use a "
                      f"segmentation set ({sets})")


def dense_probe(model: nn.Module, train, queries, class_names: list[str], protocols=DENSE_PROTOCOLS, *,
                batch_size: int = 256, limit: int | None = None, k: int = KNN_K, T: float = KNN_T, epochs: int = 90,
                probe_seed: int = 0) -> dict[str, Any]:
    """The dense protocols of `model` with `train` (a split of (image, mask) items) as the probe's training set
    and the k-NN bank, scored on `queries`: the first `limit` images of each at most."""
    from ..data.datasets import eval_loader
    from ..models.protocol import require

    require(model, "intermediates", f"--protocol {','.join(protocols)}")
    train_x, train_m = extract_patch_features(model, eval_loader(train, model.preprocess, batch_size=batch_size,
                                                                 limit=limit))
    test_x, test_m = extract_patch_features(model, eval_loader(queries, model.preprocess, batch_size=batch_size,
                                                               limit=limit))
    K = len(class_names)
    out: dict[str, Any] = {"count": len(test_x), "bank_split": "train", "bank_count": len(train_x),
                           "bank_patches": int(train_x.shape[0] * train_x.shape[2] * train_x.shape[3]),
                           "feature_dim": int(train_x.shape[1]), "grid": list(train_x.shape[2:]),
                           "mask_size": list(test_m.shape[1:]), "class_names": list(class_names)}
    drop = ("pred", "bank_patches")
    if "seg-linear" in protocols:
        r = seg_linear_probe(train_x, train_m, test_x, test_m, K, epochs=epochs, seed=probe_seed)
        out["seg-linear"] = {key: v for key, v in r.items() if key not in drop}
    if "seg-knn" in protocols:
        r = seg_knn(train_x, train_m, test_x, test_m, K, k=k, T=T)
        out["seg-knn"] = {key: v for key, v in r.items() if key not in drop}
    return out


def dense_probe_on(model: nn.Module, data: str, protocols=DENSE_PROTOCOLS, *, split: str | None = None,
                   seed: int = 0, val_fraction: float = 0.0, strict: bool = False,
                   options: dict[str, Any] | None = None, **kw) -> dict[str, Any]:
    """`dense_probe` on a segmentation set by name: its train split against `split` (default test, else val).
    Returns {"data", "split", "count", "bank_count", "seg-linear": {...}, "seg-knn": {...}, ...}."""
    from ..data.datasets import load_eval_split
    from ..models.protocol import require

    check_dense_data(data, protocols)
    require(model, "intermediates", f"--protocol {','.join(protocols)}")  # before the data is read
    if split in ("train", "all"):
        raise DataError("dense probes score the test or val split (the train split trains them)")
    bundle, split, queries = load_eval_split(data, channels=int(model.preprocess.input_size[0]), split=split,
                                             seed=seed, val_fraction=val_fraction, strict=strict, options=options)
    return {"data": bundle.name, "split": split} | dense_probe(model, bundle.train, queries, bundle.class_names,
                                                               protocols, **kw)
