from .config import Preprocess, ViTConfig
from .factory import create_model, load_model, save_model
from .registry import list_models
from .vision_transformer import VisionTransformer

__all__ = ["Preprocess", "ViTConfig", "VisionTransformer", "create_model", "list_models", "load_model", "save_model"]
