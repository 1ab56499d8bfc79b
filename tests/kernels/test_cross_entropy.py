"""kernels.cross_entropy: the in-place softmax; Liger's availability."""

import pytest
import torch

from transduce.kernels.cross_entropy import liger_available, softmax_


@pytest.mark.parametrize("shape", [(3, 7), (131, 8000), (2, 37000)])
def test_softmax_in_place_equals_softmax(shape: tuple[int, int]) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 5
    expected = torch.softmax(x, dim=-1)
    out = softmax_(x)
    assert torch.equal(out, expected)
    assert out.data_ptr() == x.data_ptr()  # on the CPU, written into x


def test_liger_is_not_available_off_cuda() -> None:
    assert not liger_available(torch.device("cpu"))
