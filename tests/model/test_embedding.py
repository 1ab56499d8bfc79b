"""Scaled embeddings (section 3.4) and positional encodings (section 3.5, Table 3 row E)."""

from __future__ import annotations

import math

import pytest
import torch

from transduce.model.embedding import Embeddings
from transduce.model.positions import (
    LearnedPositions,
    SinusoidalPositions,
    make_positions,
    positional_table,
)


def _paper_pe(pos: int, dim: int, d_model: int) -> float:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    two_i = dim - (dim % 2)
    angle = pos / (10000 ** (two_i / d_model))
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


@pytest.mark.parametrize("d_model", [16, 7, 1, 2])
def test_positional_table_matches_paper_formula(d_model: int) -> None:
    n = 60
    table = positional_table(n, d_model, dtype=torch.float64)
    assert table.shape == (n, d_model)
    for pos in range(n):
        for dim in range(d_model):
            assert table[pos, dim].item() == pytest.approx(_paper_pe(pos, dim, d_model), abs=1e-12)


def test_positional_table_interleaves_sin_and_cos() -> None:
    table = positional_table(5, 8)
    assert torch.equal(table[0, 0::2], torch.zeros(4))  # sin(0)
    assert torch.equal(table[0, 1::2], torch.ones(4))  # cos(0)
    # dimension pair (0, 1) has wavelength 2*pi: sin(pos), cos(pos)
    assert table[3, 0].item() == pytest.approx(math.sin(3.0), abs=1e-6)
    assert table[3, 1].item() == pytest.approx(math.cos(3.0), abs=1e-6)
    assert table.dtype == torch.float32


def test_embeddings_multiply_by_sqrt_d_model() -> None:
    torch.manual_seed(0)
    emb = Embeddings(vocab_size=11, d_model=16)
    tokens = torch.tensor([[0, 3, 10], [5, 5, 1]])
    out = emb(tokens)
    assert out.shape == (2, 3, 16)
    for b in range(2):
        for t in range(3):
            expected = emb.weight[tokens[b, t]] * 4.0  # sqrt(16)
            torch.testing.assert_close(out[b, t], expected)


def test_embedding_init_gives_unit_scale_inputs() -> None:
    torch.manual_seed(0)
    d = 64
    emb = Embeddings(vocab_size=4000, d_model=d)
    assert emb.weight.std().item() == pytest.approx(d**-0.5, rel=0.05)
    assert emb(torch.arange(4000)[None]).std().item() == pytest.approx(1.0, rel=0.05)


def test_sinusoidal_positions_add_the_table_with_offset() -> None:
    d = 10
    pos = SinusoidalPositions(d_model=d, max_positions=32)
    assert list(pos.parameters()) == []
    x = torch.randn(2, 4, d)
    out = pos(x, offset=3)
    for t in range(4):
        for dim in range(d):
            expected = x[0, t, dim].item() + _paper_pe(3 + t, dim, d)
            assert out[0, t, dim].item() == pytest.approx(expected, abs=1e-5)


def test_sinusoidal_positions_grow_beyond_max_positions() -> None:
    d = 6
    pos = SinusoidalPositions(d_model=d, max_positions=4)
    x = torch.zeros(1, 9, d)
    out = pos(x)
    assert out.shape == (1, 9, d)
    out2 = pos(torch.zeros(1, 2, d), offset=20)  # grows again, from an offset
    for dim in range(d):
        assert out[0, 8, dim].item() == pytest.approx(_paper_pe(8, dim, d), abs=1e-6)
        assert out2[0, 1, dim].item() == pytest.approx(_paper_pe(21, dim, d), abs=1e-6)


def test_table_grown_under_inference_mode_serves_training_afterwards() -> None:
    # the searches run under torch.inference_mode and may grow the table; training must still
    # be able to save it for backward (inference tensors cannot be)
    pos = SinusoidalPositions(d_model=6, max_positions=4)
    with torch.inference_mode():
        pos(torch.zeros(1, 9, 6))
    assert not pos.table.is_inference()
    x = torch.randn(1, 9, 6, requires_grad=True)
    (pos(x) * pos.encoding(0, 9)).sum().backward()
    torch.testing.assert_close(x.grad[0], pos.encoding(0, 9))


def test_learned_positions_are_parameters_and_bounded() -> None:
    pos = make_positions("learned", d_model=8, max_positions=5)
    assert isinstance(pos, LearnedPositions)
    params = list(pos.parameters())
    assert len(params) == 1 and params[0].shape == (5, 8)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(pos(x), x + params[0][None])
    torch.testing.assert_close(pos(x[:, :2], offset=3), x[:, :2] + params[0][3:5][None])
    with pytest.raises(ValueError, match="max_positions"):
        pos(torch.randn(1, 6, 8))
    with pytest.raises(ValueError, match="max_positions"):
        pos(torch.randn(1, 1, 8), offset=5)


def test_learned_positions_receive_gradients() -> None:
    pos = LearnedPositions(d_model=4, max_positions=3)
    pos(torch.zeros(1, 2, 4)).sum().backward()
    assert pos.weight.grad is not None
    assert torch.equal(pos.weight.grad[:2], torch.ones(2, 4))
    assert torch.equal(pos.weight.grad[2], torch.zeros(4))


def test_make_positions_rejects_unknown_kind() -> None:
    assert isinstance(make_positions("sinusoidal", d_model=4, max_positions=3), SinusoidalPositions)
    with pytest.raises(ValueError, match="rotary"):
        make_positions("rotary", d_model=4, max_positions=3)
