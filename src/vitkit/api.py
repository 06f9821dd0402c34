"""create_model / load_model / save_model: the entry points everything else goes through, for every family.

A checkpoint is read once into a `Checkpoint` (weights in the family's key names plus what the file says
about itself), whatever its format: vitkit's own files name their family and config; foreign layouts are
imported by key signature (weights.convert), each into the family its importer declares (a timm or original
Swin file is a Swin), and their architecture is read off the shapes: by the importer, or by the family's
`infer_config` (models.registry.Family) where the importer leaves it. What is particular to a family (how its
config is read off weights, what makes two configs one architecture, how a shape is described) is its Family
entry's, so nothing here names a family or its config fields.
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
from .models import FAMILIES, Preprocess, get_entry, get_family, list_models
from .models.registry import ModelEntry
from .weights.convert import StateDict, to_vitkit
from .weights.io import parse_vitkit_meta, read_any, read_safetensors_meta, resolve_path, save_checkpoint
from .weights.labels import imagenet1k_class_names, is_imagenet1k_tag
from .weights.layouts import hub_files
from .weights.load import load_into
from .weights.notes import note_once

log = logging.getLogger("vitkit")


@dataclass
class Checkpoint:
    path: str
    state_dict: StateDict
    layout: str  # "vitkit" or the foreign layout it was imported from
    family: str
    config: Any = None  # the family's config (vitkit files, most importers); None: the family's infer_config reads it
    preprocess: Preprocess | None = None
    class_names: list[str] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    hints: dict[str, Any] = field(default_factory=dict)  # config fields the foreign source states

    def head_classes(self, head_names: tuple[str, ...]) -> int | None:
        """Rows of the checkpoint's classifier head, or None when it has none (`head.weight`, or a
        `head.fc.weight` inside a head module as Swin's)."""
        w = next((self.state_dict[k] for k in (f"{head_names[0]}.weight", f"{head_names[0]}.fc.weight")
                  if k in self.state_dict), None) if head_names else None
        return int(w.shape[0]) if w is not None else None

    def tower(self, name: str) -> Checkpoint:
        """The part of a whole model (a CLIP pair, an MAE with its decoder, DINO with its head) that its family's
        model names `name` in `towers` (module, config field), as a checkpoint of that part's own family. A
        family that declares no towers is its own image tower (`tower("image")` is the checkpoint itself)."""
        towers = getattr(get_family(self.family).model, "towers", {})
        if name not in towers:
            if name == "image" and not towers:
                return self
            known = ", ".join(towers) or "none"
            raise ConfigError(f"a {self.family} model has no tower {name!r} (towers: {known})")
        module, config_field = towers[name]
        sub = getattr(self.config, config_field)
        family = next(f.name for f in FAMILIES.values() if type(sub) is f.config)
        prefix = f"{module}."
        sd = {k[len(prefix):]: v for k, v in self.state_dict.items() if k.startswith(prefix)}
        prov = {k: v for k, v in self.provenance.items() if k != "arch"}  # the whole's name is not the tower's
        prov |= {"tower": name} | ({"tower_of": self.provenance["arch"]} if "arch" in self.provenance else {})
        return dataclasses.replace(self, state_dict=sd, family=family, config=sub, class_names=None, provenance=prov)

    def as_family(self, family: str | None, what: str = "this model") -> Checkpoint:
        """This checkpoint, or the tower of it that is a `family` model (a ViT from a CLIP pair or an MAE), for
        loading into `what`."""
        if self.family == family:
            return self
        for name in getattr(get_family(self.family).model, "towers", {}):
            part = self.tower(name)
            if part.family == family:
                return part
        raise CheckpointError(f"{self.path} holds a {self.family} model; {what} is a {family} model")


# what a file name ends with, so that `vit_base_patch16_224.safetensors` (a missing file) is not read as a tag
_FILE_SUFFIXES = {"safetensors", "pth", "pt", "bin", "ckpt", "npz", "onnx", "json", "png", "jpg", "jpeg"}


