"""Building blocks of a Vision Transformer, each small enough to read in one sitting.

Layers are chosen by name from small tables (EMBED_LAYERS, MLP_LAYERS) so configs can store the name;
`register_layer` adds one (a hybrid stem, a new MLP) without touching the model.
"""
from torch import nn

from .attention import Attention, AttentionMap
from .block import Block, DropPath, LayerScale
from .mlp import MLP_LAYERS, DepthwiseConvMlp, Mlp, QuickGELU, SwiGLU, SwiGLUPacked, make_act
from .patch_embed import EMBED_LAYERS, PatchEmbed
from .pooling import AttentionPoolLatent
from .pos_embed import resample_pos_embed, sincos_2d_pos_embed
from .rel_pos import RelPosMlp
from .rope import ROPES, Rope2d, apply_rope

_TABLES = {"embed": EMBED_LAYERS, "mlp": MLP_LAYERS}


def register_layer(kind: str, name: str):
    """Decorator: make a layer class available to configs as `embed_layer=name` or `mlp_layer=name`."""
    def add(cls: type[nn.Module]) -> type[nn.Module]:
        _TABLES[kind][name] = cls
        return cls

    return add


def layer_name(kind: str, layer: str | type[nn.Module]) -> str:
    """The registered name of a layer given by name or class (a config can only store names)."""
    from ..errors import ConfigError

    table = _TABLES[kind]
    if isinstance(layer, str):
        if layer not in table:
            raise ConfigError(f"unknown {kind} layer {layer!r}; registered: {', '.join(sorted(table))}")
        return layer
    for name, cls in table.items():
        if cls is layer:
            return name
    raise ConfigError(f"{getattr(layer, '__name__', layer)} is not a registered {kind} layer; register it with "
                      f"vitkit.layers.register_layer({kind!r}, NAME) so checkpoints can name it")


__all__ = [
    "EMBED_LAYERS",
    "MLP_LAYERS",
    "Attention",
    "AttentionMap",
    "AttentionPoolLatent",
    "Block",
    "DepthwiseConvMlp",
    "DropPath",
    "LayerScale",
    "Mlp",
    "PatchEmbed",
    "QuickGELU",
    "ROPES",
    "RelPosMlp",
    "Rope2d",
    "SwiGLU",
    "SwiGLUPacked",
    "apply_rope",
    "layer_name",
    "make_act",
    "register_layer",
    "resample_pos_embed",
    "sincos_2d_pos_embed",
]
