"""Model families behind one registry. Importing this package registers every family and its names."""
from . import clip, dino, hybrid, mae, mobilenet, mobilevit, resnet, swin, vit_variants  # noqa: F401  (registers the families and names)
from .config import ModelConfig, Preprocess, ViTConfig
from .protocol import VitkitModel, require
from .registry import FAMILIES, get_entry, get_family, list_models, model_config, register_family, register_model
from .resnet import ResNet, ResNetConfig
from .vision_transformer import VisionTransformer
from .vit_variants import decode_variant

__all__ = [
    "FAMILIES",
    "ModelConfig",
    "Preprocess",
    "ResNet",
    "ResNetConfig",
    "ViTConfig",
    "VisionTransformer",
    "VitkitModel",
    "decode_variant",
    "get_entry",
    "get_family",
    "list_models",
    "model_config",
    "register_family",
    "register_model",
    "require",
]
