"""Position-wise feed-forward network (section 3.3, eq. 2), with the paper's ReLU or, for models
made elsewhere (Marian), swish or GELU."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from transduce import kernels
from transduce.kernels import KernelOptions

# ModelConfig.activation -> the function (PyTorch's gelu is the erf form, as Marian's "gelu")
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "swish": F.silu,
    "gelu": F.gelu,
}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 with W1 (D, F) and W2 (F, D) (eq. 2); ``activation``
    in place of max(0, .): relu (the paper's), swish or gelu (``ACTIVATIONS``)."""

    def __init__(
        self,
        *,
        d_model: int,
        d_ff: int,
        activation_dropout: float = 0.0,
        activation: str = "relu",
        options: KernelOptions = KernelOptions(),
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(ACTIVATIONS)}, not {activation!r}"
            )
        self.activation = ACTIVATIONS[activation]
        self.w_1 = kernels.Linear(d_model, d_ff, matmul=options.matmul)
        self.w_2 = kernels.Linear(d_ff, d_model, matmul=options.matmul)
        self.activation_dropout = activation_dropout  # after the activation; not in the paper

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, D)."""
        hidden = self.activation(self.w_1(x))  # (B, T, F)
        hidden = kernels.dropout(hidden, self.activation_dropout, self.training)
        return self.w_2(hidden)


__all__ = ["ACTIVATIONS", "PositionwiseFeedForward"]
