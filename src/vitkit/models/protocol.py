"""The model protocol: what the trainer, save/load, export, explain, bench and the CLI may rely on.

Every registered family implements it (VisionTransformer, SwinTransformer, ResNet, ClipModel), the feature
contract of models/features.py included (`feature_info`, `forward_intermediates`, `output_fmts`).
Capabilities only some families have are named in `capabilities` and checked with `require`, which refuses
with one line.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ..errors import ConfigError
from .config import Preprocess

# capability -> what needs it (for the one-line refusal)
CAPABILITIES = {
    "attention_maps": "attention maps (rollout, explain, analyze)",
    "pos_resample": "a position table to resample",
    "intermediates": "forward_intermediates",
    "token_seam": "token masking / dropping (MAE, DINOv2)",
    "encode_text": "a CLIP pair (image and text towers)",
}


@runtime_checkable
class VitkitModel(Protocol):
    family: str  # set on the class by registry.register_family
    cfg: Any  # the family's config (a JsonConfig dataclass); saved with every checkpoint
    num_classes: int
    num_features: int  # width of forward_head(pre_logits=True)
    head_names: tuple[str, ...]  # classifier modules: re-initialised for new classes, own LR when fine-tuning
    capabilities: frozenset[str]
    output_fmts: tuple[str, ...]  # the layouts forward_intermediates gives ("NCHW" always)
    # declared in __init__ (torchvision's weight metadata): how inputs are prepared, labels, where from
    preprocess: Preprocess
    class_names: list[str] | None
    provenance: dict[str, Any]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor: ...

    # the feature contract (models/features.py): maps for dense heads, described by feature_info
    @property
    def feature_info(self) -> list[dict]: ...

    def forward_intermediates(self, x: torch.Tensor, indices=None, **kwargs): ...

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor: ...

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None: ...

    def no_weight_decay(self) -> set[str]: ...

    def group_matcher(self, coarse: bool = False) -> dict: ...


def require(model: nn.Module, capability: str, action: str) -> None:
    """Refuse `action` in one line when the model's family lacks `capability`."""
    if capability not in getattr(model, "capabilities", frozenset()):
        family = getattr(model, "family", type(model).__name__)
        raise ConfigError(f"{action} needs {CAPABILITIES.get(capability, capability)}, which the {family} family "
                          "does not have")
