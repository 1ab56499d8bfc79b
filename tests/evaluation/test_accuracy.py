import pytest

from transduce.evaluation.accuracy import sequence_accuracy, token_accuracy


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
