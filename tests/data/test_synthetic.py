"""Synthetic tasks: correct targets, disjoint splits, sizes, determinism, clear errors."""

import re

import pytest

from transduce.config import Config, update
from transduce.data.synthetic import make_task
from transduce.data.vocab import UNK
from transduce.errors import UserError


def _task_cfg(**values):
    return update(Config(), values).task


def test_addition_targets_are_sums() -> None:
    task = make_task(_task_cfg(name="addition", train_size=300, valid_size=50, max_digits=4))
    assert len(task.train) == 300 and len(task.valid) == 50
    digits_seen = set()
    for src, tgt in task.train + task.valid:
        m = re.fullmatch(r"(\d+)\+(\d+)", src)
        assert m, src
        a, b = m.groups()
        for x in (a, b):
            assert x == "0" or not x.startswith("0")  # no leading zeros
            assert 1 <= len(x) <= 4
            digits_seen.add(len(x))
        assert tgt == str(int(a) + int(b))
        assert UNK not in task.vocab.encode(src) + task.vocab.encode(tgt)
    assert digits_seen == {1, 2, 3, 4}


def test_held_out_takes_at_most_a_tenth_of_each_class() -> None:
    """There are 100 one-digit sums: at most 10 may be held out, the rest stay learnable."""
    task = make_task(_task_cfg(name="addition", train_size=20000, valid_size=1000, max_digits=3))
    held = [s for s, _ in task.valid + task.test]
    one_one = [s for s in held if all(len(x) == 1 for x in s.split("+"))]
    assert 1 <= len(one_one) <= 10
    train_one_one = {s for s, _ in task.train if all(len(x) == 1 for x in s.split("+"))}
    assert len(train_one_one) >= 80
    assert not set(held) & {s for s, _ in task.train}
    assert len(set(held)) == 2000


def test_addition_min_digits() -> None:
    task = make_task(
        _task_cfg(name="addition", train_size=200, valid_size=20, min_digits=2, max_digits=3)
    )
    for src, _ in task.train + task.valid:
        for x in src.split("+"):
            assert 2 <= len(x) <= 3 and not x.startswith("0")


def test_reverse_input_reverses_source_only() -> None:
    base = _task_cfg(name="addition", train_size=200, valid_size=30)
    plain = make_task(base)
    rev = make_task(update(Config(task=base), {"reverse_input": True}).task)
    assert [(s[::-1], t) for s, t in plain.train] == rev.train
    assert [(s[::-1], t) for s, t in plain.valid] == rev.valid
    for src, tgt in rev.train:
        a, b = src[::-1].split("+")
        assert tgt == str(int(a) + int(b))


@pytest.mark.parametrize("reverse_input", [False, True])
@pytest.mark.parametrize("name", ["addition", "copy", "reverse"])
def test_held_out_never_in_train(name: str, reverse_input: bool) -> None:
    # A small task space, so collisions would happen without the exclusion.
    sizes = {"max_digits": 2} if name == "addition" else {"max_length": 6, "n_symbols": 4}
    cfg = _task_cfg(name=name, train_size=400, valid_size=100, reverse_input=reverse_input, **sizes)
    task = make_task(cfg)
    valid_sources = {s for s, _ in task.valid}
    assert len(valid_sources) == len(task.valid) == 100  # distinct held-out examples
    assert len(task.train) == 400
    assert not valid_sources & {s for s, _ in task.train}


@pytest.mark.parametrize("name", ["copy", "reverse"])
def test_copy_and_reverse_targets(name: str) -> None:
    cfg = _task_cfg(
        name=name, train_size=300, valid_size=40, min_length=2, max_length=7, n_symbols=5
    )
    task = make_task(cfg)
    assert task.vocab.symbols == list("abcde")
    lengths = set()
    for src, tgt in task.train + task.valid:
        assert set(src) <= set("abcde")
        assert 2 <= len(src) <= 7
        lengths.add(len(src))
        assert tgt == (src if name == "copy" else src[::-1])
    assert lengths == set(range(2, 8))


def test_reverse_task_with_reversed_input_is_copy_of_original() -> None:
    cfg = _task_cfg(name="reverse", train_size=100, valid_size=10, reverse_input=True)
    for src, tgt in make_task(cfg).train:
        assert src == tgt  # source reversed, target the reversed original


def test_seeded_determinism() -> None:
    cfg = _task_cfg(name="copy", train_size=100, valid_size=20)
    a, b = make_task(cfg), make_task(cfg)
    assert (a.train, a.valid, a.vocab.to_dict()) == (b.train, b.valid, b.vocab.to_dict())
    other = make_task(update(Config(task=cfg), {"data_seed": 99}).task)
    assert other.train != make_task(cfg).train
    add = _task_cfg(name="addition", train_size=100, valid_size=20)
    assert make_task(add).train == make_task(add).train


@pytest.mark.parametrize(
    "values",
    [
        {"name": "addition", "max_digits": 1, "train_size": 100, "valid_size": 10},
        {"name": "copy", "n_symbols": 2, "max_length": 3, "train_size": 10, "valid_size": 5},
        {"name": "reverse", "n_symbols": 1, "max_length": 5, "train_size": 3, "valid_size": 1},
    ],
)
def test_too_small_task_space_is_a_user_error(values) -> None:
    with pytest.raises(UserError, match=values["name"]):
        make_task(_task_cfg(**values))


def test_too_many_symbols_is_a_user_error() -> None:
    with pytest.raises(UserError, match="n_symbols"):
        make_task(_task_cfg(name="copy", n_symbols=53, train_size=10, valid_size=5))


def test_vocab_round_trip() -> None:
    task = make_task(_task_cfg(name="addition", train_size=50, valid_size=5))
    for src, tgt in task.train:
        assert task.vocab.decode(task.vocab.encode(src)) == src
        assert task.vocab.decode(task.vocab.encode(tgt)) == tgt
    assert len(task.vocab) == 4 + 11
