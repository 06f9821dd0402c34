"""Object detection as a training objective: the model is the backbone of any family (what the run saves as
best/last.safetensors); the task owns a torchvision detector over its feature maps (models.detection: FCOS by
default, `task.detector=faster_rcnn`), trains it with the backbone and writes its weights beside the
checkpoints as `detection_head.safetensors`, with the test predictions in COCO's results format
(`predictions.json`: image_id, category_id, bbox [x, y, w, h] in the image's own pixels, score).

The data yields (image, target) with boxes in the image's own pixels (data/coco.py: a COCO annotation file or
`canvas-digits-boxes`); the image pipeline is the run's and the boxes follow its geometry here: training
resizes to the model's size (crop=none), evaluation is timm's resize + centre crop, whose map this module
inverts to put the predictions back in the image's pixels. So random geometric augmentation is refused.
Metrics by COCO's standard, pycocotools' COCOeval on the boxes the data holds: `map` (AP@[.5:.95]), `map_50`,
`map_75` and `per_class` AP, in percent (COCO's AP x 100, as papers print it); "score" is `map`.
"""
from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ...errors import ConfigError
from ...models.detection import DETECTORS, build_detector
from ...typed_config import JsonConfig
from ..distributed import Dist, all_mean
from .base import Task, refuse_moving_augmentation

HEAD_FILE = "detection_head.safetensors"  # the detector's neck and head, beside the run's checkpoints
HEAD_META_KEY = "vitkit.detection_head"  # its safetensors metadata: the DetectOptions it was built with


@dataclass
class DetectOptions(JsonConfig):
    _what = "detection option"

    detector: str = "fcos"  # fcos | faster_rcnn (torchvision's)
    dim: int = 64  # channels of every pyramid level (a multiple of 32)
    score_thresh: float = 0.05  # detections below it are not kept (COCO's evaluations use 0.05)
    detections: int = 100  # per image at most (COCO's maxDets)

    def __post_init__(self):
        if self.detector not in DETECTORS or self.dim < 32 or self.dim % 32 or not 0 <= self.score_thresh < 1 \
                or self.detections < 1:
            raise ConfigError(f"task.detector must be one of {', '.join(DETECTORS)}, task.dim a multiple of 32, "
                              "task.score_thresh in [0, 1), task.detections >= 1")