def pretrained_name(source: str | os.PathLike) -> str | None:
    """`name.tag` when `source` names published weights rather than a file, else None.

    A string that is not an existing path and is a registered `name.tag`, or a bare registered name that has
    pretrained tags (its first tag is meant), names the hub weights `create_model(name, pretrained=True)`
    loads; every load path (load_model, read_checkpoint, checkpoint_family, so every command) accepts it.
    A registered name with an unknown tag, or without published weights, is a ConfigError that says so."""
    if not isinstance(source, str) or not source or source.startswith("bundled:") or "/" in source \
            or os.sep in source or os.path.exists(source):
        return None
    base, _, tag = source.partition(".")
    if base not in set(list_models()):
        return None
    entry = get_entry(base)
    if tag and tag in entry.pretrained:
        return source
    if tag.lower() in _FILE_SUFFIXES:
        return None  # a checkpoint file that is not there: the reader says so
    if not entry.pretrained:
        raise ConfigError(f"{source!r} is not a file, and {base} is a registered model without published weights: "
                          f"train it (`vitkit train --model {base}`) or pass a checkpoint file")
    if tag:
        raise ConfigError(f"{base} has no pretrained tag {tag!r}; known: {', '.join(entry.pretrained)} "
                          f"(`vitkit models {base}`)")
    return f"{base}.{next(iter(entry.pretrained))}"


def _published_class_names(name: str, num_classes: int | None) -> list[str] | None:
    """The class names published weights imply: ImageNet-1k's for a 1000-class head trained or fine-tuned on
    ImageNet-1k (an `in1k` tag), else None."""
    tag = name.partition(".")[2]
    return imagenet1k_class_names() if num_classes == 1000 and is_imagenet1k_tag(tag) else None


def _read_pretrained(name: str) -> Checkpoint:
    """The hub weights of `name.tag` (cached or downloaded), with the class names they imply."""
    from .weights.hub import download_weights, resolve_pretrained

    entry = get_entry(name)
    repo = resolve_pretrained(name, entry.hub)
    files = hub_files(entry.family)  # where the repo keeps this family's weights (a CLIP pair: open_clip's file)
    for i, filename in enumerate(files):
        try:
            path = download_weights(repo, filename)
            break
        except CheckpointError:  # no such file in the repo: the next choice, if any
            if i == len(files) - 1:
                raise
    ckpt = read_checkpoint(path)
    ckpt.provenance["source"] = f"hub:{repo}"
    if not ckpt.class_names:
        ckpt.class_names = _published_class_names(name, ckpt.head_classes(get_family(ckpt.family).model.head_names))
    return ckpt


def read_checkpoint(path: str | os.PathLike | dict) -> Checkpoint:
    """Any supported checkpoint file or HF folder, read once (see weights.io.read_any and weights.convert);
    a pretrained `name.tag` (see `pretrained_name`) reads its hub file; a dict is a checkpoint already read
    (`torch.load(..., weights_only=True)` of a foreign file), imported by its keys."""
    if isinstance(path, dict):
        imported = to_vitkit(path)
        return Checkpoint("state dict", imported.state_dict, imported.layout, imported.family, imported.config,
                          imported.preprocess, imported.class_names, {"source": "state dict"}, dict(imported.hints))
    name = pretrained_name(path)
    if name is not None:
        return _read_pretrained(name)
    raw, meta, hf_config = read_any(path)
    vk = parse_vitkit_meta(meta, path)
    if vk is not None:
        fam = get_family(vk["family"])
        return Checkpoint(str(path), raw, "vitkit", fam.name, fam.config.from_dict(vk["config"]),
                          Preprocess.from_dict(vk["preprocess"]) if vk["preprocess"] else None,
                          vk["class_names"] or None, dict(vk["provenance"] or {}))
    imported = to_vitkit(raw, hf_config)  # the importer's layout declares the family
    return Checkpoint(str(path), imported.state_dict, imported.layout, imported.family, imported.config,
                      imported.preprocess, imported.class_names, {"source": str(path)}, dict(imported.hints))


