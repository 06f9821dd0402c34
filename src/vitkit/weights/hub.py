"""`pretrained=True`: timm-format weights on the Hugging Face hub, through huggingface_hub's cache."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError, OfflineError


def hub_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:
        return os.path.expanduser("~/.cache/huggingface/hub")


def download_weights(repo_id: str, filename: str = "model.safetensors") -> Path:
    """Path of `filename` from hub repo `repo_id`, from the cache when present.

    Offline (or HF_HUB_OFFLINE=1) and not cached: an OfflineError naming the cache and the
    `checkpoint_path=` alternative, at once rather than after a long network timeout.
    """
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise OfflineError("pretrained=True needs huggingface_hub: pip install 'vitkit[hub]'; "
                           "or pass checkpoint_path= to a local file") from None
    try:
        return Path(hf_hub_download(repo_id, filename, etag_timeout=5))
    except Exception as e:  # the hub raises many types: offline, not found, HTTP errors
        raise OfflineError(
            f"could not get {repo_id}/{filename} ({type(e).__name__}); it is not in the cache at "
            f"{hub_cache_dir()} and the hub is not reachable. Download it where there is a network "
            "(same cache layout) or pass checkpoint_path=/path/to/weights (.safetensors/.pth/.npz or an HF folder)"
        ) from None


def resolve_pretrained(name: str, hub: dict[str, str]) -> str:
    """'vit_base_patch16_224.augreg_in21k_ft_in1k' or a bare name (first known tag) -> hub repo id."""
    base, _, tag = name.partition(".")
    if not hub:
        raise ConfigError(f"no pretrained weights are registered for {base}; pass checkpoint_path=")
    if tag:
        if tag not in hub:
            raise ConfigError(f"{base} has no pretrained tag {tag!r}; known: {', '.join(hub)}")
        return hub[tag]
    return next(iter(hub.values()))
