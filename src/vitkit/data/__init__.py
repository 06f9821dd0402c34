"""Data: image files, datasets, and the transforms built from a model's preprocessing.

timm's data API is here by timm's names, `resolve_data_config` and `create_transform`
(vitkit.data.transforms); they load on first use (PEP 562), so `import vitkit.data` does not import
torchvision until one is used."""
from __future__ import annotations

from .._lazy import lazy_exports

_LAZY = {"create_transform": "transforms", "resolve_data_config": "transforms"}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


__all__ = list(_LAZY)