def checkpoint_family(path: str | os.PathLike) -> str:
    """The model family a checkpoint holds: a vitkit file's header alone; a foreign file is imported (its
    layout declares the family: a Swin file is a Swin, the ViT layouts are ViTs)."""
    name = pretrained_name(path)
    if name is not None:
        return get_entry(name).family
    p = resolve_path(path)
    if p.is_file() and p.suffix.lower() == ".safetensors":
        vk = parse_vitkit_meta(read_safetensors_meta(p), p)
        if vk is not None:
            return vk["family"]
    return read_checkpoint(path).family


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
    ckpt = None
    if pretrained and checkpoint_path is None:
        if not entry.pretrained:
            from .weights.hub import LOCAL_WEIGHTS_HINT

            raise ConfigError(f"no pretrained weights are registered for {entry.name}; {LOCAL_WEIGHTS_HINT}")
        tag = name.partition(".")[2] or next(iter(entry.pretrained))
        ckpt = _read_pretrained(f"{entry.name}.{tag}")
    elif checkpoint_path is not None:
        ckpt = read_checkpoint(checkpoint_path)
    model = _build(entry, ckpt, num_classes, img_size, overrides)
    if ckpt is not None:
        _load(model, ckpt, strict=True)
        if str(ckpt.provenance.get("source", "")).startswith("hub:"):
            model.provenance["source"] = ckpt.provenance["source"]
    return with_fast_paths(model)


def _build(entry: ModelEntry, ckpt: Checkpoint | None, num_classes, img_size, overrides: dict) -> nn.Module:
    if ckpt is not None:
        ckpt = ckpt.as_family(entry.family, entry.name)  # a whole model's file gives the tower of this family
    _check_patch_size(get_family(entry.family), entry.cfg, overrides.get("patch_size"), with_weights=ckpt is not None)
    if num_classes is None and ckpt is not None:
        num_classes = ckpt.head_classes(get_family(entry.family).model.head_names)
    if num_classes is not None:
        overrides["num_classes"] = num_classes
    if img_size is not None:
        overrides["img_size"] = img_size
    return entry.build(**overrides)


def _patch_families() -> str:
    return ", ".join(f.name for f in FAMILIES.values() if "patch_resample" in getattr(f.model, "capabilities", ()))


def _check_patch_size(fam, cfg, patch_size, *, with_weights: bool) -> None:
    """patch_size=P asked of a family: its weights are resampled to P where the family can (`patch_resample`,
    layers.patch_embed); one line otherwise: a family without patches, or one whose weights fix it (Swin)."""
    if patch_size is None or "patch_resample" in getattr(fam.model, "capabilities", ()):
        return
    own = getattr(cfg, "patch_size", None)
    if own is None:
        raise ConfigError(f"a {fam.name} model has no patch size to change: patch_size applies to "
                          f"{_patch_families()} models")
    if with_weights and patch_size != own:
        raise ConfigError(f"a {fam.name} model's weights fix its patch size at {own} (valid: patch_size={own}); "
                          f"weights are resampled to another patch size for {_patch_families()} models only")


def set_patch_size(model, patch_size: int) -> None:
    """Run `model` with `patch_size`-pixel patches from now on, in place: its patch kernel resampled from its
    original one (FlexiViT's pseudo-inverse resize) and the position grid following (`set_input_size`).
    One line for a model that cannot (another family, an exported model)."""
    if "patch_resample" not in getattr(model, "capabilities", ()):
        what = f"a {model.family} model" if hasattr(model, "family") else f"a {type(model).__name__} (exported)"
        raise ConfigError(f"{what} cannot change its patch size: patch sizes change on PyTorch "
                          f"{_patch_families()} models (an exported model: export it at that patch size)")
    model.set_input_size(patch_size=patch_size)


def set_merge(model, r: int) -> None:
    """Token merging (ToMe) from now on, in place: `r` tokens merged per block (0: none, the plain model). One
    line for a model without patch tokens to merge, or an `r` its patch count refuses."""
    if not hasattr(model, "set_merge"):
        what = f"a {model.family} model" if hasattr(model, "family") else f"a {type(model).__name__} (exported)"
        raise ConfigError(f"{what} cannot merge tokens: token merging (ToMe) runs on PyTorch ViTs")
    model.set_merge(r)


