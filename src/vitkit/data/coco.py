"""Detection data: images with boxes, from a COCO-format annotation file (read with pycocotools) or a built-in
canvas set (canvas.py), in one dataset type, `DetectionImages`.

`--data ANN.json`: each image's `file_name` is looked for under `image_root` when given, else beside the file,
else in its `images/` folder. Cleaning, said in one line: boxes reaching outside their image are clipped to it,
boxes of zero area (after clipping) and boxes whose `category_id` is not among `categories` are dropped; an
image whose file is missing is listed and skipped (`strict` stops instead). Crowd boxes (`iscrowd`) are kept
for evaluation (COCOeval ignores detections on them) and never trained on.

Labels are 1..K in the order of the category ids (0 is the background, torchvision's convention); the class
names are ["background", *category names]. A file is one split: a training run carves a seeded fraction of its
images as validation (`val_fraction`), recorded in `info`.

An item is (image, target): the image as the run's transforms take it (uint8 [C, H, W] or a PIL image) and a
target of fixed-size tensors, padded to the set's most boxes per image, so the default DataLoader collation
stacks a batch: `boxes` [M, 4] xyxy in the image's own pixels, `labels` [M], `crowd` [M], `area` [M],
`count` (the real boxes), `size` [2] (H, W), `image_id`.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataError
from .bundle import DataBundle

log = logging.getLogger("vitkit")


class DetectionImages(Dataset):
    """Images (a uint8 tensor [N, C, H, W], or file paths decoded on access) with per-image boxes."""

    def __init__(self, images: torch.Tensor | Sequence[Path], boxes: Sequence[torch.Tensor],
                 box_labels: Sequence[torch.Tensor], *, sizes: Sequence[tuple[int, int]], image_ids: Sequence[int],
                 category_ids: Sequence[int], crowd: Sequence[torch.Tensor] | None = None,
                 areas: Sequence[torch.Tensor] | None = None, channels: int = 3, max_boxes: int | None = None):
        self.images = images if isinstance(images, torch.Tensor) else [Path(p) for p in images]
        self.boxes = [b.float().reshape(-1, 4) for b in boxes]
        self.box_labels = [t.long() for t in box_labels]
        self.crowd = [c.bool() for c in crowd] if crowd is not None else [torch.zeros(len(b), dtype=torch.bool)
                                                                          for b in self.boxes]
        self.areas = [a.float() for a in areas] if areas is not None else [(b[:, 2:] - b[:, :2]).prod(1)
                                                                           for b in self.boxes]
        self.sizes, self.image_ids = [tuple(int(v) for v in s) for s in sizes], [int(i) for i in image_ids]
        self.category_ids, self.channels = [int(c) for c in category_ids], channels
        self.max_boxes = max_boxes or max([1, *(len(b) for b in self.boxes)])
        # one class per image (its largest box's; 0 with none), what a seeded stratified subset splits on
        self.labels = torch.tensor([int(t[(b[:, 2:] - b[:, :2]).prod(1).argmax()]) if len(t) else 0
                                    for b, t in zip(self.boxes, self.box_labels)], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.image_ids)

    def _image(self, i: int):
        if isinstance(self.images, torch.Tensor):
            return self.images[i]
        from .images import load_image

        return load_image(self.images[i], self.channels)

    def __getitem__(self, i: int):
        n, m = len(self.boxes[i]), self.max_boxes
        boxes, labels = torch.zeros(m, 4), torch.zeros(m, dtype=torch.long)
        crowd, area = torch.zeros(m, dtype=torch.bool), torch.zeros(m)
        boxes[:n], labels[:n], crowd[:n], area[:n] = self.boxes[i], self.box_labels[i], self.crowd[i], self.areas[i]
        return self._image(i), {"boxes": boxes, "labels": labels, "crowd": crowd, "area": area,
                                "count": torch.tensor(n), "size": torch.tensor(self.sizes[i]),
                                "image_id": torch.tensor(self.image_ids[i])}

    def subset(self, idx: Sequence[int]) -> DetectionImages:
        idx = [int(i) for i in idx]
        images = self.images[torch.as_tensor(idx, dtype=torch.long)] if isinstance(self.images, torch.Tensor) \
            else [self.images[i] for i in idx]
        pick = lambda items: [items[i] for i in idx]  # noqa: E731
        return DetectionImages(images, pick(self.boxes), pick(self.box_labels), sizes=pick(self.sizes),
                               image_ids=pick(self.image_ids), category_ids=self.category_ids,
                               crowd=pick(self.crowd), areas=pick(self.areas), channels=self.channels,
                               max_boxes=self.max_boxes)

    def keys(self) -> list:
        return [str(p) for p in self.images] if isinstance(self.images, list) else list(self.image_ids)


def targets_of(dataset) -> DetectionImages | None:
    """The DetectionImages under a run's wrappers (Transformed's `base`, a Subset's `dataset`), or None."""
    while dataset is not None and not isinstance(dataset, DetectionImages):
        dataset = getattr(dataset, "base", None) or getattr(dataset, "dataset", None)
    return dataset


def _read_coco(path: Path):
    """The file as a pycocotools COCO object, or one DataError line for what it is not."""
    try:
        from pycocotools.coco import COCO
    except ImportError:
        raise DataError("COCO annotation files need pycocotools: pip install 'vitkit[detect]' (or pycocotools)") \
            from None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable annotation file ({e})") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not a COCO annotation file (not JSON: {e.msg} at line {e.lineno})") from None
    missing = [k for k in ("images", "annotations", "categories")
               if not isinstance(data, dict) or not isinstance(data.get(k), list)]
    if missing:
        raise DataError(f"{path}: not a COCO annotation file (it needs the lists 'images', 'annotations' and "
                        f"'categories'; missing: {', '.join(missing)})")
    try:
        coco = COCO()
        coco.dataset = data
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
            coco.createIndex()
    except (KeyError, TypeError) as e:
        raise DataError(f"{path}: not a COCO annotation file (an entry lacks {e})") from None
    return coco


