"""RMSNorm with the same arithmetic as Hugging Face (normalise in float32, cast back)."""

import torch
from torch import nn

from engine.layers.ops import torch_rms_norm


class RMSNorm(nn.Module):
    """Holds the weight and eps; the decoder applies it through its LayerOps."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch_rms_norm(x, self.weight, self.eps)  # x: [..., dim]
