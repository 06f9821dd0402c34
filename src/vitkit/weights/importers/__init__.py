"""One module per foreign checkpoint layout; importing this package registers them all (weights.layouts)."""
from . import (  # noqa: F401
    clip,
    clip_text,
    dino,
    dinov2,
    hf_mobilevit,
    hf_transformers,
    hybrid,
    jax_npz,
    mae,
    swin,
    timm_native,
    torchvision_mobilenet,
    torchvision_vit,
)
