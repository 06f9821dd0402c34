"""create_model / load_model / save_model: the three entry points everything else goes through."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError
from .models.config import Preprocess, ViTConfig, default_preprocess
from .models.registry import get_entry, model_config
from .models.vision_transformer import VisionTransformer

log = logging.getLogger("vitkit")


def _attach_meta(model: VisionTransformer, preprocess: Preprocess | None, class_names=None, provenance=None):
    model.preprocess = preprocess or default_preprocess(model.cfg)
    model.class_names = list(class_names) if class_names else None
    model.provenance = dict(provenance or {})
    return model


def build_model(cfg: ViTConfig, preprocess: Preprocess | None = None, **meta) -> VisionTransformer:
    return _attach_meta(VisionTransformer(cfg), preprocess, **meta)


def create_model(
    name: str,
    *,
    pretrained: bool = False,
    checkpoint_path: str | os.PathLike | None = None,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    **overrides: Any,
) -> VisionTransformer:
    """A registered model by name (`vitkit models` lists them), optionally with weights.

    Weights come from the hub (`pretrained=True`, timm-format repos, cached) or any supported file
    (`checkpoint_path`: vitkit/timm safetensors, .pth/.bin, JAX .npz, HF folders, DeiT/MAE/DINO/DINOv2/
    CLIP layouts). A different `num_classes` re-initialises the head; a different `img_size` resamples
    the position embeddings; `in_chans=1` adapts 3-channel patch filters.
    """
    entry = get_entry(name)
    if num_classes is not None:
        overrides["num_classes"] = num_classes
    if img_size is not None:
        overrides["img_size"] = img_size
    cfg = model_config(name, **overrides)
    pre = default_preprocess(cfg, mean=entry.mean, std=entry.std, crop_pct=entry.crop_pct,
                             interpolation=entry.interpolation)
    model = build_model(cfg, pre, provenance={"arch": entry.name})
    if pretrained and checkpoint_path is None:
        from .weights.hub import download_weights, resolve_pretrained

        repo_id = resolve_pretrained(name, entry.hub)
        checkpoint_path = download_weights(repo_id)
        model.provenance["source"] = f"hub:{repo_id}"
    if checkpoint_path is not None:
        load_weights(model, checkpoint_path)
    return model


def load_weights(model: VisionTransformer, path: str | os.PathLike, strict: bool = True) -> dict:
    """Load any supported checkpoint into an existing model (with adaptation, see weights.load)."""
    from .weights.convert import to_vitkit
    from .weights.io import parse_vitkit_meta, read_any
    from .weights.load import load_into

    raw, meta, hf_config = read_any(path)
    vk = parse_vitkit_meta(meta, path)
    if vk is not None:
        sd, layout = raw, "vitkit"
        if vk.get("class_names") and model.num_classes == len(vk["class_names"]):
            model.class_names = vk["class_names"]
    else:
        imported = to_vitkit(raw, hf_config)
        sd, layout = imported.state_dict, imported.layout
        _check_hints(model, imported.hints, path)
    report = load_into(model, sd, strict=strict, source=str(path))
    model.provenance.setdefault("source", str(path))
    model.provenance["imported_from"] = layout
    log.info("loaded %s (%s layout)", path, layout)
    return report | {"layout": layout}


def _check_hints(model: VisionTransformer, hints: dict, path) -> None:
    """What the source says about the architecture vs the model it is loaded into: a different head
    count scrambles attention (an error); activation / LayerNorm eps differ only slightly (logged)."""
    heads = hints.get("num_heads")
    if heads is not None and heads != model.cfg.num_heads:
        raise CheckpointError(f"{path}: the checkpoint has {heads} attention heads, the model "
                              f"{model.cfg.num_heads} (pass num_heads={heads} or pick the matching --model)")
    for field in ("act", "norm_eps"):
        if field in hints and hints[field] != getattr(model.cfg, field):
            log.info("%s: the checkpoint was trained with %s=%r, the model uses %r (outputs differ slightly; "
                     "pass %s=%r to match)", path, field, hints[field], getattr(model.cfg, field), field, hints[field])


def load_model(
    path: str | os.PathLike,
    *,
    model_name: str | None = None,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    device: str | torch.device = "cpu",
    **overrides: Any,
) -> VisionTransformer:
    """Rebuild a model from a file alone.

    vitkit files carry their config; foreign checkpoints are imported and their architecture is read
    off the shapes (plus config.json for HF folders). `model_name` forces a registered architecture.
    """
    from .weights.convert import to_vitkit
    from .weights.infer import infer_config
    from .weights.io import parse_vitkit_meta, read_any
    from .weights.load import load_into

    raw, meta, hf_config = read_any(path)
    vk = parse_vitkit_meta(meta, path)
    arch = str((vk or {}).get("config", {}).get("arch", ""))
    if arch.startswith("resnet"):
        raise CheckpointError(f"{path} is a {arch} baseline, not a ViT: use `vitkit eval`/`predict`, or "
                              "vitkit.training.models.load_any in Python")
    if model_name is not None:
        model = create_model(model_name, num_classes=num_classes, img_size=img_size, **overrides)
        load_weights(model, path)
        return model.to(device)
    if vk is not None:
        cfg = ViTConfig.from_dict(vk["config"])
        pre = Preprocess.from_dict(vk["preprocess"]) if vk["preprocess"] else None
        sd, layout, hints = raw, "vitkit", {}
        class_names, provenance = vk["class_names"], vk["provenance"] or {}
    else:
        imported = to_vitkit(raw, hf_config)
        sd, layout, hints = imported.state_dict, imported.layout, imported.hints
        try:
            cfg = infer_config(sd, hints)
        except CheckpointError:
            raise
        except Exception as e:  # shapes that do not form a ViT
            raise CheckpointError(f"{path}: cannot infer a ViT architecture from the weights ({e})") from None
        pre, class_names, provenance = hints.get("_preprocess"), hints.get("_class_names"), {"source": str(path)}
        cfg = cfg.replace(**{k: v for k, v in hints.items() if not k.startswith("_")})
    trained_classes = cfg.num_classes
    changes = dict(overrides)
    if num_classes is not None:
        changes["num_classes"] = num_classes
    if img_size is not None:
        changes["img_size"] = img_size
    if changes:
        cfg = cfg.replace(**changes)
    if pre is not None:
        pre = Preprocess(pre.mean, pre.std, pre.interpolation, pre.crop_pct, (cfg.in_chans, *cfg.img_size))
    if cfg.num_classes != trained_classes:
        class_names = None
    model = build_model(cfg, pre, class_names=class_names, provenance=provenance)
    load_into(model, sd, strict=True, source=str(path))
    model.provenance["imported_from"] = layout
    return model.to(device)


def save_model(
    model: VisionTransformer,
    path: str | os.PathLike,
    *,
    class_names: list[str] | None = None,
    provenance: dict[str, Any] | None = None,
    preprocess: Preprocess | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """vitkit safetensors: weights + config + preprocessing + class names + provenance, written atomically.

    `dtype` (e.g. torch.float16) stores floating-point weights smaller; loading casts them back to the
    model's dtype."""
    from .weights.io import save_checkpoint

    pre = preprocess or getattr(model, "preprocess", None) or default_preprocess(model.cfg)
    names = class_names if class_names is not None else getattr(model, "class_names", None)
    if names is not None and model.num_classes and len(names) != model.num_classes:
        raise CheckpointError(f"{len(names)} class names for a {model.num_classes}-class head")
    prov = dict(getattr(model, "provenance", {}) or {}) | dict(provenance or {})
    prov.setdefault("params", sum(p.numel() for p in model.parameters()))
    if isinstance(model, VisionTransformer):
        from .analysis.cost import mac_counts

        prov.setdefault("gmacs", round(sum(mac_counts(model.cfg).values()) / 1e9, 4))
    sd = model.state_dict()
    if dtype is not None:
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
        prov["stored_dtype"] = str(dtype).replace("torch.", "")
    return save_checkpoint(path, sd, model.cfg.to_dict(), pre.to_dict(), names, prov)