def set_max_tokens(model, n: int) -> None:
    """Images at their own aspect ratio from now on, in place (NaFlex): each resized, keeping its aspect ratio, to
    the largest patch grid with at most `n` patches and batched padded with masks (layers/naflex.py); 0: square
    inputs again. One line for a model that cannot (no patch tokens, an exported model, rotary positions...)."""
    if "native_aspect" not in getattr(model, "capabilities", ()):
        what = f"a {model.family} model" if hasattr(model, "family") else f"a {type(model).__name__} (exported)"
        raise ConfigError(f"{what} cannot take images at their own aspect ratio (--max-tokens): that runs on "
                          "PyTorch ViTs with learned or sin-cos positions")
    model.set_max_tokens(n)


def _at_max_tokens(model: nn.Module, n: int | None) -> nn.Module:
    if n is not None:
        set_max_tokens(model, n)
    return model


def load_weights(model: nn.Module, path: str | os.PathLike, strict: bool = True) -> dict:
    """Load any supported checkpoint into an existing model (with adaptation, see weights.load)."""
    return _load(model, read_checkpoint(path), strict)


def _load(model: nn.Module, ckpt: Checkpoint, strict: bool) -> dict:
    ckpt = ckpt.as_family(getattr(model, "family", None))
    if ckpt.class_names and model.num_classes == len(ckpt.class_names):
        model.class_names = list(ckpt.class_names)
    check_hints = get_family(model.family).check_hints
    if check_hints is not None:
        check_hints(model.cfg, ckpt.hints, ckpt.path)
    report = load_into(model, ckpt.state_dict, strict=strict, source=ckpt.path)
    model.provenance.setdefault("source", ckpt.path)
    model.provenance["imported_from"] = ckpt.layout
    log.info("loaded %s (%s layout)", ckpt.path, ckpt.layout)
    return report | {"layout": ckpt.layout}


def load_model(
    path: str | os.PathLike | dict,
    *,
    model_name: str | None = None,
    tower: str | None = None,
    num_classes: int | None = None,
    img_size: int | tuple[int, int] | None = None,
    device: str | torch.device = "cpu",
    max_tokens: int | None = None,
    **overrides: Any,
) -> nn.Module:
    """Rebuild a model of any registered family from a file alone (or a foreign checkpoint already read, a dict).

    vitkit files carry their family and config; foreign checkpoints are imported and their architecture is
    read off the shapes (plus config.json for HF folders). A pretraining file gives the whole model: a CLIP
    pair (both towers), an MAE with its decoder, DINO with its head; `tower="image"` gives its image model alone
    (the ViT; any other model is its own image tower). `model_name` forces a registered architecture.
    `num_classes`, `img_size` and config overrides (e.g. `in_chans=1`) adapt the model as it loads;
    `max_tokens` feeds images at their own aspect ratio within that many patches (`set_max_tokens`).
    """
    name = pretrained_name(path)
    if name is not None and model_name in (None, name.partition(".")[0]) and tower is None:
        # published weights by name: the registered architecture and preprocessing, the hub's weights
        return _at_max_tokens(create_model(name, pretrained=True, num_classes=num_classes, img_size=img_size,
                                           **overrides), max_tokens).to(device)
    ckpt = read_checkpoint(path)
    if tower is not None:
        ckpt = ckpt.tower(tower)
    source = ckpt.path
    if max_tokens is not None:
        overrides[MAX_TOKENS] = max_tokens
    img_size, overrides = _with_inference_settings(ckpt.provenance, img_size, overrides)
    max_tokens = overrides.pop(MAX_TOKENS, None)  # the caller's, else the stored setting's: not a config field
    if model_name is not None:
        model = _build(get_entry(model_name), ckpt, num_classes, img_size, overrides)
        _load(model, ckpt, strict=True)
        return with_fast_paths(_at_max_tokens(model, max_tokens)).to(device)
    fam = get_family(ckpt.family)
    cfg = ckpt.config
    _check_patch_size(fam, cfg, overrides.get("patch_size"), with_weights=True)
    # the importer gave the whole config; else the family's reader assumes what the weights do not show
    read_whole_config = cfg is not None
    changes = fam.translate_kwargs(dict(overrides)) if (overrides and fam.translate_kwargs) else dict(overrides)
    guessed = None
    if cfg is not None and ckpt.layout != "vitkit" and ckpt.preprocess is None:  # a foreign file with its config
        ckpt.preprocess, guessed = _registered_preprocess(fam, cfg, source)
    if cfg is None:
        # what the caller states of what the weights cannot show is known: nothing to assume for it
        stated = {k: v for k, v in changes.items() if k in fam.unrecorded_fields and v is not None}
        cfg = fam.read_config(ckpt.state_dict, dict(ckpt.hints) | stated, source)
        if ckpt.preprocess is None:
            ckpt.preprocess, guessed = _guess_preprocess(fam, cfg, source)
    trained_classes = cfg.num_classes
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
    prov = _true_arch(ckpt.provenance, fam, cfg)
    if read_whole_config and ckpt.layout != "vitkit" and "arch" not in prov:
        # a foreign file with a registered name's architecture (as given, or as the overrides made it)
        named = guessed if guessed in list_models(family=ckpt.family) else _registered_name(fam.name, cfg)
        if named:
            prov["arch"] = named
    model = fam.model(cfg, preprocess=pre, class_names=class_names, provenance=prov)
    load_into(model, ckpt.state_dict, strict=True, source=source)
    model.provenance["imported_from"] = ckpt.layout
    if guessed:
        model.provenance["preprocess_from"] = guessed
    return with_fast_paths(_at_max_tokens(model, max_tokens)).to(device)


