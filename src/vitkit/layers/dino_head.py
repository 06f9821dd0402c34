"""DINO's projection head (Caron et al. 2021; facebookresearch/dino `vision_transformer.DINOHead`).

features [B, in_dim] -> MLP (in -> hidden -> ... -> bottleneck, GELU, optional BatchNorm) -> L2-normalise ->
a weight-normalised linear layer without bias to out_dim "prototypes" (K = 65536 on ImageNet).

The last layer keeps the parameter names of `torch.nn.utils.weight_norm` (`last_layer.weight_g` [K, 1],
`last_layer.weight_v` [K, bottleneck]), as DINO's checkpoints have them, with weight = g * v / ||v|| (row
norms). With `norm_last_layer` (DINO's default) g is filled with 1 and frozen, so every prototype has norm 1.
State dicts saved by the newer `torch.nn.utils.parametrizations.weight_norm`
(`last_layer.parametrizations.weight.original0/1`) load too.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class WeightNormLinear(nn.Module):
    """Linear without bias, weight = weight_g * weight_v / ||weight_v|| (norm of each output row)."""

    def __init__(self, in_features: int, out_features: int, *, device=None):
        super().__init__()
        v = nn.Linear(in_features, out_features, bias=False, device=device).weight.detach()  # nn.Linear's init
        self.weight_v = nn.Parameter(v.clone())
        self.weight_g = nn.Parameter(torch.ones(out_features, 1, device=device))
        self.in_features, self.out_features = in_features, out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.weight_g * self.weight_v / self.weight_v.norm(dim=1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for new, old in (("weight_g", "parametrizations.weight.original0"),
                         ("weight_v", "parametrizations.weight.original1")):
            if prefix + old in state_dict and prefix + new not in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weight_norm=True"


class DinoHead(nn.Module):
    """DINO's head (defaults as in the paper: 3 layers, hidden 2048, bottleneck 256, no BN, norm_last_layer)."""

    def __init__(self, in_dim: int, out_dim: int, *, hidden_dim: int = 2048, bottleneck_dim: int = 256,
                 nlayers: int = 3, use_bn: bool = False, norm_last_layer: bool = True, device=None):
        super().__init__()
        nlayers = max(nlayers, 1)
        if nlayers == 1:
            self.mlp = nn.Linear(in_dim, bottleneck_dim, device=device)
        else:
            layers: list[nn.Module] = [nn.Linear(in_dim, hidden_dim, device=device)]
            if use_bn:
                layers.append(nn.BatchNorm1d(hidden_dim, device=device))
            layers.append(nn.GELU())
            for _ in range(nlayers - 2):
                layers.append(nn.Linear(hidden_dim, hidden_dim, device=device))
                if use_bn:
                    layers.append(nn.BatchNorm1d(hidden_dim, device=device))
                layers.append(nn.GELU())
            layers.append(nn.Linear(hidden_dim, bottleneck_dim, device=device))
            self.mlp = nn.Sequential(*layers)
        self.apply(self._init_weights)  # before the last layer, as DINO (it keeps nn.Linear's init)
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim, device=device)
        self.norm_last_layer = norm_last_layer
        if norm_last_layer:
            self.last_layer.weight_g.requires_grad_(False)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mlp(x)
        x = F.normalize(x, dim=-1, p=2)
        return self.last_layer(x)
