"""The transformer MLP (D -> hidden -> D) and its activations."""
from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the activation OpenAI's CLIP weights were trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_act(name: str) -> nn.Module:
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "quick_gelu":
        return QuickGELU()
    raise ConfigError(f"unknown activation {name!r}; choose gelu, gelu_tanh or quick_gelu")


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str = "gelu", drop: float = 0.0, bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = make_act(act)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))
