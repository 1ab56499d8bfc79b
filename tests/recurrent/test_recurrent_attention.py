"""The attention scores, the masking and the grouping of hypothesis rows, against naive loops."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from transduce.recurrent import Attention, AttentionKind, group_rows, masked_softmax


def _naive(att: Attention, h_t: Tensor, h_s: Tensor, valid: Tensor) -> Tensor:
    """One query h_t (H,) over h_s (S, H) with valid (S,) -> context (H,), formula by formula."""
    scores = []
    for s in range(h_s.size(0)):
        if att.kind == "general":  # h_t^T W h_s
            scores.append(h_t @ att.w_key.weight @ h_s[s])
        else:  # v^T tanh(W1 h_t + W2 h_s)
            scores.append(att.v @ torch.tanh(att.w_query.weight @ h_t + att.w_key.weight @ h_s[s]))
    a = torch.softmax(torch.stack(scores)[valid], dim=0)
    return a @ h_s[valid]


@pytest.mark.parametrize("kind", ["general", "additive"])
def test_context_equals_per_hypothesis_formula(kind: AttentionKind) -> None:
    torch.manual_seed(0)
    b, g, t, s, h = 2, 3, 4, 5, 6
    att = Attention(kind, h)
    memory = torch.randn(b, s, h)
    valid = torch.tensor([[True] * 5, [True, True, False, False, False]])
    query = torch.randn(b * g, t, h)  # (N, T, H), sentence-major
    with torch.no_grad():
        context, weights = att(query, att.keys(memory), memory, valid)
        assert context.shape == (b * g, t, h) and weights.shape == (b, g * t, s)
        for row in range(b * g):
            for pos in range(t):
                ref = _naive(att, query[row, pos], memory[row // g], valid[row // g])
                torch.testing.assert_close(context[row, pos], ref, atol=1e-5, rtol=1e-5)
    assert weights[1, :, 2:].abs().sum() == 0  # padding gets exactly no weight


def test_masked_softmax_without_real_tokens_is_zero() -> None:
    scores = torch.randn(2, 3, 4)
    valid = torch.tensor([[True, False, True, False], [False] * 4])
    w = masked_softmax(scores, valid)
    torch.testing.assert_close(w[0].sum(-1), torch.ones(3))
    assert torch.equal(w[1], torch.zeros(3, 4))
    assert torch.isfinite(w).all()


def test_group_rows_is_sentence_major_and_checks_rows() -> None:
    x = torch.arange(6.0).view(6, 1, 1)  # rows 0-2: sentence 0, rows 3-5: sentence 1
    assert group_rows(x, 2)[:, :, 0].tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="not a multiple"):
        group_rows(x, 4)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="attention"):
        Attention("dot", 4)  # type: ignore[arg-type]