INFERENCE_SETTINGS = "inference_settings"  # provenance key: the setting a checkpoint runs at by default
MAX_TOKENS = "max_tokens"  # a stored setting's override that is the preprocessing's, not the config's


def _with_inference_settings(provenance: dict[str, Any] | None, img_size, overrides: dict[str, Any]):
    """(img_size, overrides) with the checkpoint's stored default inference settings (`vitkit tradeoff
    --save`: a resolution and config overrides such as the patch size or token merging) filled in where the
    caller set none; the weights in such a file are the original ones, so each setting starts from the
    original kernel and position table."""
    stored = (provenance or {}).get(INFERENCE_SETTINGS)
    if not isinstance(stored, dict):
        return img_size, overrides
    if img_size is None and stored.get("img_size"):
        img_size = int(stored["img_size"])
    overrides = dict(stored.get("overrides") or {}) | dict(overrides)
    log.info("%s: at its stored inference settings (%s)", provenance.get("source", "checkpoint"),
             stored.get("label", "img_size and overrides"))
    return img_size, overrides


def _registered_name(family: str, cfg) -> str | None:
    """The registered name of `family` whose config is exactly `cfg`, if any."""
    return next((n for n in list_models(family=family) if get_entry(n).cfg == cfg), None)


def with_fast_paths(model: nn.Module, device: str = "cpu") -> nn.Module:
    """Each fast-path switch the model's modules have, set as this machine's decisions for `device` say (`vitkit
    doctor`): a path measured slower than timm's on this machine stays off. Every builder here calls it; a module
    tree built by hand can too."""
    from .hardware import apply_fast_paths, this_machine

    apply_fast_paths(model, this_machine(device))
    return model


def _shape_key(fam, cfg) -> Any:
    """What makes `cfg` one architecture with a registered config of its family (equal keys), for
    preprocessing: the family's `shape_key`, else every field but those a load adapts."""
    if fam.shape_key is not None:
        return fam.shape_key(cfg)
    return {k: v for k, v in cfg.to_dict().items() if k not in _ADAPTED}


