"""Accuracy of id sequences (the synthetic tasks). The functions compare the lists as given:
strip BOS, EOS and padding before calling them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["position_accuracy", "sequence_accuracy", "token_accuracy"]


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


def position_accuracy(hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[int]]) -> list[float]:
    """Token accuracy at each answer position: where in the output do the errors fall?

    Returns one float per position ``p = 1 .. max(len(ref))`` (index ``p - 1`` of the list): the
    share, among the references that have a position ``p`` (``len(ref) >= p``), of those whose
    hypothesis has the same id there (``len(hyp) >= p`` and ``hyp[p - 1] == ref[p - 1]``). A
    hypothesis too short to have position ``p`` counts as wrong at ``p``; tokens a hypothesis has
    beyond its reference's length are ignored (as in ``token_accuracy``). Each position's share
    is over its own count of references, so the last positions of a set of mixed lengths rest on
    fewer sequences. The reference-length-weighted mean of the list is ``token_accuracy``.

    Raises ``ValueError`` when the counts differ, or there are no reference tokens.
    """
    _check(hyps, refs)
    longest = max(len(r) for r in refs)
    if longest == 0:
        raise ValueError("the references have no tokens")
    correct, present = [0] * longest, [0] * longest
    for h, r in zip(hyps, refs):
        for i, ref_id in enumerate(r):
            present[i] += 1
            correct[i] += i < len(h) and h[i] == ref_id
    return [c / n for c, n in zip(correct, present)]