def eval_box_map(size_hw: tuple[int, int], pre) -> tuple[float, float, float, float]:
    """(sy, sx, oy, ox): a point (y, x) of an image of `size_hw` lands at (y * sy - oy, x * sx - ox) of the
    eval transform's output (data.transforms.EvalResizeCrop: resize by `eval_resize_size`, pad the short side
    when the crop is larger ('border', or torchvision's centre crop), centre-crop with its rounding)."""
    from ...data.transforms import eval_resize_size

    h, w = size_hw
    rh, rw = eval_resize_size((h, w), pre)
    th, tw = (int(v) for v in pre.input_size[1:])
    offsets = []
    for resized, target in ((rh, th), (rw, tw)):
        pad = max(target - resized, 0)
        offsets.append(int(round((resized + pad - target) / 2.0)) - pad // 2)
    return rh / h, rw / w, float(offsets[0]), float(offsets[1])


def to_image_pixels(boxes: torch.Tensor, size_hw: tuple[int, int], pre) -> torch.Tensor:
    """Boxes [n, 4] xyxy on the eval transform's output -> the same boxes in the pixels of an image of
    `size_hw` (the inverse of `eval_box_map`), clipped to that image."""
    h, w = size_hw
    sy, sx, oy, ox = eval_box_map((h, w), pre)
    boxes = (boxes + torch.tensor([ox, oy, ox, oy])) / torch.tensor([sx, sy, sx, sy])  # [n, 4]
    return torch.stack([boxes[:, 0].clamp(0, w), boxes[:, 1].clamp(0, h), boxes[:, 2].clamp(0, w),
                        boxes[:, 3].clamp(0, h)], 1)


def coco_ground_truth(targets: list[dict[str, torch.Tensor]], num_classes: int) -> dict[str, Any]:
    """A COCO dataset dict from unpadded targets in the image's pixels (labels as category ids)."""
    images, anns = [], []
    for t in targets:
        h, w = (int(v) for v in t["size"])
        images.append({"id": int(t["image_id"]), "height": h, "width": w})
        for box, label, crowd, area in zip(t["boxes"].tolist(), t["labels"].tolist(), t["crowd"].tolist(),
                                           t["area"].tolist()):
            anns.append({"id": len(anns) + 1, "image_id": int(t["image_id"]), "category_id": int(label),
                         "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]], "area": float(area),
                         "iscrowd": int(crowd)})
    return {"images": images, "annotations": anns, "categories": [{"id": c} for c in range(1, num_classes)]}


def coco_results(detections: list[dict[str, Any]], category_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """Detections (image_id, boxes [n, 4] xyxy, scores, labels 1..K) -> COCO's results format; `category_ids`
    maps label l to category_ids[l - 1] (a COCO file's own ids)."""
    out = []
    for d in detections:
        for box, score, label in zip(d["boxes"].tolist(), d["scores"].tolist(), d["labels"].tolist()):
            cat = category_ids[label - 1] if category_ids else label
            out.append({"image_id": int(d["image_id"]), "category_id": int(cat),
                        "bbox": [round(v, 3) for v in (box[0], box[1], box[2] - box[0], box[3] - box[1])],
                        "score": round(float(score), 5)})
    return out


def coco_metrics(ground_truth: dict[str, Any], results: list[dict[str, Any]],
                 class_names: list[str] | None = None) -> dict[str, Any]:
    """pycocotools' COCOeval (bbox) -> map, map_50, map_75 and per-class AP (%; classes absent from the ground
    truth are left out), as detectron2 reads per-class AP from COCOeval's precision array."""
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        raise ConfigError("task=detect's COCO metrics need pycocotools: pip install 'vitkit[detect]'") from None
    zero = {"map": 0.0, "map_50": 0.0, "map_75": 0.0, "per_class": {}}
    if not results or not ground_truth["annotations"]:  # COCO.loadRes refuses an empty list
        return zero
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and the table
        gt = COCO()
        gt.dataset = ground_truth
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(results), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    precision = ev.eval["precision"]  # [IoU thresholds, recall, categories, area ranges, max dets]
    per_class = {}
    for k, cat in enumerate(ev.params.catIds):
        p = precision[:, :, k, 0, -1]
        if (p > -1).any():
            name = class_names[cat] if class_names and cat < len(class_names) else str(cat)
            per_class[name] = round(100 * float(p[p > -1].mean()), 3)
    stats = [max(float(v), 0.0) * 100 for v in ev.stats[:3]]
    return {"map": stats[0], "map_50": stats[1], "map_75": stats[2], "per_class": per_class}


def unpad(target: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """A collated batch of padded targets (data/coco.py) -> one dict per image with its real boxes."""
    out = []
    for i, n in enumerate(target["count"].tolist()):
        out.append({k: (v[i, :n] if k in ("boxes", "labels", "crowd", "area") else v[i]) for k, v in target.items()})
    return out


class DetectTask(Task):
    """`--task detect [--set task.detector=faster_rcnn]` on box data, with any backbone family."""

    every_parameter_used = False  # the backbone's classifier gets no gradient

    def __init__(self, recipe, model, **kw):
        super().__init__(recipe, model, **kw)
        refuse_moving_augmentation(recipe, "detect", "boxes")
        self.opts = o = DetectOptions.from_dict(recipe.task_args)
        self.detector = build_detector(self.model, self.num_classes, o.detector, o.dim, score_thresh=o.score_thresh,
                                       detections_per_img=o.detections).to(self.device)
        self.detector.backbone.precision = self.autocast  # bf16 for the backbone; the head and losses in fp32

    @staticmethod
    def _targets(target) -> list[dict[str, torch.Tensor]]:
        if not isinstance(target, dict) or "boxes" not in target:
            raise ConfigError("task=detect needs boxes as targets: use a detection dataset (--data "
                              "canvas-digits-boxes or a COCO annotation file ANN.json)")
        return unpad(target)

    def _train_targets(self, target, size) -> list[dict[str, torch.Tensor]]:
        """The boxes as the training transform's resize to the model's size (crop=none) moved them; crowd boxes
        are left out (torchvision's detectors have no ignore regions)."""
        out = []
        for t in self._targets(target):
            h, w = t["size"].tolist()
            scale = torch.tensor([size[1] / w, size[0] / h] * 2, device=t["boxes"].device)
            keep = ~t["crowd"]
            out.append({"boxes": t["boxes"][keep] * scale, "labels": t["labels"][keep]})
        return out

    def forward(self, batch) -> dict[str, Any]:
        x, target = batch
        with self._normalised_over_processes():
            losses = self.detector(list(x), self._train_targets(target, x.shape[-2:]))
        return {"loss": sum(v.float() for v in losses.values()), "batch_size": len(x)}

    @contextlib.contextmanager
    def _normalised_over_processes(self):
        """Under torchrun, a head that divides its losses by a count of matched locations (FCOS's foreground)
        divides by the mean count over the processes for this training step, so DDP's averaged gradients equal
        one process's on the global batch. Only here: every rank runs the training step, while evaluation (and
        its loss) runs on rank 0 alone, where a collective would wait for ranks that never join."""
        head = getattr(self.detector, "head", None)
        if not hasattr(head, "foreground_mean") or not (dist.is_available() and dist.is_initialized()) \
                or dist.get_world_size() == 1:
            yield
            return
        world = Dist(world=dist.get_world_size())
        head.foreground_mean = lambda n: all_mean([float(n)], world, self.device)[0]
        try:
            yield
        finally:
            head.foreground_mean = None

    @torch.no_grad()
    def detect(self, model: nn.Module, x: torch.Tensor, target) -> list[dict[str, Any]]:
        """Eval-transformed images [B, C, H, W] -> each image's detections in its own pixels (image_id, boxes
        [n, 4] xyxy, scores [n], labels [n])."""
        was = self.detector.training
        self.detector.eval()
        try:
            with self.detector.backbone.reading(model):
                raw = self.detector(list(x))
        finally:
            self.detector.train(was)
        out = []
        for t, d in zip(self._targets(target), raw):
            boxes = to_image_pixels(d["boxes"].float().cpu(), tuple(t["size"].tolist()), model.preprocess)
            out.append({"image_id": int(t["image_id"]), "boxes": boxes, "scores": d["scores"].float().cpu(),
                        "labels": d["labels"].cpu()})
        return out

    @torch.no_grad()
    def _eval_loss(self, model: nn.Module, x: torch.Tensor, target) -> float:
        """torchvision's training loss on the eval images: the detector (neck and head: no batch norm, no
        dropout) in training mode, the backbone as it is (eval)."""
        boxes_in = []
        for t in self._targets(target):
            sy, sx, oy, ox = eval_box_map(tuple(t["size"].tolist()), model.preprocess)
            b = t["boxes"][~t["crowd"]] * torch.tensor([sx, sy, sx, sy], device=x.device) - \
                torch.tensor([ox, oy, ox, oy], device=x.device)
            b[:, 0::2], b[:, 1::2] = b[:, 0::2].clamp(0, x.shape[-1]), b[:, 1::2].clamp(0, x.shape[-2])
            keep = (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])  # boxes the centre crop cut away
            boxes_in.append({"boxes": b[keep], "labels": t["labels"][~t["crowd"]][keep]})
        was = self.detector.training
        self.detector.train()
        try:
            with self.detector.backbone.reading(model):
                losses = self.detector(list(x), boxes_in)
        finally:
            self.detector.train(was)
        return float(sum(v.float() for v in losses.values()))

    def predictions(self, model: nn.Module, loader) -> tuple[list[dict[str, Any]], list[dict[str, torch.Tensor]], float]:
        """(detections, unpadded targets, mean loss per image) over a loader of (image, target) batches."""
        detections, targets, loss, n = [], [], 0.0, 0
        for x, target in loader:
            x, target = x.to(self.device), {k: v.to(self.device) for k, v in self._checked(target).items()}
            detections += self.detect(model, x, target)
            targets += [{k: v.cpu() for k, v in t.items()} for t in unpad(target)]
            loss += self._eval_loss(model, x, target) * len(x)
            n += len(x)
        return detections, targets, loss / max(n, 1)

    def _checked(self, target):
        self._targets(target)
        return target

    def evaluate(self, model: nn.Module, loader) -> dict[str, Any]:
        detections, targets, loss = self.predictions(model, loader)
        m = coco_metrics(coco_ground_truth(targets, self.num_classes), coco_results(detections),
                         getattr(model, "class_names", None))
        return m | {"loss": loss, "score": m["map"]}

    def describe(self, metrics: dict[str, Any], raw: dict[str, Any] | None = None) -> str:
        extra = f" (without EMA {raw['map']:.2f})" if raw else ""
        return f"mAP {metrics['map']:.2f}{extra} mAP50 {metrics['map_50']:.2f} mAP75 {metrics['map_75']:.2f}"

    @torch.no_grad()
    def figures(self, model: nn.Module, dataset, folder) -> dict[str, Any]:
        """detection_head.safetensors (the detector's neck and head) and predictions.json: the final split's
        detections in COCO's results format, category ids as the data has them."""
        from safetensors.torch import save_file
        from torch.utils.data import DataLoader

        from ..._files import atomic_path, atomic_write_text
        from ...data.coco import targets_of

        folder = Path(folder)
        with atomic_path(folder / HEAD_FILE) as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in self.detector.state_dict().items()}, str(tmp),
                      metadata={HEAD_META_KEY: json.dumps(self.opts.to_dict())})
        source = targets_of(dataset)
        loader = DataLoader(dataset, batch_size=self.recipe.eval_batch_size, shuffle=False)
        detections = [d for x, target in loader
                      for d in self.detect(model, x.to(self.device), self._checked(target))]
        results = coco_results(detections, source.category_ids if source is not None else None)
        atomic_write_text(folder / "predictions.json", json.dumps(results))
        return {}