def _find_image(name: str, roots: list[Path]) -> Path | None:
    return next((root / name for root in roots if (root / name).is_file()), None)


def _image_size(entry: dict, file: Path) -> tuple[int, int]:
    """(H, W) as the file records it, else from the image's header."""
    if isinstance(entry.get("height"), int) and isinstance(entry.get("width"), int):
        return entry["height"], entry["width"]
    from PIL import Image

    with Image.open(file) as img:
        return img.height, img.width


def load_coco(path: str | Path, *, strict: bool = False, channels: int = 3, image_root: str | Path | None = None,
              seed: int = 0, val_fraction: float = 0.0) -> DataBundle:
    """A COCO annotation file -> a DataBundle (train, and val when `val_fraction`), cleaned as the module says."""
    path = Path(path)
    coco = _read_coco(path)
    categories = sorted(coco.dataset["categories"], key=lambda c: c["id"])
    cat_ids = [int(c["id"]) for c in categories]
    label_of = {c: i + 1 for i, c in enumerate(cat_ids)}
    roots = [Path(image_root)] if image_root is not None else [path.parent, path.parent / "images"]
    files, boxes, labels, crowds, areas, sizes, ids, missing = [], [], [], [], [], [], [], []
    clipped = zero = 0
    unknown: dict[int, int] = {}
    for image_id in sorted(coco.imgs):
        entry = coco.imgs[image_id]
        file = _find_image(str(entry.get("file_name", "")), roots)
        if file is None:
            if strict:
                raise DataError(f"{path}: image {entry.get('file_name')!r} (id {image_id}) is not in "
                                f"{' or '.join(map(str, roots))} (--strict stops at the first missing image)")
            missing.append(str(entry.get("file_name")))
            continue
        h, w = _image_size(entry, file)
        kept: list[tuple[list[float], int, bool, float]] = []
        for ann in coco.imgToAnns.get(image_id, []):
            if ann.get("category_id") not in label_of:
                unknown[ann.get("category_id")] = unknown.get(ann.get("category_id"), 0) + 1
                continue
            bbox = ann.get("bbox")
            if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
                raise DataError(f"{path}: annotation {ann.get('id')} has bbox {bbox!r}; COCO's is [x, y, width, "
                                "height] in pixels")
            x0, y0, x1, y1 = bbox[0], bbox[1], bbox[0] + bbox[2], bbox[1] + bbox[3]
            cx0, cy0, cx1, cy1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
            if cx1 <= cx0 or cy1 <= cy0:
                zero += 1
                continue
            was_clipped = (cx0, cy0, cx1, cy1) != (x0, y0, x1, y1)
            clipped += was_clipped
            area = (cx1 - cx0) * (cy1 - cy0) if was_clipped else float(ann.get("area") or (cx1 - cx0) * (cy1 - cy0))
            kept.append(([cx0, cy0, cx1, cy1], label_of[ann["category_id"]], bool(ann.get("iscrowd", 0)), area))
        files.append(file)
        boxes.append(torch.tensor([k[0] for k in kept], dtype=torch.float32).reshape(-1, 4))
        labels.append(torch.tensor([k[1] for k in kept], dtype=torch.long))
        crowds.append(torch.tensor([k[2] for k in kept], dtype=torch.bool))
        areas.append(torch.tensor([k[3] for k in kept], dtype=torch.float32))
        sizes.append((h, w))
        ids.append(image_id)
    if clipped or zero or unknown:
        said = [f"clipped {clipped} box(es) to their image"] if clipped else []
        said += [f"dropped {zero} box(es) of zero area"] if zero else []
        if unknown:
            said.append(f"dropped {sum(unknown.values())} box(es) with category ids not in 'categories' "
                        f"({', '.join(map(str, sorted(unknown, key=str)[:5]))})")
        log.warning("%s: %s", path, "; ".join(said))
    if missing:
        log.warning("%s: skipped %d image(s) whose file is missing, e.g. %s (looked in %s)", path, len(missing),
                    ", ".join(missing[:3]), " and ".join(map(str, roots)))
    if not files:
        raise DataError(f"{path}: none of its {len(coco.imgs)} image(s) were found (looked in "
                        f"{' and '.join(map(str, roots))})")
    full = DetectionImages(files, boxes, labels, sizes=sizes, image_ids=ids, category_ids=cat_ids, crowd=crowds,
                           areas=areas, channels=channels)
    info: dict[str, Any] = {"source": str(path), "task": "detection: boxes with COCO categories",
                            "category_ids": cat_ids, "skipped": [{"path": m, "reason": "missing"} for m in missing],
                            "num_skipped": len(missing), "clipped": clipped, "dropped_zero_area": zero,
                            "dropped_unknown_category": sum(unknown.values())}
    train, val = full, None
    if val_fraction and len(full) > 1:  # whole images: a seeded permutation, at least one on each side
        order = np.random.default_rng(seed).permutation(len(full))
        n_val = min(max(1, round(len(full) * val_fraction)), len(full) - 1)
        held, keep = sorted(order[:n_val].tolist()), sorted(order[n_val:].tolist())
        train, val = full.subset(keep), full.subset(held)
        info |= {"split_indices": {"val_from_train": held}, "val_split": {"fraction": val_fraction, "seed": seed}}
    same = set(sizes)
    return DataBundle(str(path.resolve()), ["background", *(str(c.get("name", c["id"])) for c in categories)],
                      channels, next(iter(same)) if len(same) == 1 else None, train, val, None, info)
