"""Semantic segmentation as a training objective: the model is the backbone of any family (what the run saves
as best/last.safetensors); the task owns the segmentation head (models.segmentation: ViTDet's simple pyramid
for a plain ViT, the stage maps of a Swin or a ResNet, a light FPN head), trains it with the backbone and
writes it beside the checkpoints as `segmentation_head.safetensors` (the head of the last epoch, which goes
with last.safetensors).

The data yields (image, mask [H, W] class indices, 0 = background): the `canvas-*` sets (data/canvas.py).
The image pipeline is the run's; the mask follows the same geometry here (a resize to the model's size when
training, the eval resize and centre crop when evaluating, both nearest), so random geometric augmentation
(RandomResizedCrop, padding crops, flips, RandAugment) is refused: it would move the image but not the mask.
Metrics: mIoU over the classes present in the split (background included; `miou_fg` without it), pixel
accuracy, and the pixel confusion matrix (confusion.png).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from ...models.segmentation import SegmentationHead, backbone_maps
from ...typed_config import JsonConfig
from .base import Task, refuse_moving_augmentation


@dataclass
class SegmentOptions(JsonConfig):
    _what = "segmentation option"

    dim: int = 64  # channels of every pyramid level in the head
    dropout: float = 0.1  # before the per-pixel classifier
    overlays: int = 6  # test images drawn in overlays.png

    def __post_init__(self):
        if self.dim < 4 or not 0 <= self.dropout < 1 or self.overlays < 0:
            raise ConfigError("task.dim must be >= 4, task.dropout in [0, 1), task.overlays >= 0")


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, k: int) -> torch.Tensor:
    """[K, K] pixel counts, rows the true class, columns the predicted one."""
    return torch.bincount(target.flatten() * k + pred.flatten(), minlength=k * k).view(k, k).cpu()


def iou_metrics(confusion: torch.Tensor) -> dict[str, Any]:
    """mIoU (%) over the classes that occur (true or predicted), with and without class 0, and pixel accuracy."""
    c = confusion.double()
    tp, true, predicted = c.diag(), c.sum(1), c.sum(0)
    union = true + predicted - tp
    present = union > 0
    iou = torch.where(present, tp / union.clamp(min=1), torch.zeros_like(tp))
    fg = present.clone()
    fg[0] = False
    return {"miou": 100 * iou[present].mean().item() if present.any() else 0.0,
            "miou_fg": 100 * iou[fg].mean().item() if fg.any() else 0.0,
            "pixel_acc": 100 * (tp.sum() / c.sum().clamp(min=1)).item(),
            "iou_per_class": [round(100 * v, 2) for v in iou.tolist()]}


class SegmentTask(Task):
    """`--set task=segment [--set task.dim=64]` on canvas data, with any backbone family."""

    every_parameter_used = False  # the backbone's classifier gets no gradient

    def __init__(self, recipe, model, **kw):
        super().__init__(recipe, model, **kw)
        refuse_moving_augmentation(recipe, "segment", "mask")
        self.opts = o = SegmentOptions.from_dict(recipe.task_args)
        self.head = SegmentationHead.for_backbone(self.model, self.num_classes, o.dim,
                                                  dropout=o.dropout).to(self.device)

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> [B, K, H, W]."""
        return self.head(backbone_maps(model, x), x.shape[-2:])

    def _train_masks(self, masks: torch.Tensor, size) -> torch.Tensor:
        """The training transform resizes a canvas to the model's size (crop=none): the mask likewise."""
        if masks.ndim != 3:
            raise ConfigError(f"task=segment needs per-pixel masks [B, H, W] as targets, got shape "
                              f"{tuple(masks.shape)}: use a segmentation dataset (--data canvas-fashion)")
        if masks.shape[-2:] == tuple(size):
            return masks
        return F.interpolate(masks[:, None].float(), size=tuple(size), mode="nearest")[:, 0].long()

    @staticmethod
    def _eval_masks(masks: torch.Tensor, pre) -> torch.Tensor:
        """The eval transform's geometry (timm's resize + centre crop) on the masks, nearest."""
        from torchvision.transforms import InterpolationMode

        from ...data.transforms import EvalResizeCrop

        if masks.ndim != 3:
            raise ConfigError(f"task=segment needs per-pixel masks [B, H, W] as targets, got {tuple(masks.shape)}")
        geometry = EvalResizeCrop(pre, InterpolationMode.NEAREST)
        return geometry(masks[:, None].to(torch.uint8))[:, 0].long()  # [B, h, w]

    def forward(self, batch) -> dict[str, Any]:
        x, masks = batch
        masks = self._train_masks(masks, x.shape[-2:])
        with self.autocast():
            logits = self.logits(self.model, x)
        loss = F.cross_entropy(logits.float(), masks)
        return {"loss": loss, "batch_size": len(x)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader) -> dict[str, Any]:
        k = self.num_classes
        confusion = torch.zeros(k, k, dtype=torch.long)
        total, n = 0.0, 0
        for x, masks in loader:
            x = x.to(self.device)
            masks = self._eval_masks(masks, model.preprocess).to(self.device)
            with self.autocast():
                logits = self.logits(model, x)
            total += F.cross_entropy(logits.float(), masks, reduction="sum").item() / masks[0].numel()
            n += len(x)
            confusion += confusion_matrix(logits.argmax(1), masks, k)
        m = iou_metrics(confusion)
        return m | {"loss": total / max(n, 1), "score": m["miou"], "confusion": confusion}

    def describe(self, metrics: dict[str, Any], raw: dict[str, Any] | None = None) -> str:
        extra = f" (without EMA {raw['miou']:.2f}%)" if raw else ""
        return (f"mIoU {metrics['miou']:.2f}%{extra} (items {metrics['miou_fg']:.2f}%) "
                f"pixel acc {metrics['pixel_acc']:.2f}%")

    @torch.no_grad()
    def figures(self, model: nn.Module, dataset, folder) -> dict[str, Any]:
        """overlays.png (image / true mask / predicted mask) for the first test images, and the head's weights
        (the loop calls it in eval mode)."""
        from safetensors.torch import save_file

        from ..._files import atomic_path

        folder = Path(folder)
        with atomic_path(folder / "segmentation_head.safetensors") as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}, str(tmp),
                      metadata={"vitkit.segmentation_head": json.dumps(self.opts.to_dict())})
        n = min(self.opts.overlays, len(dataset))
        if not n:
            return {}
        items = [dataset[i] for i in range(n)]
        x = torch.stack([it[0] for it in items]).to(self.device)
        masks = self._eval_masks(torch.stack([it[1] for it in items]), model.preprocess)
        with self.autocast():
            pred = self.logits(model, x).argmax(1).cpu()
        path = plot_overlays(x.cpu(), masks, pred, model.preprocess, model.class_names, folder / "overlays.png")
        return {"overlays (image, true mask, prediction)": path}


