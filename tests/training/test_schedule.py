"""The learning-rate schedule of eq. 3 against hand-computed values."""

import pytest

from transduce.training.schedule import cooldown, rate


def _eq3(step: int, d_model: int, warmup: int) -> float:
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def test_paper_values() -> None:
    d, w = 512, 4000
    assert rate(1, d_model=d, warmup=w) == pytest.approx(512**-0.5 * 4000**-1.5, rel=1e-12)
    assert rate(1, d_model=d, warmup=w) == pytest.approx(1.7469e-7, rel=1e-4)
    assert rate(w, d_model=d, warmup=w) == pytest.approx(6.988e-4, rel=1e-4)
    assert rate(w, d_model=d, warmup=w) == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-12)
    assert rate(2 * w, d_model=d, warmup=w) == pytest.approx(512**-0.5 * 8000**-0.5, rel=1e-12)
    assert rate(2 * w, d_model=d, warmup=w) == pytest.approx(rate(w, d_model=d, warmup=w) / 2**0.5)
    assert rate(w // 2, d_model=d, warmup=w) == pytest.approx(rate(w, d_model=d, warmup=w) / 2)


@pytest.mark.parametrize("step", [1, 7, 99, 100, 101, 350, 10_000])
def test_matches_formula(step: int) -> None:
    assert rate(step, d_model=64, warmup=100) == pytest.approx(_eq3(step, 64, 100), rel=1e-12)


def test_step_zero_is_step_one() -> None:
    assert rate(0, d_model=512, warmup=4000) == rate(1, d_model=512, warmup=4000)


def test_up_then_down() -> None:
    rates = [rate(s, d_model=256, warmup=50) for s in range(1, 201)]
    peak = max(range(len(rates)), key=rates.__getitem__) + 1
    assert peak == 50
    assert all(a < b for a, b in zip(rates[:49], rates[1:50]))
    assert all(a > b for a, b in zip(rates[49:], rates[50:]))


def test_factor_scales() -> None:
    for step in (1, 40, 4000, 9000):
        base = rate(step, d_model=512, warmup=4000)
        assert rate(step, d_model=512, warmup=4000, factor=2.5) == pytest.approx(
            2.5 * base, rel=1e-12
        )


def test_cooldown_off_is_one() -> None:
    for done in (0.0, 0.5, 0.99, 1.0):
        assert cooldown(done, fraction=0.0) == 1.0


def test_cooldown_is_linear_over_the_last_fraction() -> None:
    f = 0.25
    assert cooldown(0.0, fraction=f) == 1.0
    assert cooldown(0.75, fraction=f) == pytest.approx(1.0)
    assert cooldown(0.80, fraction=f) == pytest.approx(0.8)  # (1 - 0.8) / 0.25
    assert cooldown(0.875, fraction=f) == pytest.approx(0.5)
    assert cooldown(1.0, fraction=f) == 0.0
    assert cooldown(1.3, fraction=f) == 0.0  # past the budget: never negative
    assert cooldown(0.5, fraction=1.0) == pytest.approx(0.5)  # the whole run decays
