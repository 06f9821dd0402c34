"""One module per foreign checkpoint layout; importing this package registers them all."""
from . import clip, dinov2, hf_transformers, hybrid, jax_npz, swin, timm_native, torchvision_vit  # noqa: F401
