"""One module per foreign checkpoint layout; importing this package registers them all."""
from . import timm_native  # noqa: F401
