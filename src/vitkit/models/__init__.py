from .config import Preprocess, ViTConfig
from .registry import list_models
from .vision_transformer import VisionTransformer

__all__ = ["Preprocess", "ViTConfig", "VisionTransformer", "list_models"]
