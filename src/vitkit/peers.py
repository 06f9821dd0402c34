"""Peer twins: the same architecture built in another library, holding the same weights, so vitkit can be
compared with it output for output (tests) and step for step (`vitkit bench`, benchmarks/gpu.py).

A model has a timm twin when it says how to build one: `timm_twin_kwargs()` returns the keyword arguments of
timm's plain VisionTransformer (the vit family has it), so nothing here asks which family a model is.
"""
from __future__ import annotations

from .errors import ConfigError


def timm_vit_class():
    """timm's VisionTransformer class, or ConfigError naming the extra that installs timm."""
    try:
        from timm.models.vision_transformer import VisionTransformer
    except ImportError:
        raise ConfigError("bench compares vitkit with timm, which is not installed: "
                          "pip install 'vitkit[bench]'") from None
    return VisionTransformer


def check_twin(model) -> dict:
    """timm's keyword arguments for `model`'s twin; ConfigError unless timm's plain VisionTransformer can express
    it (the config is read only, so a model built on the meta device will do)."""
    twin_kwargs = getattr(model, "timm_twin_kwargs", None)  # the model's own declaration, not its family name
    if twin_kwargs is None:
        arch = (getattr(model, "provenance", None) or {}).get("arch", "model")
        raise ConfigError(f"{arch}: bench compares models with timm's VisionTransformer; a "
                          f"{getattr(model, 'family', type(model).__name__)} model has no twin")
    return twin_kwargs()


def timm_twin(model):
    """timm's VisionTransformer with the same architecture, holding the same weights (timm key names)."""
    timm_vit = timm_vit_class()
    twin = timm_vit(**check_twin(model))
    twin.load_state_dict(model.state_dict())
    twin.pos_embed.requires_grad_(model.pos_embed.requires_grad)  # a fixed sin-cos table stays fixed
    return twin
