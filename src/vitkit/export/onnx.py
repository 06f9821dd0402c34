"""ONNX export with a parity check, an ONNX Runtime runner, and int8 dynamic quantisation.

Shapes. The batch is dynamic by default. The image size is fixed by default: at run time the model
resamples its position table with bicubic + antialias interpolation, which ONNX Runtime has no exact
counterpart for. `dynamic_size=True` exports any multiple of the patch size instead, resampling the
table *bilinearly without antialias* inside the graph: exact at the native size, and at other sizes
equal to the PyTorch model with `pos_interpolation="bilinear", pos_antialias=False`.

The exported file carries the model's config, preprocessing and class names in its metadata, so
`OnnxRunner(path)` can stand in for the model in predict/eval.

Detectors (a `task=detect` run's, `export_detector_onnx`): torch.export cannot trace torchvision's
postprocessing (batched_nms keeps a data-dependent number of boxes, which its symbolic shapes refuse), so
the detector goes through torch.onnx's TorchScript exporter, the path torchvision's detection models support
(its nms and roi_align have ONNX symbolics). The graph takes one image [1, C, H, W] at the trained size and
gives that image's boxes [n, 4] (xyxy on the input's pixels), scores [n] and labels [n], n varying with the
image; `OnnxRunner` runs it image by image.
"""
from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import VitkitError
from ..models import Preprocess, get_family
from .inference_only import InferenceOnly

META_KEY = "vitkit"


class ExportError(VitkitError):
    """The exported graph could not be produced, or disagrees with the PyTorch model."""


def _import_onnx(*names: str) -> list:
    """The ONNX packages (the `onnx` extra), or one ExportError naming the install command."""
    import importlib

    mods = []
    for name in names:
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            raise ExportError(f"ONNX export and --backend onnx need {name.split('.')[0]}, which is not installed: "
                              "pip install 'vitkit[onnx]'") from None
    return mods


class _AnySizeViT(nn.Module):
    """The model with its position table made for the input's grid inside the graph, so H and W stay
    symbolic: a learned table is resampled bilinearly, a sin-cos table regenerated, and the result goes in
    through the model's public `pos=` argument (the model's own forward runs; nothing is re-implemented).

    (`resample_pos_embed` turns sizes into Python ints, which would freeze them at export.)
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.model
        pos = m.pos_embed
        if pos is not None:
            (ph, pw), n_prefix, (oh, ow) = m.patch_embed.patch_size, m._pos_prefix, m.patch_embed.grid_size
            grid = (x.shape[-2] // ph, x.shape[-1] // pw)
            if m.cfg.is_sincos:
                table = m._sincos_table(grid)  # [1, N, D]
            else:
                table = pos[:, n_prefix:].reshape(1, oh, ow, -1).permute(0, 3, 1, 2)  # [1, D, oh, ow]
                table = F.interpolate(table, size=grid, mode="bilinear", align_corners=False)
                table = table.permute(0, 2, 3, 1).flatten(1, 2)  # [1, N, D]
            pos = torch.cat([pos[:, :n_prefix], table], dim=1)  # [1, P+N, D]
        return m(x, pos=pos)


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    dynamic_batch: bool = True,
    dynamic_size: bool = False,
    opset: int = 18,
    tol: float = 1e-4,
) -> dict[str, Any]:
    """Write `model` (fp32, eval) to `path` and check it against PyTorch in ONNX Runtime.

    Returns {"path", "max_abs_diff", "checked_shapes", "dynamic_batch", "dynamic_size", "opset"};
    raises ExportError when the largest logit difference exceeds `tol`.
    """
    _import_onnx("onnx", "onnxscript", "onnxruntime")  # torch.onnx's dynamo exporter, then the parity run
    net = copy.deepcopy(model).float().eval()  # the caller's model keeps its dtype and mode
    cfg = net.cfg
    has_pos = "pos_resample" in getattr(net, "capabilities", ())  # a position table to size for each input
    if dynamic_size and has_pos:
        net.cfg = cfg.replace(pos_interpolation="bilinear", pos_antialias=False)  # what the graph computes
    graph = _AnySizeViT(net).eval() if dynamic_size and has_pos else net
    C, (H, W), p = cfg.in_chans, cfg.img_size, getattr(cfg, "patch_size", 1)  # sizes: multiples of the patch
    gen = torch.Generator().manual_seed(0)
    example = torch.randn(2, C, H, W, generator=gen)
    dims: dict[int, Any] = {}
    if dynamic_batch:
        dims[0] = torch.export.Dim("batch", min=1, max=4096)
    if dynamic_size:
        dims[2] = p * torch.export.Dim("grid_h", min=1, max=1024)
        dims[3] = p * torch.export.Dim("grid_w", min=1, max=1024)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        program = torch.onnx.export(
            graph, (example,), dynamo=True, opset_version=opset, input_names=["images"],
            output_names=["logits"], dynamic_shapes={"x": dims} if dims else None, verbose=False,
        )
    except Exception as e:  # noqa: BLE001 - the exporter raises many kinds; keep the first line
        raise ExportError(f"torch.onnx.export failed: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    bilinear = {"pos_interpolation": "bilinear", "pos_antialias": False} if dynamic_size and has_pos else {}
    meta = {"family": model.family, "config": cfg.to_dict() | bilinear,
            "preprocess": model.preprocess.to_dict(), "class_names": model.class_names,
            "provenance": model.provenance, "dynamic_batch": dynamic_batch, "dynamic_size": dynamic_size}
    program.model.metadata_props[META_KEY] = json.dumps(meta)
    program.save(path)

    # parity: the batch sizes and image sizes the graph promises, against the PyTorch model
    shapes = [(2, H, W)] + ([(3, H, W)] if dynamic_batch else [])
    if dynamic_size:
        shapes.append((shapes[-1][0], H + p, W + 2 * p))
    runner = OnnxRunner(path)
    worst = 0.0
    for b, h, w in shapes:
        x = torch.randn(b, C, h, w, generator=gen)
        with torch.no_grad():
            expect = net(x).numpy()
        worst = max(worst, float(np.abs(runner(x.numpy()) - expect).max()))
    if not worst <= tol:
        raise ExportError(f"{path}: ONNX Runtime logits differ from PyTorch by {worst:.2e} (tolerance {tol:.0e})")
    return {"path": str(path), "max_abs_diff": worst, "checked_shapes": [list(s) for s in shapes],
            "dynamic_batch": dynamic_batch, "dynamic_size": dynamic_size, "opset": opset}


class _OneImageDetections(nn.Module):
    """A detector's first image as tensors: images [1, C, H, W] -> (boxes [n, 4], scores [n], labels [n])."""

    def __init__(self, detector: nn.Module):
        super().__init__()
        self.detector = detector

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        found = self.detector(x)[0]
        return found["boxes"], found["scores"], found["labels"]


