"""Synthetic tasks generated in code, no download: copy, reverse and addition.

Addition writes integers as digit tokens: source ``"123+4589"``, target ``"4712"``. Operand
lengths are drawn uniformly from [min_digits, max_digits], then the value uniformly among numbers
of that many digits. The held-out splits (valid and test, ``valid_size`` each) never share a source with each other
or with the training split.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from transduce.config import TaskConfig
from transduce.data.vocab import CharVocab
from transduce.errors import UserError

TextPair = tuple[str, str]


@dataclass(frozen=True)
class SyntheticTask:
    vocab: CharVocab
    train: list[TextPair]
    valid: list[TextPair]  # model selection and early stopping
    test: list[TextPair]  # reported at the end; as large as valid, disjoint from both


def _number(rng: random.Random, cfg: TaskConfig) -> int:
    digits = rng.randint(cfg.min_digits, cfg.max_digits)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def _addition(rng: random.Random, cfg: TaskConfig) -> TextPair:
    a, b = _number(rng, cfg), _number(rng, cfg)
    return f"{a}+{b}", str(a + b)


def _sequence(rng: random.Random, cfg: TaskConfig, symbols: str, reverse: bool) -> TextPair:
    n = rng.randint(cfg.min_length, cfg.max_length)
    s = "".join(rng.choice(symbols) for _ in range(n))
    return s, s[::-1] if reverse else s


def _space_size(cfg: TaskConfig) -> int:
    """How many distinct examples the task can produce (an upper bound is enough)."""
    if cfg.name == "addition":
        per_operand = 10**cfg.max_digits - (10 ** (cfg.min_digits - 1) if cfg.min_digits > 1 else 0)
        return per_operand**2
    return sum(cfg.n_symbols**n for n in range(cfg.min_length, cfg.max_length + 1))


def make_task(cfg: TaskConfig) -> SyntheticTask:
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
    while len(held_out) < 2 * cfg.valid_size:
        src, tgt = draw()
        held_out[src] = tgt
    train = []
    while len(train) < cfg.train_size:
        src, tgt = draw()
        if src not in held_out:
            train.append((src, tgt))
    pairs = list(held_out.items())
    valid, test = pairs[: cfg.valid_size], pairs[cfg.valid_size :]
    if cfg.reverse_input:
        train, valid, test = ([(s[::-1], t) for s, t in split] for split in (train, valid, test))
    return SyntheticTask(vocab=vocab, train=train, valid=valid, test=test)
