"""vitkit: Vision Transformers you can build, import, train, look inside and ship."""
from ._version import __version__  # a neutral module, so any layer may import the version
from .api import create_model, load_model, load_weights, save_model
from .errors import CheckpointError, ConfigError, DataError, ImageError, OfflineError, VitkitError
from .models import (
    Preprocess,
    ResNet,
    ResNetConfig,
    VisionTransformer,
    ViTConfig,
    VitkitModel,
    decode_variant,
    list_models,
    model_config,
)

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "ImageError",
    "OfflineError",
    "Preprocess",
    "ResNet",
    "ResNetConfig",
    "ViTConfig",
    "VisionTransformer",
    "VitkitError",
    "VitkitModel",
    "__version__",
    "create_model",
    "decode_variant",
    "list_models",
    "load_model",
    "load_weights",
    "model_config",
    "save_model",
]
