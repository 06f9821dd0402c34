"""vitkit: Vision Transformers you can build, import, train, look inside and ship."""
from .errors import CheckpointError, ConfigError, DataError, ImageError, OfflineError, VitkitError
from .models.config import Preprocess, ViTConfig
from .api import create_model, load_model, load_weights, save_model
from .models.registry import decode_variant, list_models, model_config
from .models.vision_transformer import VisionTransformer

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "ImageError",
    "OfflineError",
    "Preprocess",
    "ViTConfig",
    "VisionTransformer",
    "VitkitError",
    "__version__",
    "create_model",
    "decode_variant",
    "list_models",
    "load_model",
    "load_weights",
    "model_config",
    "save_model",
]
