"""create_model / load_model / save_model: the entry points everything else goes through, for every family.

A checkpoint is read once into a `Checkpoint` (weights in the family's key names plus what the file says
about itself), whatever its format: vitkit's own files name their family and config; foreign layouts are
imported by key signature (weights.convert) and their ViT architecture is read off the shapes.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import CheckpointError, ConfigError
from .models import Preprocess, get_entry, get_family
from .models.registry import ModelEntry
from .weights.convert import StateDict, to_vitkit
from .weights.infer import infer_config
from .weights.io import parse_vitkit_meta, read_any, read_safetensors_meta, resolve_path, save_checkpoint
from .weights.load import load_into

log = logging.getLogger("vitkit")


@dataclass
class Checkpoint:
    path: str
    state_dict: StateDict
    layout: str  # "vitkit" or the foreign layout it was imported from
    family: str
    config: Any = None  # the family's config (vitkit files); None: read it off the weights
    preprocess: Preprocess | None = None
    class_names: list[str] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    hints: dict[str, Any] = field(default_factory=dict)  # config fields the foreign source states

    def head_classes(self, head_names: tuple[str, ...]) -> int | None:
        """Rows of the checkpoint's classifier head, or None when it has none."""
        w = self.state_dict.get(f"{head_names[0]}.weight") if head_names else None
        return int(w.shape[0]) if w is not None else None


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Any supported checkpoint file or HF folder, read once (see weights.io.read_any and weights.convert)."""
    raw, meta, hf_config = read_any(path)
    vk = parse_vitkit_meta(meta, path)
    if vk is not None:
        fam = get_family(vk["family"])
        return Checkpoint(str(path), raw, "vitkit", fam.name, fam.config.from_dict(vk["config"]),
                          Preprocess.from_dict(vk["preprocess"]) if vk["preprocess"] else None,
                          vk["class_names"] or None, dict(vk["provenance"] or {}))
    imported = to_vitkit(raw, hf_config)  # every foreign layout vitkit reads is a ViT
    return Checkpoint(str(path), imported.state_dict, imported.layout, "vit", None, imported.preprocess,
                      imported.class_names, {"source": str(path)}, dict(imported.hints))


def checkpoint_family(path: str | os.PathLike) -> str:
    """The model family a checkpoint holds, from a vitkit file's header alone (foreign layouts are ViTs)."""
    p = resolve_path(path)
    if p.is_file() and p.suffix.lower() == ".safetensors":
        vk = parse_vitkit_meta(read_safetensors_meta(p), p)
        if vk is not None:
            return vk["family"]
    return "vit"


def create_model(
    name: str,
    *,
    pretrained: bool = False,
    checkpoint_path: str | os.PathLike | None = None,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    **overrides: Any,
) -> nn.Module:
    """A registered model by name (`vitkit models` lists them), optionally with weights.

    Weights come from the hub (`pretrained=True`, timm-format repos, cached) or any supported file
    (`checkpoint_path`: vitkit/timm safetensors, .pth/.bin, JAX .npz, HF folders, DeiT/MAE/DINO/DINOv2/
    CLIP layouts). Without `num_classes` a checkpoint's head is kept as it is (a CLIP tower's image
    projection, a fine-tuned head); a different `num_classes` re-initialises the head; a different
    `img_size` resamples the position embeddings; `in_chans=1` adapts 3-channel patch filters. timm's
    keyword names (act_layer, reg_tokens, no_embed_class, ...) are accepted.
    """
    entry = get_entry(name)
    ckpt, source = None, None
    if pretrained and checkpoint_path is None:
        from .weights.hub import download_weights, resolve_pretrained

        repo_id = resolve_pretrained(name, entry.hub)
        checkpoint_path, source = download_weights(repo_id), f"hub:{repo_id}"
    if checkpoint_path is not None:
        ckpt = read_checkpoint(checkpoint_path)
    model = _build(entry, ckpt, num_classes, img_size, overrides)
    if ckpt is not None:
        _load(model, ckpt, strict=True)
        if source:
            model.provenance["source"] = source
    return model


def _build(entry: ModelEntry, ckpt: Checkpoint | None, num_classes, img_size, overrides: dict) -> nn.Module:
    if ckpt is not None and ckpt.family != entry.family:
        raise CheckpointError(f"{ckpt.path} holds a {ckpt.family} model; {entry.name} is a {entry.family} model")
    if num_classes is None and ckpt is not None:
        num_classes = ckpt.head_classes(get_family(entry.family).model.head_names)
    if num_classes is not None:
        overrides["num_classes"] = num_classes
    if img_size is not None:
        overrides["img_size"] = img_size
    return entry.build(**overrides)


def load_weights(model: nn.Module, path: str | os.PathLike, strict: bool = True) -> dict:
    """Load any supported checkpoint into an existing model (with adaptation, see weights.load)."""
    return _load(model, read_checkpoint(path), strict)