def export_detector_onnx(detector: nn.Module, path: str | os.PathLike, *, opset: int = 17, tol: float = 1e-4,
                         examples: Iterable[torch.Tensor] = ()) -> dict[str, Any]:
    """Write a detector (`detects`: `detector(x)` -> torchvision's detections per image) to `path` and check it
    against PyTorch in ONNX Runtime: the same number of boxes, the same labels, boxes and scores within `tol`
    (relative to the image side for the boxes), on seeded noise at three contrasts and on `examples` (normalised
    images [C, H, W] at the input size; real ones give fewer boxes than noise, so the count is checked varying).
    Returns {"path", "task", "max_abs_diff", "checked_images", "box_counts", "opset", "exporter"}."""
    import warnings

    _import_onnx("onnx", "onnxruntime")
    net = _OneImageDetections(copy.deepcopy(detector).float().eval()).eval()
    C, H, W = (int(v) for v in detector.preprocess.input_size)
    gen = torch.Generator().manual_seed(0)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's notes on Python ints and shape asserts in torchvision
            torch.onnx.export(net, (torch.randn(1, C, H, W, generator=gen),), str(path), dynamo=False,
                              opset_version=opset, input_names=["images"], output_names=["boxes", "scores", "labels"],
                              dynamic_axes={"boxes": {0: "boxes"}, "scores": {0: "boxes"}, "labels": {0: "boxes"}})
    except Exception as e:  # noqa: BLE001 - the exporter raises many kinds; keep the first line
        raise ExportError(f"torch.onnx.export (TorchScript) of the detector failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}") from None
    onnx = _import_onnx("onnx")[0]
    graph = onnx.load(str(path))
    meta = {"task": "detect", "family": detector.family, "config": detector.model.cfg.to_dict(),
            "preprocess": detector.preprocess.to_dict(), "class_names": detector.class_names,
            "provenance": detector.provenance, "detector": detector.options, "dynamic_batch": False,
            "dynamic_size": False}
    onnx.helper.set_model_props(graph, {META_KEY: json.dumps(meta)})
    onnx.save(graph, str(path))

    runner = OnnxRunner(path)
    inputs = [torch.randn(1, C, H, W, generator=gen) * s for s in (1.0, 0.3, 0.0)] + [x[None] for x in examples]
    worst, counts = 0.0, []
    for x in inputs:
        with torch.no_grad():
            want = net(x)
        got = runner.session.run(None, {runner.input_name: x.numpy()})
        if got[0].shape[0] != want[0].shape[0] or not np.array_equal(got[2], want[2].numpy()):
            raise ExportError(f"{path}: ONNX Runtime finds {got[0].shape[0]} boxes where PyTorch finds "
                              f"{want[0].shape[0]} (or other labels)")
        counts.append(int(want[0].shape[0]))
        if counts[-1]:
            worst = max(worst, float(np.abs(got[0] - want[0].numpy()).max()) / max(H, W),
                        float(np.abs(got[1] - want[1].numpy()).max()))
    if not worst <= tol:
        raise ExportError(f"{path}: ONNX Runtime boxes or scores differ from PyTorch by {worst:.2e} (tolerance {tol:.0e})")
    return {"path": str(path), "task": "detect", "max_abs_diff": worst, "checked_images": len(inputs),
            "box_counts": counts, "opset": opset, "exporter": "torchscript"}


