import math

import pytest
import torch

from transduce.inference import length_penalty


@pytest.mark.parametrize(
    ("length", "alpha", "expected"),
    [
        (1, 0.6, 1.0),  # ((5 + 1) / 6) ** a = 1 for any alpha: the empty output + EOS
        (7, 1.0, 2.0),  # (12 / 6) ** 1
        (13, 0.5, math.sqrt(3.0)),  # (18 / 6) ** 0.5
        (25, 2.0, 25.0),  # (30 / 6) ** 2
        (5, 0.6, 1.3586552),  # (10 / 6) ** 0.6 = exp(0.6 * ln(5 / 3)) = exp(0.30649537)
        (0, 1.0, 5.0 / 6.0),
    ],
)
def test_hand_computed_values(length, alpha, expected):
    assert length_penalty(length, alpha) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("length", [0, 1, 2, 10, 1000])
def test_alpha_zero_is_one(length):
    assert length_penalty(length, 0.0) == 1.0


def test_tensor_lengths():
    lp = length_penalty(torch.tensor([1, 7, 13]), 1.0)
    assert lp.is_floating_point()
    assert torch.allclose(lp, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(length_penalty(torch.tensor([3, 50]), 0.0), torch.ones(2))


def test_grows_with_length_for_positive_alpha():
    values = [length_penalty(n, 0.6) for n in range(1, 20)]
    assert values == sorted(values) and len(set(values)) == len(values)
