"""One sentence decoded alone (its hypothesis rows: one for greedy, the beam's for beam search)
in one native call a step.

At batch 1 on the CPU a step of ``DecodingModel`` is ~20 PyTorch operators a layer around
products that each read their weights in tens of microseconds: the operators' dispatch was ~40%
of SMALL's greedy step (benchmarks/step_cost.py). ``kernels.native.decoder_row_step`` computes
the whole decoder and the pre-softmax projection for up to ``MAX_ROWS`` rows of one sentence in
one call, on one OpenMP team, reading each weight once for all rows, from the weights packed
here once (``RowPlan``) and the engine's own cache buffers; the embedding and the position stay
PyTorch's (every kind of position the model has).

``RowPlan.of`` returns None where the native step does not apply (not float32 on the CPU, the
native kernels not built, layer norms with different epsilons, int8 forced on a CPU without int8
dot products, where the engine quantises to 7 bits); the engine then computes its
step with PyTorch's operators. Results agree with those within float32 rounding (the sums run
in another order), not bit for bit. With ``int8``, every product's weights are the int8 ones of
the engine's ``Int8Projection`` (``kernels.quantized.quantize_weight``: the same numbers) and
its input row is quantised as there: the int8 sums are exact, the rest within float32
rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from transduce import kernels
from transduce.kernels import native
from transduce.kernels.quantized import activations_in_7_bits, quantize_weight
from transduce.model.layers import DecoderLayer
from transduce.model.transformer import Transformer

# ModelConfig.activation -> the kernel's code
ACTIVATION_CODES = {"relu": 0, "swish": 1, "gelu": 2}
# The most hypothesis rows a native step takes: its products read W once for all rows, in
# blocks of 4 rows of W by 4 inputs, which pays where reading W is the cost, not a GEMM's
# tiling for the many rows of a batch
MAX_ROWS = 8


def _linear(layer: nn.Linear) -> list[Tensor]:
    """W (out, in) and b (out,), zeros for no bias."""
    bias = layer.bias if layer.bias is not None else layer.weight.new_zeros(layer.out_features)
    return [layer.weight, bias]


def _norm(norm: nn.Module) -> list[Tensor]:
    ln = cast(nn.LayerNorm, norm)
    return [ln.weight, ln.bias]


class _Packing:
    """The three packed tensors' parts, in order: a matrix is W (float32) or, for int8, its
    scales in the floats and its int8 rows and their sums apart; then b."""

    def __init__(self, int8: bool) -> None:
        self.int8 = int8
        self.floats: list[Tensor] = []
        self.int8_rows: list[Tensor] = []
        self.row_sums: list[Tensor] = []

    def matrix(self, weight: Tensor, bias: Tensor) -> None:
        if self.int8:
            q = quantize_weight(weight)
            self.floats.append(q.scale)
            self.int8_rows.append(q.weight.reshape(-1))
            self.row_sums.append(q.weight.sum(1, dtype=torch.int32))
        else:
            self.floats.append(weight.detach().reshape(-1))
        self.floats.append(bias.detach())

    def vectors(self, *vs: Tensor) -> None:
        self.floats += [v.detach() for v in vs]

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        def cat(parts: list[Tensor], dtype: torch.dtype) -> Tensor:
            return torch.cat(parts) if parts else torch.empty(0, dtype=dtype)

        return (
            cat(self.floats, torch.float32),
            cat(self.int8_rows, torch.int8),
            cat(self.row_sums, torch.int32),
        )


@dataclass(frozen=True)
class RowPlan:
    """The decoder's weights packed for ``decoder_row_step``: per layer W^QKV, b^QKV, W^O, b^O,
    the first norm's weight and bias; encoder-decoder attention's W^Q, b^Q, W^O, b^O, the second
    norm; the FFN's W_1, b_1, W_2, b_2, the third norm (nn.Linear's (out, in) layout); then the
    final norm (ones and zeros after post-norm layers) and the pre-softmax W and b. With int8,
    each W is its per-channel scales in ``weights`` and its int8 rows and their sums in
    ``int8_weights`` and ``row_sums`` (else both empty). A copy: a snapshot as the engine's
    others."""

    weights: Tensor  # (total,) float32
    int8_weights: Tensor  # (total,) int8
    row_sums: Tensor  # (total,) int32
    dims: tuple[int, ...]  # L, D, H, K, Dv, F, V, activation, pre_norm
    eps: float

    @classmethod
    def of(cls, model: Transformer, *, int8: bool = False) -> RowPlan | None:
        """The plan for ``model`` (its products in int8 with ``int8``), or None where the
        native step does not apply."""
        weight = model.generator.weight
        if not kernels.one_row_is_read_bound(weight):  # float32 on the CPU
            return None
        if int8 and activations_in_7_bits():  # the kernel quantises to 8 bits, as with VNNI
            return None
        cfg = model.config
        layers = [cast(DecoderLayer, layer) for layer in model.decoder.layers]
        norms = [n for layer in layers for n in layer.norms]
        if cfg.norm == "pre":
            norms.append(model.decoder.final_norm)
        if len({cast(nn.LayerNorm, n).eps for n in norms}) != 1 or not native.available():
            return None
        d = cfg.d_model
        pack = _Packing(int8)
        with torch.no_grad():
            for layer in layers:
                sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.ffn
                w_qkv, b_qkv = kernels.stacked_weights((sa.w_q, sa.w_k, sa.w_v))
                if b_qkv is None:
                    b_qkv = w_qkv.new_zeros(w_qkv.size(0))
                pack.matrix(w_qkv, b_qkv)
                pack.matrix(*_linear(sa.w_o))
                pack.vectors(*_norm(layer.norms[0]))
                pack.matrix(*_linear(ca.w_q))
                pack.matrix(*_linear(ca.w_o))
                pack.vectors(*_norm(layer.norms[1]))
                pack.matrix(*_linear(ffn.w_1))
                pack.matrix(*_linear(ffn.w_2))
                pack.vectors(*_norm(layer.norms[2]))
            if cfg.norm == "pre":
                pack.vectors(*_norm(model.decoder.final_norm))
            else:
                pack.vectors(weight.new_ones(d), weight.new_zeros(d))
            pack.matrix(*_linear(cast(nn.Linear, model.generator)))
            packed, int8_weights, row_sums = pack.tensors()
        sa = layers[0].self_attn
        dims = (
            len(layers),
            d,
            sa.n_heads,
            sa.d_k,
            sa.d_v,
            cfg.d_ff,
            weight.size(0),
            ACTIVATION_CODES[cfg.activation],
            int(cfg.norm == "pre"),
        )
        return cls(packed, int8_weights, row_sums, dims, float(cast(nn.LayerNorm, norms[0]).eps))


@dataclass(frozen=True)
class RowState:
    """What a sentence's native steps take besides the step's input: the self-attention cache
    buffers (2 a layer, (rows, capacity, H, size)), encoder-decoder attention's tensors (3 a
    layer: the fold's A, c, M, or keys, values and an additive mask or an empty tensor)."""

    buffers: list[Tensor]
    cross: list[Tensor]
    folded: bool
    capacity: int
    rows: int


def step(plan: RowPlan, state: RowState, x: Tensor, t: int) -> Tensor:
    """x (rows, D) float32, the step's input -> logits (rows, V); writes position ``t`` (<
    capacity) of each row into the state's buffers."""
    return native.decoder_row_step(
        x,
        plan.weights,
        plan.int8_weights,
        plan.row_sums,
        plan.dims,
        state.buffers,
        t,
        state.cross,
        state.folded,
        plan.eps,
    )


__all__ = ["ACTIVATION_CODES", "MAX_ROWS", "RowPlan", "RowState", "step"]
