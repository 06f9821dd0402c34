"""Building blocks of a Vision Transformer, each small enough to read in one sitting."""
from .attention import Attention, AttentionMap
from .block import Block, DropPath, LayerScale
from .mlp import Mlp, QuickGELU, make_act
from .patch_embed import PatchEmbed
from .pos_embed import resample_pos_embed, sincos_2d_pos_embed

__all__ = [
    "Attention",
    "AttentionMap",
    "Block",
    "DropPath",
    "LayerScale",
    "Mlp",
    "PatchEmbed",
    "QuickGELU",
    "make_act",
    "resample_pos_embed",
    "sincos_2d_pos_embed",
]