def _load(model: nn.Module, ckpt: Checkpoint, strict: bool) -> dict:
    family = getattr(model, "family", None)
    if family != ckpt.family:
        raise CheckpointError(f"{ckpt.path} holds a {ckpt.family} model; this model is a {family} model")
    if ckpt.class_names and model.num_classes == len(ckpt.class_names):
        model.class_names = list(ckpt.class_names)
    _check_hints(model, ckpt.hints, ckpt.path)
    report = load_into(model, ckpt.state_dict, strict=strict, source=ckpt.path)
    model.provenance.setdefault("source", ckpt.path)
    model.provenance["imported_from"] = ckpt.layout
    log.info("loaded %s (%s layout)", ckpt.path, ckpt.layout)
    return report | {"layout": ckpt.layout}


def _check_hints(model: nn.Module, hints: dict, path) -> None:
    """What the source says about the architecture vs the model it is loaded into: a different head
    count scrambles attention (an error); activation / LayerNorm eps differ only slightly (logged)."""
    heads = hints.get("num_heads")
    if heads is not None and heads != getattr(model.cfg, "num_heads", heads):
        raise CheckpointError(f"{path}: the checkpoint has {heads} attention heads, the model "
                              f"{model.cfg.num_heads} (pass num_heads={heads} or pick the matching --model)")
    for name in ("act", "norm_eps"):
        if name in hints and hints[name] != getattr(model.cfg, name, hints[name]):
            log.info("%s: the checkpoint was trained with %s=%r, the model uses %r (outputs differ slightly; "
                     "pass %s=%r to match)", path, name, hints[name], getattr(model.cfg, name), name, hints[name])


def load_model(
    path: str | os.PathLike,
    *,
    model_name: str | None = None,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    device: str | torch.device = "cpu",
    **overrides: Any,
) -> nn.Module:
    """Rebuild a model of any registered family from a file alone.

    vitkit files carry their family and config; foreign checkpoints are imported and their architecture is
    read off the shapes (plus config.json for HF folders). `model_name` forces a registered architecture.
    `num_classes`, `img_size` and config overrides (e.g. `in_chans=1`) adapt the model as it loads.
    """
    ckpt = read_checkpoint(path)
    if model_name is not None:
        model = _build(get_entry(model_name), ckpt, num_classes, img_size, overrides)
        _load(model, ckpt, strict=True)
        return model.to(device)
    fam = get_family(ckpt.family)
    cfg = ckpt.config
    if cfg is None:
        try:
            cfg = infer_config(ckpt.state_dict, ckpt.hints)
        except CheckpointError:
            raise
        except Exception as e:  # shapes that do not form a ViT
            raise CheckpointError(f"{path}: cannot infer a ViT architecture from the weights ({e})") from None
    trained_classes = cfg.num_classes
    changes = fam.translate_kwargs(dict(overrides)) if (overrides and fam.translate_kwargs) else dict(overrides)
    if num_classes is not None:
        changes["num_classes"] = num_classes
    if img_size is not None:
        changes["img_size"] = img_size
    if changes:
        cfg = cfg.replace(**changes)
    pre = ckpt.preprocess
    if pre is not None:  # the stored statistics, at the (possibly new) size and channel count
        pre = dataclasses.replace(pre, input_size=(pre.input_size[0], *cfg.img_size)).for_channels(cfg.in_chans)
    class_names = ckpt.class_names if cfg.num_classes == trained_classes else None
    model = fam.model(cfg, preprocess=pre, class_names=class_names, provenance=ckpt.provenance)
    load_into(model, ckpt.state_dict, strict=True, source=str(path))
    model.provenance["imported_from"] = ckpt.layout
    return model.to(device)


def save_model(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    class_names: list[str] | None = None,
    provenance: dict[str, Any] | None = None,
    preprocess: Preprocess | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """vitkit safetensors: weights + family + config + preprocessing + class names + provenance, written
    atomically. `dtype` (e.g. torch.float16) stores floating-point weights smaller; loading casts them back
    to the model's dtype."""
    family = getattr(model, "family", None)
    if family is None:
        raise ConfigError(f"cannot save a {type(model).__name__}: not a model of a registered vitkit family")
    fam = get_family(family)
    pre = preprocess or model.preprocess
    names = class_names if class_names is not None else model.class_names
    if names is not None and model.num_classes and len(names) != model.num_classes:
        raise CheckpointError(f"{len(names)} class names for a {model.num_classes}-class head")
    prov = dict(model.provenance) | dict(provenance or {})
    prov.setdefault("params", sum(p.numel() for p in model.parameters()))
    if fam.cost is not None:
        prov.setdefault("gmacs", round(sum(fam.cost(model.cfg)["macs"].values()) / 1e9, 4))
    sd = model.state_dict()
    if dtype is not None:
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
        prov["stored_dtype"] = str(dtype).replace("torch.", "")
    return save_checkpoint(path, sd, model.cfg.to_dict(), pre.to_dict(), names, prov, family=family)