def plot_overlays(images: torch.Tensor, true: torch.Tensor, pred: torch.Tensor, pre, class_names, path: Path) -> Path:
    """Rows of image / true mask / predicted mask (class colours, background black) with a colour legend."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    k = len(class_names) if class_names else int(max(true.max(), pred.max())) + 1
    names = list(class_names) if class_names else [str(i) for i in range(k)]
    from matplotlib import colormaps

    colours = [(0, 0, 0, 1)] + [colormaps["tab10" if k <= 11 else "tab20"](i % 20) for i in range(k - 1)]
    cmap = ListedColormap(colours)
    m, s = torch.tensor(pre.mean).view(1, -1, 1, 1), torch.tensor(pre.std).view(1, -1, 1, 1)
    pixels = (images.float() * s + m).clamp(0, 1)  # [B, C, H, W]
    n = len(images)
    fig = Figure(figsize=(7.5, 2.2 * n + 0.8))
    axes = fig.subplots(n, 3, squeeze=False)
    for i in range(n):
        img = pixels[i].permute(1, 2, 0).numpy()
        axes[i][0].imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=1)
        axes[i][1].imshow(true[i].numpy(), cmap=cmap, vmin=0, vmax=k - 1, interpolation="nearest")
        axes[i][2].imshow(pred[i].numpy(), cmap=cmap, vmin=0, vmax=k - 1, interpolation="nearest")
        for ax in axes[i]:
            ax.set_axis_off()
    for ax, title in zip(axes[0], ("image", "true mask", "predicted mask")):
        ax.set_title(title, fontsize=9)
    fig.legend(handles=[Patch(color=colours[c], label=names[c]) for c in range(k)], loc="lower center",
               ncol=min(k, 6), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=90)
    return path
