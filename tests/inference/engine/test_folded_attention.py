"""The folded encoder-decoder attention of one sentence against multi-head attention."""

from __future__ import annotations

import pytest
import torch

from transduce.inference.engine.folded_attention import (
    FoldWeights,
    fold_cross_attention,
    fold_pays,
    folded_cross_attention,
)
from transduce.model.attention import MultiHeadAttention
from transduce.model.masks import key_padding_mask


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("g", [1, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_folded_cross_attention_is_multi_head_attention(bias: bool, g: int, padded: bool) -> None:
    torch.manual_seed(g + 2 * bias)
    attn = MultiHeadAttention(d_model=12, n_heads=3, d_k=5, d_v=7, bias=bias).eval()
    memory, y = torch.randn(1, 6, 12), torch.randn(g, 12)
    valid = torch.tensor([True, True, True, True, not padded, not padded])
    with torch.no_grad():
        keys, values = attn.project_key_value(memory)
        expected = attn(y[None], memory, key_padding_mask(valid[None]))[0]  # (G, D)
        folded = fold_cross_attention(FoldWeights.of(attn), keys, values, valid if padded else None)
        out = folded_cross_attention(y, folded, attn.w_o.bias)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_fold_weights_are_copies_without_a_graph() -> None:
    attn = MultiHeadAttention(d_model=8, n_heads=2, d_k=4, d_v=4)
    weights = FoldWeights.of(attn)
    assert not any(t.requires_grad for t in (weights.w_q, weights.b_q, weights.w_o))
    before = weights.w_q.clone()
    with torch.no_grad():
        attn.w_q.weight.mul_(2.0)
    assert torch.equal(weights.w_q, before)


def test_a_source_with_no_valid_position_is_not_folded() -> None:
    attn = MultiHeadAttention(d_model=8, n_heads=2, d_k=4, d_v=4).eval()
    with torch.no_grad():
        keys, values = attn.project_key_value(torch.randn(1, 3, 8))
    valid = torch.zeros(3, dtype=torch.bool)
    assert fold_cross_attention(FoldWeights.of(attn), keys, values, valid) is None


def test_fold_pays_while_it_moves_fewer_numbers() -> None:
    # base: 2 H S D against D H (d_k + d_v) + H S (d_k + d_v): S < 512 * 128 / 896 = 73.1
    assert fold_pays(73, 512, 64, 64) and not fold_pays(74, 512, 64, 64)
    assert fold_pays(85, 256, 64, 64) and not fold_pays(86, 256, 64, 64)
