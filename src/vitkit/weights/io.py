"""Reading checkpoint files safely, and vitkit's own format (safetensors + config/provenance metadata).

Nothing here unpickles arbitrary objects: safetensors and npz (allow_pickle=False) carry only arrays,
and pickle-based files go through `torch.load(weights_only=True)`, which refuses code.
"""
from __future__ import annotations

import argparse
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError

# 2: the file names its model family (`vitkit.family`). Format 1 files (no family key) still load, see
# `_upgrade_format_1`.
FORMAT_VERSION = 2
META_PREFIX = "vitkit."


def _check_file(path: Path) -> None:
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if path.is_file() and path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty (0 bytes)")


def read_safetensors_meta(path: str | os.PathLike) -> dict[str, str]:
    """The header metadata of a safetensors file, without reading any tensor."""
    from safetensors import safe_open

    path = Path(path)
    _check_file(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except Exception as e:  # safetensors raises several types for bad headers / truncation
        raise _unreadable_safetensors(path, e) from None


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors.torch import load_file

    meta = read_safetensors_meta(path)
    try:
        return load_file(str(path)), meta
    except Exception as e:
        raise _unreadable_safetensors(Path(path), e) from None


def _unreadable_safetensors(path: Path, e: Exception) -> CheckpointError:
    return CheckpointError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e}); "
                           "it may be truncated or corrupted")


def read_torch(path: str | os.PathLike) -> dict[str, Any]:
    """A .pth/.bin/.pt file through the weights-only unpickler (no code can run)."""
    path = Path(path)
    _check_file(path)
    try:
        # DINO/DeiT/MAE training checkpoints store their argparse.Namespace: a plain attribute bag,
        # safe to rebuild (anything inside it still goes through the weights-only allowlist)
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        msg = str(e).split("\n")[0]
        if "weights_only" in str(e) or "Unsupported global" in str(e) or "UnpicklingError" in type(e).__name__:
            # torch's first line is generic; the line that names the refused object is the useful one
            named = [ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln or "Unsupported" in ln]
            raise CheckpointError(
                f"{path}: refused: this pickle needs more than tensors and plain containers to load "
                f"({named[0] if named else msg}). vitkit never unpickles code from files; if you trust the "
                "file, convert it to safetensors in your own environment first") from None
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({type(e).__name__}: {msg}); "
                              "it may be truncated or corrupted") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, found {type(obj).__name__}")
    return obj


def read_npz(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    path = Path(path)
    _check_file(path)
    try:
        with np.load(str(path), allow_pickle=False) as z:
            return {k: torch.from_numpy(np.ascontiguousarray(z[k])) for k in z.files}
    except Exception as e:  # damaged archives raise BadZipFile, zlib.error, NotImplementedError, ValueError...
        msg = " ".join(str(e).split())[:300]
        raise CheckpointError(f"{path}: not a readable .npz archive ({type(e).__name__}: {msg})") from None


BUNDLED = {"fashion-mnist": "vit_fashion_mnist.safetensors"}  # shipped inside the package (assets/)


# a hub folder's weights, first choice first: open_clip's file of a CLIP pair before timm's file of its image tower
# beside it (the whole model; `tower="image"` takes the tower from it)
HF_WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin", "model.safetensors",
                   "pytorch_model.bin", "model.npz")
RUN_CHECKPOINTS = ("best.safetensors", "last.safetensors")  # a `vitkit train` run folder, best first


def resolve_path(path: str | os.PathLike) -> Path:
    """`bundled:NAME` -> the checkpoint shipped with vitkit; a `vitkit train` run folder -> its
    best.safetensors (else last.safetensors), said once on stderr; anything else is a filesystem path."""
    text = str(path)
    if text.startswith("bundled:"):
        name = text[len("bundled:"):]
        if name not in BUNDLED:
            raise CheckpointError(f"no bundled checkpoint {name!r}; vitkit ships: "
                                  + ", ".join(f"bundled:{n}" for n in BUNDLED))
        return Path(__file__).resolve().parents[1] / "assets" / BUNDLED[name]
    p = Path(path)
    if p.is_dir() and not any((p / n).exists() for n in HF_WEIGHT_FILES):
        for name in RUN_CHECKPOINTS:
            if (p / name).is_file():
                from .notes import note_once

                note_once(f"{p} is a run folder: using {p / name}")
                return p / name
    return p


# The first bytes of the image formats people pass by mistake where a checkpoint goes.
_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
                (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))


def image_kind(head: bytes) -> str | None:
    """'PNG', 'JPEG', ... when `head` (a file's first 12 bytes) starts an image file, else None."""
    if head[8:9] == b"{":  # a safetensors header (8-byte length, then JSON) can start with any bytes
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    if head[:2] == b"BM" and head[6:10] != b"\0\0\0\0":  # BMP's reserved bytes are zero
        return None
    return next((kind for magic, kind in _IMAGE_MAGIC if head.startswith(magic)), None)


def _check_kind(path: Path, head: bytes) -> None:
    """Files that are not checkpoints at all, named for what they are (not a generic "unreadable")."""
    kind = image_kind(head)
    if kind is not None:
        raise CheckpointError(f"{path} is an image, not a checkpoint ({kind} data): give the model first "
                              "(a .safetensors/.pth file, a run folder or a pretrained name), then the images")
    if path.suffix.lower() == ".onnx":
        raise CheckpointError(f"{path} is an ONNX model, not a checkpoint: `vitkit predict` and `vitkit eval` run it "
                              "(they pick --backend onnx for .onnx files); other commands need the checkpoint it "
                              "was exported from")


