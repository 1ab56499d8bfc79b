"""Position-wise feed-forward network (section 3.3, eq. 2)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from transduce import kernels
from transduce.kernels import KernelOptions


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 with W1 (D, F) and W2 (F, D) (eq. 2)."""

    def __init__(
        self,
        *,
        d_model: int,
        d_ff: int,
        activation_dropout: float = 0.0,
        options: KernelOptions = KernelOptions(),
    ) -> None:
        super().__init__()
        self.w_1 = kernels.Linear(d_model, d_ff, matmul=options.matmul)
        self.w_2 = kernels.Linear(d_ff, d_model, matmul=options.matmul)
        self.activation_dropout = activation_dropout  # after the ReLU; not in the paper

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, D)."""
        hidden = F.relu(self.w_1(x))  # (B, T, F)
        hidden = kernels.dropout(hidden, self.activation_dropout, self.training)
        return self.w_2(hidden)


__all__ = ["PositionwiseFeedForward"]
