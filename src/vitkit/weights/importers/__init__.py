"""One module per foreign checkpoint layout; importing this package registers them all."""
from . import clip, dinov2, hf_transformers, jax_npz, timm_native, torchvision_vit  # noqa: F401