def read_any(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, str], dict[str, Any] | None]:
    """Read a checkpoint file or HF directory -> (raw state dict, safetensors metadata, HF config or None).

    `bundled:fashion-mnist` names the checkpoint shipped with vitkit."""
    path = resolve_path(path)
    hf_config = None
    if path.is_dir():
        cfg_file = path / "config.json"
        for name in HF_WEIGHT_FILES:
            if (path / name).exists():
                weights = path / name
                break
        else:
            raise CheckpointError(f"{path}: a directory without model.safetensors / pytorch_model.bin / model.npz "
                                  "(an HF model folder) or best.safetensors / last.safetensors (a run folder)")
        if cfg_file.exists():
            try:
                hf_config = json.loads(cfg_file.read_text())
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{cfg_file}: invalid JSON ({e})") from None
        proc_file = path / "preprocessor_config.json"  # HF image processor settings (mean/std/resize)
        if proc_file.exists():
            try:
                hf_config = (hf_config or {}) | {"_preprocessor_config": json.loads(proc_file.read_text())}
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{proc_file}: invalid JSON ({e})") from None
        sd, meta, _ = read_any(weights)
        return sd, meta, hf_config
    _check_file(path)
    with open(path, "rb") as f:
        head = f.read(12)
    _check_kind(path, head)
    if head[:4] == b"PK\x03\x04":  # a zip: numpy's .npz or torch's zip-pickle
        try:
            with zipfile.ZipFile(path) as z:
                is_torch = any(n.endswith("data.pkl") for n in z.namelist())
        except Exception:  # a damaged zip raises BadZipFile, NotImplementedError, OSError...: decide by name
            is_torch = path.suffix.lower() in (".pth", ".pt", ".bin", ".ckpt")
        if not is_torch:
            return read_npz(path), {}, None
        return read_torch(path), {}, None
    if path.suffix.lower() == ".safetensors" or (len(head) >= 9 and head[8:9] == b"{"):
        sd, meta = read_safetensors(path)
        return sd, meta, None
    return read_torch(path), {}, None


# ---------------------------------------------------------------------------- vitkit's own format
def save_checkpoint(
    path: str | os.PathLike,
    state_dict: dict[str, torch.Tensor],
    config: dict[str, Any],
    preprocess: dict[str, Any] | None = None,
    class_names: list[str] | None = None,
    provenance: dict[str, Any] | None = None,
    family: str = "vit",
) -> Path:
    """Write weights + everything needed to rebuild and use them (the family and its config), atomically."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from .._files import atomic_path

    meta = {
        META_PREFIX + "format_version": str(FORMAT_VERSION),
        META_PREFIX + "family": family,
        META_PREFIX + "config": json.dumps(config),
        META_PREFIX + "preprocess": json.dumps(preprocess or {}),
        META_PREFIX + "class_names": json.dumps(class_names or []),
        META_PREFIX + "provenance": json.dumps(provenance or {}),
    }
    # safetensors refuses shared or non-contiguous storage; give it plain copies
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=meta)
    except (OSError, SafetensorError) as e:  # a full disk, a read-only folder: the old file is untouched
        raise CheckpointError(f"{path}: could not write the checkpoint ({' '.join(str(e).split())}); "
                              "any previous file at this path is unchanged") from None
    return path


def parse_vitkit_meta(meta: dict[str, str], path: Path | str = "") -> dict[str, Any] | None:
    """vitkit metadata -> dict(family, config, preprocess, class_names, provenance), or None for foreign files."""
    key = META_PREFIX + "format_version"
    if key not in meta:
        return None
    try:
        version = int(meta[key])
    except ValueError:
        raise CheckpointError(f"{path}: unreadable vitkit format version {meta[key]!r}") from None
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written by a newer vitkit (format {version}; this one reads up to {FORMAT_VERSION}); "
            "upgrade vitkit to load it")
    out = {}
    for field in ("config", "preprocess", "class_names", "provenance"):
        try:
            out[field] = json.loads(meta.get(META_PREFIX + field, "null"))
        except json.JSONDecodeError:
            raise CheckpointError(f"{path}: corrupted vitkit metadata field {field!r}") from None
    if not isinstance(out["config"], dict):
        raise CheckpointError(f"{path}: vitkit metadata has no model config")
    if version == 1:
        return _upgrade_format_1(out)
    out["family"] = meta.get(META_PREFIX + "family") or ""
    if not out["family"]:
        raise CheckpointError(f"{path}: vitkit metadata names no model family")
    return out


def _upgrade_format_1(vk: dict[str, Any]) -> dict[str, Any]:
    """Format 1 had no family key: its ResNet baselines are recognised by `arch`, everything else is a ViT.
    Its sin-cos position tables put the row (h) first; they are named `sincos_hw` so a new grid is
    regenerated the way the model was trained (format 2's `sincos` is MAE's column-first table)."""
    cfg = dict(vk["config"])
    if str(cfg.get("arch", "")).startswith("resnet"):
        return vk | {"family": "resnet"}
    if cfg.get("pos_embed") == "sincos":
        cfg["pos_embed"] = "sincos_hw"
    return vk | {"family": "vit", "config": cfg}
