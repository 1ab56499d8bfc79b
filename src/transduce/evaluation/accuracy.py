"""Accuracy of id sequences (the synthetic tasks). Both functions compare the lists as given:
strip BOS, EOS and padding before calling them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["sequence_accuracy", "token_accuracy"]


def _check(hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not refs:
        raise ValueError("no sequences to score")


def sequence_accuracy(hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]]) -> float:
    """Fraction of hypotheses exactly equal to their reference (same length, same ids).

    Raises ``ValueError`` when the counts differ or there are no sequences.
    """
    _check(hyps, refs)
    return sum(list(h) == list(r) for h, r in zip(hyps, refs)) / len(refs)


def token_accuracy(hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]]) -> float:
    """Position-wise accuracy over reference tokens.

    The count of positions ``i < len(ref)`` where ``hyp[i] == ref[i]`` (a hypothesis shorter than
    its reference misses the rest), summed over all pairs and divided by the total number of
    reference tokens. Tokens a hypothesis has beyond its reference length are ignored, so a longer
    hypothesis is never rewarded (but not penalized either: use ``sequence_accuracy`` for that).

    Raises ``ValueError`` when the counts differ, or there are no reference tokens.
    """
    _check(hyps, refs)
    total = sum(len(r) for r in refs)
    if total == 0:
        raise ValueError("the references have no tokens")
    correct = sum(sum(1 for a, b in zip(h, r) if a == b) for h, r in zip(hyps, refs))
    return correct / total
