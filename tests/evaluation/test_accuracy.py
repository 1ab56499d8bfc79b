import pytest

from transduce.evaluation.accuracy import (
    position_accuracy,
    sequence_accuracy,
    token_accuracy,
)


def test_sequence_accuracy():
    refs = [[5, 6, 7], [8, 9], [4]]
    assert sequence_accuracy(refs, refs) == 1.0
    assert sequence_accuracy([[5, 6, 7], [8], [4, 4]], refs) == pytest.approx(1 / 3)
    assert sequence_accuracy([[5, 6, 7, 8], [9, 8], []], refs) == 0.0


def test_token_accuracy():
    refs = [[5, 6, 7, 8], [9, 10]]
    assert token_accuracy(refs, refs) == 1.0
    # 3 of 4 + 1 of 2 = 4 of 6
    assert token_accuracy([[5, 6, 0, 8], [9, 4]], refs) == pytest.approx(4 / 6)
    # shorter hypothesis: missing positions are wrong
    assert token_accuracy([[5, 6], [9, 10]], refs) == pytest.approx(4 / 6)
    # positions, not bags: a shift counts as wrong
    assert token_accuracy([[4, 5, 6, 7], [9, 10]], refs) == pytest.approx(2 / 6)


def test_longer_hypothesis_not_rewarded():
    refs = [[5, 6]]
    assert token_accuracy([[5, 6, 7, 8, 9]], refs) == 1.0
    assert token_accuracy([[5, 0, 6]], refs) == 0.5
    assert sequence_accuracy([[5, 6, 7]], refs) == 0.0


def test_tuples_and_lists_compare_equal():
    assert sequence_accuracy([(1, 2)], [[1, 2]]) == 1.0


def test_errors():
    with pytest.raises(ValueError):
        sequence_accuracy([[1]], [[1], [2]])
    with pytest.raises(ValueError):
        token_accuracy([], [])
    with pytest.raises(ValueError):
        token_accuracy([[1]], [[]])


def test_position_accuracy_by_hand():
    refs = [[5, 6, 7], [8, 9, 10], [4, 4, 4]]
    hyps = [[5, 6, 0], [8, 0, 0], [0, 4, 4]]
    # position 1: 2 of 3 right, position 2: 2 of 3, position 3: 1 of 3
    assert position_accuracy(hyps, refs) == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    assert position_accuracy(refs, refs) == [1.0, 1.0, 1.0]


def test_position_accuracy_mixed_lengths():
    refs = [[1, 2, 3, 4], [1, 2], [7]]
    # too short: [1] lacks positions 2-4 of the first reference; too long: [1, 2, 9] has an
    # extra token the second reference does not count
    hyps = [[1], [1, 2, 9], [7, 7, 7, 7]]
    # position 1: 3 of 3; position 2: only the second pair is right (1 of 2 references with a
    # position 2); positions 3 and 4: only the first reference has them, and its hypothesis is
    # too short
    assert position_accuracy(hyps, refs) == pytest.approx([1.0, 0.5, 0.0, 0.0])


def test_position_accuracy_weighted_mean_is_token_accuracy():
    refs = [[1, 2, 3, 4], [1, 2], [7], [3, 3, 3]]
    hyps = [[1, 0, 3], [1, 2, 9], [7, 7], [0, 3, 0]]
    shares = position_accuracy(hyps, refs)
    present = [sum(len(r) > p for r in refs) for p in range(len(shares))]
    weighted = sum(s * n for s, n in zip(shares, present)) / sum(present)
    assert weighted == pytest.approx(token_accuracy(hyps, refs))


def test_position_accuracy_errors():
    with pytest.raises(ValueError):
        position_accuracy([[1]], [[1], [2]])
    with pytest.raises(ValueError):
        position_accuracy([], [])
    with pytest.raises(ValueError):
        position_accuracy([[1], []], [[], []])
