"""Projection: every layout and library computes x W^T + b, for every row count."""

from __future__ import annotations

import pytest
import torch

from transduce.kernels.matmul import ONE_ROW_MKL_MAX_ELEMENTS, onednn_available
from transduce.kernels.projection import (
    Projection,
    ProjectionLayout,
    split_columns,
    transposed,
)


@pytest.mark.parametrize("parts", [2, 3, 5])
@pytest.mark.parametrize("bias", [True, False])
def test_split_columns_blocks_multiply_like_the_weight(parts: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(parts)
    w = torch.randn(13, 8, generator=g)
    b = torch.randn(13, generator=g) if bias else None
    blocks, blocks_bias = split_columns(w, b, parts)
    cols = -(-13 // parts)
    assert blocks.shape == (parts, 8, cols) and blocks.is_contiguous()
    assert torch.equal(blocks.transpose(0, 1).reshape(8, -1)[:, :13], w.t())
    assert (blocks_bias is None) == (b is None)
    for onednn in [False, True] if onednn_available() else [False]:
        proj = Projection.of(w, b, ProjectionLayout(onednn=onednn, one_row_parts=parts))
        assert proj.blocks is not None
        for rows in (1, 2):  # one row through the blocks, two through the plain layout
            xr = torch.randn(rows, 8, generator=g)
            expected = xr @ w.t() + (0 if b is None else b)
            torch.testing.assert_close(proj(xr), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("shape", "block"), [((13, 16), 256), ((1000, 24), 7), ((5, 3), 1)])
def test_transposed_is_an_exact_transpose(shape: tuple[int, int], block: int) -> None:
    w = torch.randn(shape)
    out = transposed(w, block=block)
    assert out.is_contiguous() and torch.equal(out, w.t())


@pytest.mark.skipif(not onednn_available(), reason="no oneDNN")
@pytest.mark.parametrize("rows", [0, 1, 2, 7])
@pytest.mark.parametrize(
    ("out_f", "in_f", "bias"), [(24, 16, True), (1100, 500, True), (40, 8, False)]
)
def test_onednn_projection_is_x_w_t_plus_b(rows: int, out_f: int, in_f: int, bias: bool) -> None:
    # (1100, 500) is past the size up to which one row goes through MKL instead
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(out_f, in_f, generator=g), torch.randn(rows, in_f, generator=g)
    b = torch.randn(out_f, generator=g) if bias else None
    proj = Projection.of(w, b, ProjectionLayout(onednn=True))
    assert (proj.weight_t is None) == (w.numel() > ONE_ROW_MKL_MAX_ELEMENTS)
    expected = x @ w.t() + (0 if b is None else b)
    torch.testing.assert_close(proj(x), expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(Projection.of(w, b)(x), expected, atol=1e-4, rtol=1e-5)


def test_layout_choice_splits_one_row_for_float32_cpu_weights_only() -> None:
    weight = torch.zeros(6, 4)
    layout = ProjectionLayout.choose(weight, "mkl")
    assert layout == ProjectionLayout(onednn=False, one_row_parts=torch.get_num_threads())
    assert ProjectionLayout.choose(weight.bfloat16(), "mkl").one_row_parts == 1
    assert ProjectionLayout.choose(weight, "mkl", one_row_parts=3).one_row_parts == 3
    with pytest.raises(ValueError, match="at least 1"):
        ProjectionLayout.choose(weight, "mkl", one_row_parts=0)