class OnnxRunner(InferenceOnly):
    """An exported vitkit model in ONNX Runtime, usable where predict/eval expect a model.

    `runner(images)` takes [B, C, H, W] as a numpy array or torch tensor and returns the logits [B, K]
    in the same kind. `preprocess`, `class_names`, `num_classes` and `cfg` come from the file's metadata.
    """

    untrainable = "an ONNX model cannot be trained"
    train_error = ExportError

    def __init__(self, path: str | os.PathLike, threads: int | None = None):
        (ort,) = _import_onnx("onnxruntime")

        self.path = Path(path)
        if not self.path.is_file():
            raise ExportError(f"{self.path}: no such ONNX file")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        try:
            self.session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - ORT raises its own untyped errors
            raise ExportError(f"{self.path}: ONNX Runtime cannot load it ({str(e).splitlines()[0]})") from None
        self.input_name = self.session.get_inputs()[0].name
        raw = self.session.get_modelmeta().custom_metadata_map.get(META_KEY)
        meta = json.loads(raw) if raw else {}
        self.meta = meta
        family = get_family(meta.get("family", "vit"))  # files from before the family key hold ViTs
        self.cfg = family.config.from_dict(meta["config"]) if "config" in meta else None
        self.preprocess = Preprocess.from_dict(meta["preprocess"]) if meta.get("preprocess") else None
        self.class_names = meta.get("class_names")
        self.provenance = dict(meta.get("provenance") or {})  # what the model was trained on (eval reads it)
        out_shape = self.session.get_outputs()[0].shape
        self.num_classes = self.cfg.num_classes if self.cfg else out_shape[-1]
        # an exported detector (export_detector_onnx): one image in, its boxes, scores and labels out
        self.detects = meta.get("task") == "detect"
        self.options = meta.get("detector")

    def detections(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """An exported detector on images [B, C, H, W] -> torchvision's detections per image (boxes [n, 4] xyxy
        on the input's pixels, scores [n], labels [n]), one graph run per image."""
        out = []
        for x in images.detach().float().cpu():
            boxes, scores, labels = self.session.run(None, {self.input_name: x[None].numpy()})
            out.append({"boxes": torch.from_numpy(boxes), "scores": torch.from_numpy(scores),
                        "labels": torch.from_numpy(labels)})
        return out

    def __call__(self, images):
        if isinstance(images, torch.Tensor):
            out = self.session.run(None, {self.input_name: images.detach().float().cpu().numpy()})[0]
            return torch.from_numpy(out)
        return self.session.run(None, {self.input_name: np.asarray(images, dtype=np.float32)})[0]


def quantize_int8(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Dynamic int8 quantisation (weights int8 per channel, activations quantised on the fly) of the
    matmuls; the metadata travels with it."""
    onnx, ort_quant = _import_onnx("onnx", "onnxruntime.quantization")
    QuantType, quantize_dynamic = ort_quant.QuantType, ort_quant.quantize_dynamic

    src, dst = Path(src), Path(dst)
    previous = logging.root.manager.disable  # the caller's level: put back as it was, not to NOTSET
    logging.disable(max(previous, logging.WARNING))  # it advises a pre-processing pass on every call
    try:
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul", "Gemm"])
    finally:
        logging.disable(previous)
    meta = {p.key: p.value for p in onnx.load(src, load_external_data=False).metadata_props}
    if meta:
        q = onnx.load(dst)
        onnx.helper.set_model_props(q, meta)
        onnx.save(q, dst)
    return dst


def compare_top1(models: dict[str, Callable], batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """Top-1 (%) of each model on the same labelled batches, and how often each agrees with the first."""
    names = list(models)
    correct = dict.fromkeys(names, 0)
    agree = dict.fromkeys(names, 0)
    n = 0
    with torch.no_grad():
        for x, y in batches:
            preds = {k: torch.as_tensor(np.asarray(m(x))).argmax(-1) for k, m in models.items()}  # [B] each
            for k in names:
                correct[k] += int((preds[k] == y).sum())
                agree[k] += int((preds[k] == preds[names[0]]).sum())
            n += len(y)
    n = max(n, 1)
    return {"count": n, "top1": {k: 100.0 * correct[k] / n for k in names},
            "agreement_with_" + names[0]: {k: 100.0 * agree[k] / n for k in names[1:]}}
