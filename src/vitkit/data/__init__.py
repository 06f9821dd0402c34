"""Data: image files, datasets, and the transforms built from a model's preprocessing.

timm's data API is here by timm's names, `resolve_data_config` and `create_transform`
(vitkit.data.transforms); they load on first use (PEP 562), so `import vitkit.data` does not import
torchvision until one is used."""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"create_transform": "transforms", "resolve_data_config": "transforms"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'vitkit.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = list(_LAZY)