def _guess_preprocess(fam, cfg, source: str) -> tuple[Preprocess | None, str]:
    """Preprocessing for weights that record none, from the registered models of the same shape.

    -> (Preprocess or None for the model's default, what it came from). All matching names agree: theirs,
    silently. They disagree (timm's ViT-B/16 augreg uses mean/std 0.5, DeiT-B the ImageNet statistics): the
    paper models' (the family's own listing group, `vit_*`: timm's augreg), with one line naming the
    alternative and how to pick it. No match: the ImageNet default, with one line saying how to set it."""
    own = _shape_key(fam, cfg)
    matches = [e for e in (get_entry(n) for n in list_models(family=fam.name)) if _shape_key(fam, e.cfg) == own]
    stats = {(tuple(e.mean), tuple(e.std), e.interpolation, e.crop_pct) for e in matches}
    how = (f"convert it once with `vitkit convert {source} OUT.safetensors --mean M,M,M --std S,S,S` "
           "(or --model NAME) and use OUT")
    if not matches:
        note_once(f"{source} records no preprocessing and matches no registered model: assuming ImageNet mean/std; "
                  f"if it was trained otherwise, {how}")
        return None, "default (guessed)"
    if len(stats) == 1:
        e = matches[0]
        return e.preprocess(cfg), e.name
    pick = next((e for e in matches if e.group == fam.name), matches[0])
    other = next(e for e in matches if (tuple(e.mean), tuple(e.std)) != (tuple(pick.mean), tuple(pick.std))
                 or (e.interpolation, e.crop_pct) != (pick.interpolation, pick.crop_pct))
    note_once(f"{source} records no preprocessing: using {pick.name}'s (mean {_fmt(pick.mean)}, std {_fmt(pick.std)}, "
              f"crop {pick.crop_pct}); for a {other.name} checkpoint (mean {_fmt(other.mean)}) convert it once with "
              f"`vitkit convert {source} OUT.safetensors --model {other.name}` and use OUT")
    return pick.preprocess(cfg), f"{pick.name} (guessed)"


def _registered_preprocess(fam, cfg, source: str) -> tuple[Preprocess | None, str]:
    """The preprocessing of a foreign checkpoint whose importer gave its config: that of the registered name of
    its family with the same architecture (head and regularisation aside), else None (the family's default,
    with one line saying so) -> (preprocess, where it came from)."""
    own = _shape_key(fam, cfg)
    for name in list_models(family=fam.name):
        e = get_entry(name)
        if _shape_key(fam, e.cfg) == own:
            return e.preprocess(cfg), name
    note_once(f"{source} records no preprocessing and matches no registered {fam.name} model: using the family's "
              f"default; if it was trained otherwise, convert it once with `vitkit convert {source} OUT.safetensors "
              "--mean M,M,M --std S,S,S` and use OUT")
    return None, "default (guessed)"


def _fmt(values) -> str:
    return ",".join(f"{v:g}" for v in values) if len(set(values)) > 1 else f"{values[0]:g}"


# config fields a checkpoint may change without being another architecture (create_model adapts them at load)
_ADAPTED = {"num_classes", "img_size", "in_chans", "drop_rate", "pos_drop_rate", "attn_drop_rate", "proj_drop_rate",
            "drop_path_rate", "weight_init", "pos_interpolation", "pos_antialias"}


def _true_arch(provenance: dict, fam, cfg) -> dict:
    """A provenance `arch` that names a registered model whose architecture the config does not have (a recipe's
    model_args changed it) is replaced by the real shape; `base_arch` and `model_args` keep the recipe."""
    prov = dict(provenance or {})
    arch = prov.get("arch")
    if not isinstance(arch, str) or "model_args" in prov or arch not in set(list_models()):
        return prov
    entry = get_entry(arch)
    if entry.family != fam.name:
        return prov
    ref, own = entry.cfg.to_dict(), cfg.to_dict()
    diff = {k: v for k, v in own.items() if k not in _ADAPTED and ref.get(k) != v}
    if not diff:
        return prov
    if fam.describe_shape is not None:
        shape = f"{fam.name} {fam.describe_shape(cfg)}"
    else:
        shape = f"{arch} with " + ", ".join(f"{k}={v}" for k, v in diff.items())
    return prov | {"arch": shape, "base_arch": arch, "model_args": diff}


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
