"""Object detection on any family: torchvision's detectors (FCOS by default, Faster R-CNN as the two-stage one)
over a backbone made from the feature contract alone (`feature_info` + `forward_intermediates`).

The maps are the segmentation head's (models/segmentation.py `backbone_maps`, `pyramid_indices`): a plain
backbone's last map (a ViT, a hybrid) becomes strides 4, 8, 16, 32 through ViTDet's simple feature pyramid
(layers/pyramid.py); a hierarchical one's stage maps (Swin, ResNet) go through torchvision's
FeaturePyramidNetwork. Anchors, box coding, the losses and NMS are torchvision's; vitkit only says where the
levels are (one anchor per location at each level's stride for FCOS, as torchvision's FCOS does for P3-P7).

The trunk (the vitkit model) is held by reference, not registered in the detector: a training task saves the
model as its checkpoint and the detector's own weights (neck and head) apart, and can run the same detector
on another copy of the weights (an EMA, a loaded checkpoint) with `PyramidBackbone.reading(model)`.
Images reach the detector already resized and normalised by vitkit's pipeline, so torchvision's own
transform is set to change nothing (mean 0, std 1, its size the model's input size, no padding).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import nn

from ..errors import ConfigError
from ..layers.pyramid import SimpleFeaturePyramid, scales_for
from .segmentation import backbone_maps, backbone_widths, is_plain, pyramid_indices

DETECTORS = ("fcos", "faster_rcnn")
PLAIN_STRIDES = (4, 8, 16, 32)  # the levels the simple pyramid makes from a plain map


class PyramidBackbone(nn.Module):
    """torchvision's backbone protocol (`out_channels`; images [B, C, H, W] -> OrderedDict of [B, dim, h, w]
    maps, finest first) over a vitkit model's feature maps."""

    def __init__(self, model: nn.Module, dim: int = 64):
        super().__init__()
        self.plain = is_plain(model)
        widths = backbone_widths(model)
        if self.plain:
            stride = model.feature_info[-1]["reduction"]
            self.neck = SimpleFeaturePyramid(widths[0], dim, scales_for(stride, PLAIN_STRIDES))
            self.strides = PLAIN_STRIDES
        else:
            from torchvision.ops import FeaturePyramidNetwork

            self.neck = FeaturePyramidNetwork(widths, dim)
            self.strides = tuple(model.feature_info[i]["reduction"] for i in pyramid_indices(model))
        self.out_channels = dim
        object.__setattr__(self, "trunk", model)  # held, not registered: see the module docstring
        # the context the trunk and neck run in (a training task's bf16 autocast); the detector's head, losses
        # and box decoding stay in fp32 outside it
        self.precision: Callable[[], AbstractContextManager] = nullcontext

    @contextmanager
    def reading(self, model: nn.Module) -> Iterator[None]:
        """Run on `model`'s weights (same architecture) for the duration of the block."""
        held = self.trunk
        object.__setattr__(self, "trunk", model)
        try:
            yield
        finally:
            object.__setattr__(self, "trunk", held)

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        with self.precision():
            maps = backbone_maps(self.trunk, x)
            if self.plain:
                levels = self.neck(maps[-1])  # [B, dim, H/s, W/s] for s in 4, 8, 16, 32
            else:
                levels = list(self.neck(OrderedDict((str(i), m) for i, m in enumerate(maps))).values())
        return OrderedDict((str(i), f.float()) for i, f in enumerate(levels))  # fp32 for the head and losses


