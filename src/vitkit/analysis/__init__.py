"""Looking inside a ViT: attention weights and rollout (`attention`), mean attention distance
(`distance`), position-embedding similarity and patch-filter components (`embeddings`), the
figures (`figures`), and inputs for them (`inputs`)."""
from .attention import (
    attention_rollout,
    attention_weights,
    cls_attention,
    explain,
    grad_rollout,
    object_mass,
    rollout_matrix,
)
from .distance import mean_attention_distance, model_attention_distance
from .embeddings import patch_filter_components, pos_embed_similarity

__all__ = [
    "attention_rollout", "attention_weights", "cls_attention", "explain", "grad_rollout",
    "mean_attention_distance", "model_attention_distance", "object_mass", "patch_filter_components",
    "pos_embed_similarity", "rollout_matrix",
]
