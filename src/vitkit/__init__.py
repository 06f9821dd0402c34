"""vitkit: Vision Transformers you can build, import, train, look inside and ship."""
from .errors import CheckpointError, ConfigError, DataError, ImageError, OfflineError, VitkitError
from .models.config import Preprocess, ViTConfig
from .models.factory import create_model, load_model, load_weights, save_model
from .models.registry import decode_variant, list_models, model_config
from .models.vision_transformer import VisionTransformer

__version__ = "0.1.0"

__all__ = [
    "VisionTransformer", "ViTConfig", "Preprocess", "create_model", "load_model", "load_weights", "save_model",
    "list_models", "model_config", "decode_variant", "VitkitError", "ConfigError", "CheckpointError",
    "ImageError", "DataError", "OfflineError", "__version__",
]