def build_detector(model: nn.Module, num_classes: int, kind: str = "fcos", dim: int = 64,
                   score_thresh: float = 0.05, detections_per_img: int = 100) -> nn.Module:
    """A torchvision detector over `model`'s feature maps. `num_classes` counts the background (label 0), as
    torchvision's Faster R-CNN does; labels in and out are 1..num_classes-1 for either detector."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.ops import MultiScaleRoIAlign

    if kind not in DETECTORS:
        raise ConfigError(f"unknown detector {kind!r}; choose from {', '.join(DETECTORS)}")
    if num_classes < 2:
        raise ConfigError("a detector needs the background and at least one class (num_classes >= 2)")
    if dim % 32:
        raise ConfigError(f"detector width {dim} must be a multiple of 32 (torchvision's FCOS head: GroupNorm(32))")
    backbone = PyramidBackbone(model, dim)
    h, w = (int(v) for v in model.preprocess.input_size[1:])
    # images arrive resized and normalised: torchvision's transform leaves them as they are
    same = dict(min_size=min(h, w), max_size=max(h, w), image_mean=[0.0], image_std=[1.0], size_divisible=1)
    names = [str(i) for i in range(len(backbone.strides))]
    if kind == "fcos":
        anchors = AnchorGenerator(tuple((s,) for s in backbone.strides), ((1.0,),) * len(names))
        head = _fcos_head_class()(dim, anchors.num_anchors_per_location()[0], num_classes - 1)
        fcos = _fcos_class()(backbone, num_classes - 1, anchor_generator=anchors, head=head,
                             score_thresh=score_thresh, detections_per_img=detections_per_img, **same)
        _at_least_two_channels_per_group(fcos.head)
        return fcos
    # two-stage: three shapes of anchor, two sizes (2x and 4x the stride) at each level
    anchors = AnchorGenerator(tuple((2 * s, 4 * s) for s in backbone.strides), ((0.5, 1.0, 2.0),) * len(names))
    pool = MultiScaleRoIAlign(featmap_names=names, output_size=7, sampling_ratio=2)
    hidden = 4 * dim  # torchvision's 1024 is sized for 256-wide FPN levels
    return FasterRCNN(backbone, rpn_anchor_generator=anchors, box_roi_pool=pool,
                      box_head=TwoMLPHead(dim * 7 * 7, hidden), box_predictor=FastRCNNPredictor(hidden, num_classes),
                      box_score_thresh=score_thresh, box_detections_per_img=detections_per_img, **same)


def _at_least_two_channels_per_group(module: nn.Module) -> None:
    """torchvision's FCOS head normalises with GroupNorm(32, dim): at dim 32 one channel per group, so on the
    1x1 top level of a small image each group holds one value, which GroupNorm refuses ('Expected more than 1
    value per channel'), and predicting one image failed. Such norms get dim/2 groups; dim >= 64 is unchanged."""
    for name, child in module.named_children():
        if isinstance(child, nn.GroupNorm) and child.num_channels // child.num_groups < 2:
            setattr(module, name, nn.GroupNorm(child.num_channels // 2, child.num_channels, child.eps, child.affine))
        else:
            _at_least_two_channels_per_group(child)


def _fcos_head_class() -> type:
    """torchvision's FCOS head (the same modules and keys), whose three losses are sums over the foreground
    locations divided by their count in this process's batch. Set `foreground_mean` (this process's count ->
    the mean count over the processes; the training task sets it under torchrun) and they are divided by that
    mean instead, so the gradients DDP averages are those of one process on the whole global batch, as
    mmdetection's FCOS normalises. None (the default): torchvision's loss exactly."""
    from torchvision.models.detection.fcos import FCOSHead

    class FCOSHeadOverProcesses(FCOSHead):
        foreground_mean = None

        def compute_loss(self, targets, head_outputs, anchors, matched_idxs):
            losses = super().compute_loss(targets, head_outputs, anchors, matched_idxs)
            if self.foreground_mean is None:
                return losses
            here = sum(int((m >= 0).sum()) for m in matched_idxs)  # the locations torchvision counted
            scale = max(1, here) / max(1.0, self.foreground_mean(here))
            return {k: v * scale for k, v in losses.items()}

    return FCOSHeadOverProcesses


def _fcos_class() -> type:
    """torchvision's FCOS with labels 1..K outside: its classes are all objects (a sigmoid each, no background
    class), so it is built for K classes and the labels are shifted by one in and out."""
    from torchvision.models.detection import FCOS

    class BackgroundZeroFCOS(FCOS):
        def forward(self, images, targets=None):
            if targets is not None:
                targets = [t | {"labels": t["labels"] - 1} for t in targets]
            out = super().forward(images, targets)
            return out if self.training else [d | {"labels": d["labels"] + 1} for d in out]

    return BackgroundZeroFCOS


class Detector(nn.Module):
    """A backbone of any family with a torchvision detector: images [B, C, H, W] (normalised, at the model's
    input size) -> in training, torchvision's loss dict for `targets` (dicts of `boxes` [n, 4] xyxy pixels
    and `labels` [n], 1-based); in eval, one dict of `boxes`, `scores`, `labels` per image."""

    def __init__(self, backbone: nn.Module, num_classes: int, kind: str = "fcos", dim: int = 64, **kw):
        super().__init__()
        self.backbone = backbone
        self.detector = build_detector(backbone, num_classes, kind, dim, **kw)

    def forward(self, images: torch.Tensor, targets: list[dict[str, torch.Tensor]] | None = None):
        return self.detector(list(images), targets)
