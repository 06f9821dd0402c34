"""What the server does with a loaded model, without any HTTP: preprocess an image, classify a batch,
embed a batch, explain one image as a PNG overlay, search an index, detect boxes (a detection run's
detector), and describe the model.

Predictions follow `vitkit.inference.predict_files` step for step (eval transform, softmax of the float
logits, top-k), and detections `vitkit.inference.detect_files` (eval transform, the run's DetectTask.detect,
boxes in the upload's own pixels), so an upload gets the same answer as `vitkit predict` on the same file."""
from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..data.transforms import eval_transform, stack_inputs
from ..errors import ConfigError
from ..inference import as_detector, box_entries, input_note, source_of, top_entries
from ..models import require
from ..models.features import pooled_features
from ..training.models import in_chans

DISPLAY_SIDE = 256  # explain overlays are scaled up to about this many pixels on the long side


class ModelService:
    """A loaded model (a vitkit model or an `OnnxRunner`) behind the server's operations."""

    def __init__(self, model, name: str, backend: str = "torch", index=None, index_path: str | None = None):
        model = as_detector(model) or model  # an exported detector's ONNX runner gets `detect`
        self.model = model.eval()
        self.name, self.backend = name, backend
        self.index, self.index_path = index, index_path
        self.channels = in_chans(model)
        self.transform = eval_transform(model.preprocess)
        self.is_torch = isinstance(model, torch.nn.Module)
        self.detects = bool(getattr(model, "detects", False))  # boxes (/v1/detect), not class scores

    # ----------------------------------------------------------------------------------- description
    def info(self) -> dict[str, Any]:
        m = self.model
        pre = m.preprocess
        provenance = dict(getattr(m, "provenance", None) or {})
        return {
            "name": self.name, "backend": self.backend,
            "family": getattr(m, "family", None) or provenance.get("family"),
            "arch": provenance.get("arch"), "num_classes": int(m.num_classes),
            "classes": list(m.class_names) if m.class_names else None,
            "preprocessing": pre.to_dict() if hasattr(pre, "to_dict") else None,
            "provenance": provenance,
            "task": "detect" if self.detects else "classify",
            "detector": ({"kind": m.options["detector"]} | m.options if self.detects else None),
            "operations": self.operations(),
            "index": None if self.index is None else {"path": self.index_path, "size": _len(self.index),
                                                       "model_identity": getattr(self.index, "model_identity", None)},
        }

    def operations(self) -> dict[str, bool]:
        caps = getattr(self.model, "capabilities", frozenset())
        if self.detects:  # the backbone's classifier was never trained: boxes are all a detector answers
            return {"predict": False, "embed": False, "explain": False, "search": False, "detect": True}
        return {"predict": True, "embed": self.is_torch, "explain": self.is_torch and "attention_maps" in caps,
                "search": self.is_torch and self.index is not None, "detect": False}

    # ----------------------------------------------------------------------------------- inputs
    def prepare(self, image: Image.Image) -> torch.Tensor:
        """Decoded image -> model input [C, H, W], exactly as predict_files prepares a file."""
        return self.transform(image)

    def describe_input(self, image: Image.Image, name: str) -> dict[str, Any]:
        """What the upload was ({width, height, channels, mode}) and predict's one-line input note, if any."""
        source = source_of(image)
        return {"image": name, "source": source, "note": input_note(self.model, [{"image": name, "source": source}])}

    # ----------------------------------------------------------------------------------- batched work
    def predict_batch(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Inputs [C, H, W] each -> class probabilities [K] each (one model call for the batch)."""
        with torch.no_grad():
            probs = self.model(stack_inputs(xs)).float().softmax(-1)  # [B, K]
        return list(probs)

    def top(self, probs: torch.Tensor, k: int) -> list[dict[str, Any]]:
        """predict_files' top-k entries [{label, index, prob}] from probabilities [K]."""
        return top_entries(probs, self.model.class_names, k)

    def detect_batch(self, jobs: list[tuple[torch.Tensor, tuple[int, int]]]) -> list[list[dict[str, Any]]]:
        """(input [C, H, W], the upload's (H, W)) each -> its boxes [{label, index, score, box}], highest score
        first, in the upload's pixels (one detector call for the batch)."""
        self.require("detect")
        found = self.model.detect(torch.stack([x for x, _ in jobs]), [size for _, size in jobs])  # [B, C, H, W] in
        return [box_entries(d, self.model.class_names) for d in found]

    def embed_batch(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Inputs [C, H, W] each -> the pooled features before the classifier [D] each (`forward_head(pre_logits=True)`;
        a CLIP model's is its projected image embedding, `encode_image`)."""
        self.require("embed")
        x = stack_inputs(xs)  # [B, C, H, W] (a PatchBatch with --max-tokens)
        with torch.no_grad():
            feats = pooled_features(self.model, x)
        return list(feats.float())  # [B, D] -> B x [D]

    # ----------------------------------------------------------------------------------- one image
    def explain_png(self, image: Image.Image, method: str = "rollout", target: int | None = None) -> tuple[bytes, dict]:
        """The heat map of `method` over the pixels the model saw, blended on the image, as PNG bytes; and
        {method, target, peak_patch, grid, input_size}. The same maps as `vitkit explain`
        (`analysis.attention.explain` on `analysis.inputs.prepare`), drawn compactly for a web page."""
        from ..analysis.attention import explain
        from ..analysis.inputs import prepare
        from ..analysis.report import peak_patch

        self.require("explain")
        if target is not None and not 0 <= target < self.model.num_classes:
            raise ConfigError(f"class {target} out of range: the model has {self.model.num_classes} classes")
        x, raw = prepare(self.model, image)  # [1, C, H, W] normalised, [C, H, W] in [0, 1]
        amap, logits, _ = explain(self.model, x, method, target)  # amap [1, Gh, Gw]
        shown = target if target is not None else int(logits[0].argmax())
        png = overlay_png(raw, amap[0])
        gh, gw = amap.shape[-2:]
        return png, {"method": method, "target": shown, "peak_patch": list(peak_patch(amap[0])),
                     "grid": [int(gh), int(gw)], "input_size": [int(x.shape[-2]), int(x.shape[-1])]}

    def check_index(self) -> None:
        """Refuse (one line, at start) an index built from another model's features: its scores would mean
        nothing for our queries."""
        from ..retrieval import model_identity

        ident = self.index.model_identity
        self.require("search")
        self.index.check_identity(model_identity(self.model, self.name, ident.get("feature", "pooled"),
                                                 ident.get("normalized", True)))

    def search_batch(self, jobs: list[tuple[torch.Tensor, int]]) -> list[list[dict[str, Any]]]:
        """(input [C, H, W], k) each -> the index's k nearest entries: the features the index was built with
        (`vitkit.retrieval.features_of`, one model call for the batch), then one FAISS search for the whole
        batch with the largest k, each request keeping its own first k (the top k of a longer ranked list).
        Only what the index stores comes back (path, label, score, row), never a file's contents."""
        from ..retrieval import features_of

        ident = self.index.model_identity
        x = torch.stack([x for x, _ in jobs])  # [B, C, H, W]
        q = features_of(self.model, x, ident.get("feature", "pooled"), ident.get("normalized", True))  # [B, D]
        q = q.numpy().astype(np.float32)
        ranked = self.index.search(q, max(k for _, k in jobs))  # B lists of up to max-k hits
        return [[{"path": str(h.path), "label": h.label, "score": float(h.score), "row": int(h.row)}
                 for h in hits[:k]] for hits, (_, k) in zip(ranked, jobs)]

    def require(self, op: str) -> None:
        """Refuse an operation the model cannot do, in one line (a ConfigError: a 4xx answer)."""
        if self.detects and op != "detect":
            raise ConfigError(f"{self.name} is a detector: POST the image to /v1/detect for its boxes (/v1/{op} "
                              "is for classifiers)")
        if op == "detect" and not self.detects:
            raise ConfigError(f"{self.name} is a classifier: /v1/detect needs a task=detect run's checkpoint (with "
                              "detection_head.safetensors beside it); POST to /v1/predict for its classes")
        if op == "search" and self.index is None:
            raise ConfigError("no index: start the server with --index INDEX to enable /v1/search")
        if not self.is_torch and op in ("embed", "explain", "search"):
            raise ConfigError(f"{op} needs a PyTorch model: the ONNX file ({self.name}) only gives class scores; "
                              "serve the .safetensors checkpoint for it")
        if op == "explain":
            require(self.model, "attention_maps", "explain")


def overlay_png(raw: torch.Tensor, amap: torch.Tensor, alpha: float = 0.5) -> bytes:
    """Image [C, H, W] in [0, 1] with the min-max scaled map [Gh, Gw] over it in 'jet' (as `vitkit explain`
    draws it), scaled up to about DISPLAY_SIDE pixels, as PNG bytes."""
    from matplotlib import colormaps

    c, h, w = raw.shape
    scale = max(1, round(DISPLAY_SIDE / max(h, w)))
    big = torch.nn.functional.interpolate(raw[None].float(), scale_factor=scale, mode="nearest")[0]  # [C, sH, sW]
    img = big.expand(3, -1, -1).permute(1, 2, 0).numpy()  # [sH, sW, 3]: gray shown as RGB
    heat = torch.nn.functional.interpolate(amap.float()[None, None], size=img.shape[:2], mode="bilinear",
                                           align_corners=False)[0, 0]  # [sH, sW]
    lo, hi = float(heat.min()), float(heat.max())
    heat = (heat - lo) / (hi - lo) if hi > lo else torch.zeros_like(heat)
    colour = colormaps["jet"](heat.numpy())[..., :3]  # [sH, sW, 3]
    blend = np.clip((1 - alpha) * img + alpha * colour, 0, 1)
    buf = io.BytesIO()
    Image.fromarray((blend * 255).round().astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _len(index) -> int | None:
    try:
        return len(index)
    except TypeError:
        return None
