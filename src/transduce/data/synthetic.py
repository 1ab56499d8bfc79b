"""Synthetic tasks generated in code, no download: copy, reverse and addition.

Addition writes integers as digit tokens: source ``"123+4589"``, target ``"4712"``. Each operand's
digit count is drawn uniformly from [min_digits, max_digits], then its value uniformly among the
numbers with that many digits, so short operands are common enough to be learned. Copy and
reverse draw the length uniformly, then the symbols.

The held-out splits (valid and test, ``valid_size`` each) never share a source with each other or
with the training split, and take at most ``HELD_OUT_SHARE`` of any class of examples (same
operand lengths, or same sequence length): without that cap the few short examples (there are
only 100 one-digit sums) would nearly all be held out and never be seen in training.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from transduce.config import SyntheticTaskConfig
from transduce.data.vocab import CharVocab
from transduce.errors import UserError

TextPair = tuple[str, str]


@dataclass(frozen=True)
class SyntheticTask:
    vocab: CharVocab
    train: list[TextPair]
    valid: list[TextPair]  # model selection and early stopping
    test: list[TextPair]  # reported at the end; as large as valid, disjoint from both


HELD_OUT_SHARE = 0.1


def _number(rng: random.Random, cfg: SyntheticTaskConfig) -> int:
    digits = rng.randint(cfg.min_digits, cfg.max_digits)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def _n_with_digits(d: int) -> int:
    return 10 if d == 1 else 9 * 10 ** (d - 1)


def _class_of(cfg: SyntheticTaskConfig, src: str) -> tuple[int, ...]:
    """The class an example belongs to: operand lengths for addition, else the length."""
    if cfg.name == "addition":
        return tuple(len(x) for x in src.split("+"))
    return (len(src),)


def _class_size(cfg: SyntheticTaskConfig, cls: tuple[int, ...]) -> int:
    if cfg.name == "addition":
        return _n_with_digits(cls[0]) * _n_with_digits(cls[1])
    return cfg.n_symbols ** cls[0]


def _held_out_cap(cfg: SyntheticTaskConfig, cls: tuple[int, ...]) -> int:
    """At most ``HELD_OUT_SHARE`` of the examples of class ``cls``, and at least one. In
    integers where the class is too large for a float (400-digit operands): the float product
    overflowed there."""
    size = _class_size(cfg, cls)
    share = int(HELD_OUT_SHARE * size) if size < 2**53 else size // round(1 / HELD_OUT_SHARE)
    return max(1, share)


def _addition(rng: random.Random, cfg: SyntheticTaskConfig) -> TextPair:
    a, b = _number(rng, cfg), _number(rng, cfg)
    return f"{a}+{b}", str(a + b)


def _sequence(
    rng: random.Random, cfg: SyntheticTaskConfig, symbols: str, reverse: bool
) -> TextPair:
    n = rng.randint(cfg.min_length, cfg.max_length)
    s = "".join(rng.choice(symbols) for _ in range(n))
    return s, s[::-1] if reverse else s


def _space_size(cfg: SyntheticTaskConfig) -> int:
    """How many distinct examples the task can produce (an upper bound is enough)."""
    if cfg.name == "addition":
        per_operand = sum(_n_with_digits(d) for d in range(cfg.min_digits, cfg.max_digits + 1))
        return per_operand**2
    return sum(cfg.n_symbols**n for n in range(cfg.min_length, cfg.max_length + 1))


def make_task(cfg: SyntheticTaskConfig) -> SyntheticTask:
    """Build the seeded train and held-out splits of ``cfg.name``.

    Source strings are reversed when ``reverse_input`` is set (the target never is).
    """
    if cfg.name == "addition":
        vocab = CharVocab(list(string.digits + "+"))
    else:
        if cfg.n_symbols > 52:
            raise UserError(f"n_symbols must be at most 52; got {cfg.n_symbols}")
        vocab = CharVocab(list(string.ascii_letters[: cfg.n_symbols]))
    wanted = cfg.train_size + 2 * cfg.valid_size
    if cfg.name == "addition":
        digits = range(cfg.min_digits, cfg.max_digits + 1)
        classes: list[tuple[int, ...]] = [(a, b) for a in digits for b in digits]
    else:
        classes = [(n,) for n in range(cfg.min_length, cfg.max_length + 1)]
    capacity = sum(_held_out_cap(cfg, c) for c in classes)
    if capacity < 2 * cfg.valid_size:
        raise UserError(
            f"task {cfg.name} can hold out at most {capacity} examples (a tenth of each length "
            f"class), fewer than 2 * valid_size = {2 * cfg.valid_size}; lower valid_size or "
            "widen max_digits / max_length / n_symbols"
        )
    if _space_size(cfg) < 2 * wanted:
        raise UserError(
            f"task {cfg.name} can make only {_space_size(cfg)} distinct examples, too few for "
            f"train_size + 2 * valid_size = {wanted}; widen max_digits / max_length or n_symbols"
        )
    rng = random.Random(cfg.data_seed)
    symbols = "".join(vocab.symbols)

    def draw() -> TextPair:
        if cfg.name == "addition":
            return _addition(rng, cfg)
        return _sequence(rng, cfg, symbols, reverse=cfg.name == "reverse")

    held_out: dict[str, str] = {}
    per_class: dict[tuple[int, ...], int] = {}
    attempts = 0
    while len(held_out) < 2 * cfg.valid_size:
        attempts += 1
        if attempts > 100 * cfg.valid_size + 10_000:
            raise UserError(
                f"task {cfg.name}: cannot draw 2 * valid_size = {2 * cfg.valid_size} distinct "
                f"held-out examples; lower valid_size or widen the task"
            )
        src, tgt = draw()
        cls = _class_of(cfg, src)
        cap = _held_out_cap(cfg, cls)
        if src in held_out or per_class.get(cls, 0) >= cap:
            continue
        held_out[src] = tgt
        per_class[cls] = per_class.get(cls, 0) + 1
    train: list[TextPair] = []
    while len(train) < cfg.train_size:
        src, tgt = draw()
        if src not in held_out:
            train.append((src, tgt))
    pairs = list(held_out.items())
    valid, test = pairs[: cfg.valid_size], pairs[cfg.valid_size :]
    if cfg.reverse_input:
        train, valid, test = ([(s[::-1], t) for s, t in split] for split in (train, valid, test))
    return SyntheticTask(vocab=vocab, train=train, valid=valid, test=test)
