"""vitkit: Vision Transformers you can build, import, train, look inside and ship.

The public names load on first use (PEP 562), so `import vitkit` and the `vitkit` command start without
importing torch until something needs it.
"""
from __future__ import annotations

from ._lazy import lazy_exports
from ._version import __version__  # a neutral module, so any layer may import the version
from .errors import CheckpointError, ConfigError, DataError, ImageError, OfflineError, VitkitError

_LAZY = {
    "create_model": "api", "load_model": "api", "load_weights": "api", "save_model": "api",
    "Preprocess": "models", "ResNet": "models", "ResNetConfig": "models", "ViTConfig": "models",
    "VisionTransformer": "models", "VitkitModel": "models", "decode_variant": "models", "list_models": "models",
    "model_config": "models", "runner": "export",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


__all__ = ["CheckpointError", "ConfigError", "DataError", "ImageError", "OfflineError", "VitkitError",
           "__version__", *_LAZY]
